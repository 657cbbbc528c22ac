//! Every kind of malformed frame is rejected with the matching [`ProtoError`], never a panic.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use bytes::Bytes;
use tether_proto::limits::{HEADER_LEN, MAX_PAYLOAD};
use tether_proto::{Frame, ProtoError};

fn decode(bytes: &[u8]) -> Result<Frame, ProtoError> {
    let checked = Frame::check(bytes);
    let decoded = Frame::decode(Bytes::copy_from_slice(bytes));
    // Phase one never accepts what phase two rejects for header reasons, and vice versa.
    if let Err(e) = checked {
        assert_eq!(
            decoded.as_ref().err(),
            Some(&e),
            "check and decode disagree"
        );
    }
    decoded
}

fn frame(first: u8, stream: u32, channel: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![first];
    v.extend_from_slice(&stream.to_be_bytes());
    v.push(channel);
    v.extend_from_slice(payload);
    v
}

fn control(json: &[u8]) -> Vec<u8> {
    frame(0x13, 0, 0, json)
}

fn bad_control(json: &[u8]) -> String {
    match decode(&control(json)) {
        Err(ProtoError::BadControl(msg)) => msg,
        other => panic!("{:?} decoded to {other:?}", String::from_utf8_lossy(json)),
    }
}

#[test]
fn truncated_headers() {
    let full = frame(0x11, 1, 1, b"x");
    for len in 0..HEADER_LEN {
        assert_eq!(decode(&full[..len]), Err(ProtoError::Truncated(len)));
    }
}

#[test]
fn oversized_payload() {
    let ok = frame(0x11, 1, 1, &vec![0; MAX_PAYLOAD]);
    assert!(decode(&ok).is_ok());
    let big = frame(0x11, 1, 1, &vec![0; MAX_PAYLOAD + 1]);
    assert_eq!(decode(&big), Err(ProtoError::TooLarge(MAX_PAYLOAD + 1)));
    // The size is checked before anything else, so a huge control frame costs no parse.
    let big = frame(0x13, 0, 0, &vec![b' '; MAX_PAYLOAD + 1]);
    assert_eq!(decode(&big), Err(ProtoError::TooLarge(MAX_PAYLOAD + 1)));
}

#[test]
fn wrong_frame_version() {
    for version in [0u8, 2, 3, 15] {
        let bytes = frame((version << 4) | 1, 1, 1, b"x");
        assert_eq!(decode(&bytes), Err(ProtoError::WrongVersion(version)));
    }
}

#[test]
fn unknown_kind() {
    for kind in [0u8, 4, 5, 15] {
        let bytes = frame(0x10 | kind, 1, 1, b"x");
        assert_eq!(decode(&bytes), Err(ProtoError::UnknownKind(kind)));
    }
}

#[test]
fn unknown_channel() {
    for channel in [3u8, 4, 0x80, 0xff] {
        for first in [0x11, 0x12, 0x13] {
            let bytes = frame(first, 1, channel, b"\0\0\0\x01");
            assert_eq!(decode(&bytes), Err(ProtoError::UnknownChannel(channel)));
        }
    }
}

#[test]
fn window_of_wrong_length() {
    for len in [0usize, 1, 3, 5, 8] {
        let bytes = frame(0x12, 1, 0, &vec![1; len]);
        assert!(
            matches!(decode(&bytes), Err(ProtoError::BadWindow(_))),
            "window payload of {len} bytes"
        );
    }
}

#[test]
fn window_of_zero_credit() {
    let bytes = frame(0x12, 1, 0, &[0, 0, 0, 0]);
    assert!(matches!(decode(&bytes), Err(ProtoError::BadWindow(_))));
}

#[test]
fn data_and_window_on_stream_zero() {
    assert_eq!(
        decode(&frame(0x11, 0, 1, b"x")),
        Err(ProtoError::ZeroStream)
    );
    assert_eq!(
        decode(&frame(0x12, 0, 0, &[0, 0, 0, 1])),
        Err(ProtoError::ZeroStream)
    );
}

#[test]
fn empty_data() {
    assert!(matches!(
        decode(&frame(0x11, 1, 1, b"")),
        Err(ProtoError::BadControl(_))
    ));
}

#[test]
fn invalid_json() {
    for json in [
        &b""[..],
        b"{",
        b"{\"type\":\"closed\",\"stream\":1",
        b"{\"type\":\"closed\",\"stream\":1}}",
        b"{\"type\":\"closed\",\"stream\":1} {}",
        b"nul",
        b"[1,2]",
        b"\"closed\"",
        b"42",
        b"null",
        b"{'type':'closed'}",
    ] {
        bad_control(json);
    }
}

#[test]
fn deeply_nested_json_is_refused_not_a_stack_overflow() {
    let mut json = br#"{"type":"open","stream":1,"op":"ports","x":"#.to_vec();
    json.extend(vec![b'['; 100_000]);
    bad_control(&json);
    bad_control(&vec![b'['; 100_000]);
}

#[test]
fn unknown_types() {
    for json in [
        r#"{"type":"shutdown"}"#,
        r#"{"type":"Hello","protocol":1}"#,
        r#"{"type":"open","stream":1,"op":"format_disk"}"#,
        r#"{"type":"reply","stream":1,"reply":"maybe"}"#,
        r#"{"type":"event","stream":1,"kind":"explode","path":"a"}"#,
        r#"{"type":"error","code":"teapot","message":"m"}"#,
        r#"{"type":"eof","stream":1,"channel":"stdin"}"#,
        r#"{"type":"open","stream":1,"op":"exec","command":{"script":"ls"}}"#,
        r#"{"type":"open","stream":1,"op":"write","path":"f","if_exists":"merge"}"#,
    ] {
        bad_control(json.as_bytes());
    }
}

#[test]
fn missing_fields() {
    for json in [
        r#"{}"#,
        r#"{"stream":1}"#,
        r#"{"type":"hello"}"#,
        r#"{"type":"closed"}"#,
        r#"{"type":"open","op":"ports"}"#,
        r#"{"type":"open","stream":1}"#,
        r#"{"type":"open","stream":1,"op":"read"}"#,
        r#"{"type":"open","stream":1,"op":"exec"}"#,
        r#"{"type":"open","stream":1,"op":"chmod","path":"f"}"#,
        r#"{"type":"reply","stream":1}"#,
        r#"{"type":"reply","stream":1,"reply":"written"}"#,
        r#"{"type":"error","stream":1,"message":"m"}"#,
        r#"{"type":"started","stream":1,"process":1,"pid":2,"offsets":[0]}"#,
        r#"{"type":"event","stream":1,"kind":"rename","from":"a"}"#,
    ] {
        bad_control(json.as_bytes());
    }
}

#[test]
fn wrong_field_types_and_ranges() {
    for json in [
        r#"{"type":"closed","stream":-1}"#,
        r#"{"type":"closed","stream":4294967296}"#,
        r#"{"type":"closed","stream":1.5}"#,
        r#"{"type":"closed","stream":"1"}"#,
        r#"{"type":"resize","stream":1,"cols":70000,"rows":1}"#,
        r#"{"type":"open","stream":1,"window":-4,"op":"ports"}"#,
        r#"{"type":"open","stream":1,"op":"connect","port":65536}"#,
        r#"{"type":"open","stream":1,"op":"exec","command":{"argv":"ls -l"}}"#,
        r#"{"type":"open","stream":1,"op":"chmod","path":"f","mode":"0644"}"#,
        r#"{"type":"hello","protocol":1,"token":7}"#,
        r#"{"type":"exit","stream":1,"status":{"timed_out":"yes"}}"#,
        r#"{"type":"closed","stream":1,"stream":2}"#,
    ] {
        bad_control(json.as_bytes());
    }
}

#[test]
fn non_utf8_control_payload() {
    bad_control(b"{\"type\":\"hello\",\"protocol\":1,\"client\":\"\xff\xfe\"}");
    bad_control(b"\xff");
    // A lone surrogate escape is not a Unicode scalar value either.
    bad_control(br#"{"type":"hello","protocol":1,"client":"\ud800"}"#);
}

#[test]
fn header_fields_a_frame_kind_does_not_use_are_ignored() {
    // Control frames name stream 0 and window frames channel 0; a receiver ignores what a
    // sender put there (see PROTOCOL.md), so these still decode.
    let closed = br#"{"type":"closed","stream":1}"#;
    assert!(decode(&frame(0x13, 7, 2, closed)).is_ok());
    assert!(decode(&frame(0x12, 1, 1, &[0, 0, 0, 1])).is_ok());
}

#[test]
fn every_error_reads_as_a_sentence() {
    let errors = [
        decode(b"\x11"),
        decode(&frame(0x11, 1, 1, &vec![0; MAX_PAYLOAD + 1])),
        decode(&frame(0x21, 1, 1, b"x")),
        decode(&frame(0x1f, 1, 1, b"x")),
        decode(&frame(0x11, 1, 9, b"x")),
        decode(&frame(0x12, 1, 0, b"x")),
        decode(&frame(0x11, 0, 1, b"x")),
        decode(&control(b"{")),
    ];
    for e in errors {
        let msg = e.unwrap_err().to_string();
        assert!(msg.len() > 10 && !msg.contains("Error("), "{msg}");
    }
}
