//! Every message survives encode → decode unchanged, and the samples cover every variant.
//!
//! Coverage is checked twice: at compile time by the exhaustive `*_name` matches in
//! `samples/mod.rs`, and here against the variant list serde itself reports, so a new variant
//! without a sample fails `every_*_variant_has_a_sample`.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

mod samples;

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::Value;
use tether_proto::control::Control;
use tether_proto::frame::{encode_control, encode_data, encode_window, finish_data_in_place};
use tether_proto::limits::{HEADER_LEN, MAX_PAYLOAD};
use tether_proto::op::{Op, Reply, WatchEvent};
use tether_proto::{Channel, ErrorCode, Frame, StreamId};

fn round_trip(frame: Frame) {
    let bytes = frame.encode();
    let back = Frame::decode(bytes.clone()).unwrap_or_else(|e| panic!("{frame:?}: {e}"));
    assert_eq!(back, frame);
    // Encoding is deterministic, so the bytes round-trip too.
    assert_eq!(back.encode(), bytes);
}

fn json(c: &Control) -> Value {
    serde_json::to_value(c).unwrap()
}

fn names(iter: impl IntoIterator<Item = &'static str>) -> BTreeSet<String> {
    iter.into_iter().map(str::to_string).collect()
}

#[test]
fn every_control_round_trips() {
    for c in samples::controls() {
        round_trip(Frame::Control(c));
    }
}

#[test]
fn every_control_variant_has_a_sample() {
    let controls = samples::controls();
    let sampled = names(controls.iter().map(samples::control_name));
    let known: BTreeSet<_> = samples::serde_variants::<Control>(r#"{"type":"no_such_type"}"#)
        .into_iter()
        .collect();
    assert_eq!(sampled, known);
    for c in &controls {
        assert_eq!(json(c)["type"], samples::control_name(c), "{c:?}");
    }
}

#[test]
fn every_op_variant_has_a_sample() {
    let ops = samples::ops();
    let sampled = names(ops.iter().map(samples::op_name));
    let known: BTreeSet<_> =
        samples::serde_variants::<Control>(r#"{"type":"open","stream":1,"op":"no_such_op"}"#)
            .into_iter()
            .collect();
    assert_eq!(sampled, known);
    for op in ops {
        let name = samples::op_name(&op);
        let open = Control::Open {
            stream: StreamId(1),
            window: None,
            op,
        };
        assert_eq!(json(&open)["op"], name);
    }
}

#[test]
fn every_reply_variant_has_a_sample() {
    let replies = samples::replies();
    let sampled = names(replies.iter().map(samples::reply_name));
    let known: BTreeSet<_> = samples::serde_variants::<Control>(
        r#"{"type":"reply","stream":1,"reply":"no_such_reply"}"#,
    )
    .into_iter()
    .collect();
    assert_eq!(sampled, known);
    for reply in replies {
        let name = samples::reply_name(&reply);
        let c = Control::Reply {
            stream: StreamId(1),
            reply,
        };
        assert_eq!(json(&c)["reply"], name);
    }
}

#[test]
fn every_watch_event_has_a_sample() {
    let events = samples::events();
    let sampled = names(events.iter().map(samples::event_name));
    let known: BTreeSet<_> =
        samples::serde_variants::<Control>(r#"{"type":"event","stream":1,"kind":"no_such_event"}"#)
            .into_iter()
            .collect();
    assert_eq!(sampled, known);
    for event in events {
        let name = samples::event_name(&event);
        let c = Control::Event {
            stream: StreamId(1),
            event,
        };
        assert_eq!(json(&c)["kind"], name);
    }
}

#[test]
fn every_error_code_has_a_sample_and_one_name() {
    let codes = samples::codes();
    let sampled = names(codes.iter().map(|c| samples::code_name(*c)));
    let known: BTreeSet<_> = samples::serde_variants::<ErrorCode>(r#""no_such_code""#)
        .into_iter()
        .collect();
    assert_eq!(sampled, known);
    for code in codes {
        let name = samples::code_name(code);
        assert_eq!(code.as_str(), name);
        assert_eq!(code.to_string(), name);
        assert_eq!(serde_json::to_value(code).unwrap(), name);
        let c = Control::Error {
            stream: None,
            code,
            message: String::new(),
        };
        assert_eq!(json(&c)["code"], name);
    }
}

#[test]
fn nested_enums_are_all_sampled() {
    let sampled: BTreeSet<_> = samples::controls()
        .iter()
        .flat_map(samples::nested_names)
        .collect();
    let expected = [
        "command:argv",
        "command:shell",
        "if_exists:overwrite",
        "if_exists:fail",
        "if_exists:append",
        "kind:file",
        "kind:dir",
        "kind:symlink",
        "kind:other",
        "channel:in",
        "channel:out",
        "channel:err",
    ];
    assert_eq!(sampled, expected.into_iter().collect());
}

#[test]
fn data_frames_round_trip() {
    for channel in [Channel::In, Channel::Out, Channel::Err] {
        for payload in [&b"x"[..], b"hello\n", &[0u8, 0xff, 0x80, 0x0a]] {
            round_trip(Frame::Data {
                stream: StreamId(1),
                channel,
                payload: Bytes::copy_from_slice(payload),
            });
        }
    }
    // The extremes: the largest stream id and the largest payload.
    round_trip(Frame::Data {
        stream: StreamId(u32::MAX),
        channel: Channel::Out,
        payload: Bytes::from(vec![0xab; MAX_PAYLOAD]),
    });
}

#[test]
fn window_frames_round_trip() {
    for credit in [1, 65_536, 4 << 20, u32::MAX] {
        for stream in [1, 2, u32::MAX] {
            round_trip(Frame::Window {
                stream: StreamId(stream),
                credit,
            });
        }
    }
}

#[test]
fn free_encoders_match_frame_encode() {
    let data = Frame::Data {
        stream: StreamId(3),
        channel: Channel::Err,
        payload: Bytes::from_static(b"oops"),
    };
    assert_eq!(
        encode_data(StreamId(3), Channel::Err, b"oops"),
        data.encode()
    );

    let window = Frame::Window {
        stream: StreamId(3),
        credit: 99,
    };
    assert_eq!(encode_window(StreamId(3), 99), window.encode());

    let closed = Control::Closed {
        stream: StreamId(3),
    };
    assert_eq!(encode_control(&closed), Frame::Control(closed).encode());
}

#[test]
fn data_encoded_in_place_matches() {
    // A sender reserves the header, reads the payload after it, then stamps the header.
    let mut buf = bytes::BytesMut::zeroed(HEADER_LEN);
    buf.extend_from_slice(b"read straight from the pipe");
    let frame = finish_data_in_place(buf, StreamId(5), Channel::Out);
    assert_eq!(
        frame,
        encode_data(StreamId(5), Channel::Out, b"read straight from the pipe")
    );
}

#[test]
fn decoded_data_shares_the_receive_buffer() {
    let wire = encode_data(StreamId(1), Channel::Out, b"zero copy");
    let Frame::Data { payload, .. } = Frame::decode(wire.clone()).unwrap() else {
        panic!("not a data frame");
    };
    assert_eq!(payload.as_ptr(), wire[HEADER_LEN..].as_ptr());
}

/// Receivers ignore fields they do not know, so fields can be added within a version.
#[test]
fn unknown_fields_are_ignored() {
    let cases = [
        r#"{"type":"hello","protocol":1,"client":"c","compression":"zstd"}"#,
        r#"{"type":"open","stream":1,"op":"exec","command":{"argv":["ls"]},"nice":10}"#,
        r#"{"type":"open","stream":1,"op":"ports","future":{"a":[1,2]}}"#,
        r#"{"type":"reply","stream":1,"reply":"written","bytes":3,"fsync_ms":2}"#,
        r#"{"type":"event","stream":1,"kind":"modify","path":"a","size":3}"#,
        r#"{"type":"exit","stream":1,"status":{"code":0,"rusage":{}}}"#,
        r#"{"type":"closed","stream":1,"reason":"done"}"#,
    ];
    for json in cases {
        let frame = control_frame(json);
        assert!(
            matches!(Frame::decode(frame), Ok(Frame::Control(_))),
            "{json}"
        );
    }
}

/// The smallest messages a client may write: every optional field left out.
#[test]
fn optional_fields_take_their_defaults() {
    let decode = |json: &str| match Frame::decode(control_frame(json)) {
        Ok(Frame::Control(c)) => c,
        other => panic!("{json}: {other:?}"),
    };

    assert_eq!(
        decode(r#"{"type":"hello","protocol":1}"#),
        Control::Hello {
            protocol: 1,
            token: None,
            client: String::new()
        }
    );
    assert_eq!(
        decode(r#"{"type":"open","stream":1,"op":"exec","command":{"argv":["ls"]}}"#),
        Control::Open {
            stream: StreamId(1),
            window: None,
            op: Op::Exec(Box::new(tether_proto::op::ExecSpec::argv(["ls"]))),
        }
    );
    assert_eq!(
        decode(r#"{"type":"open","stream":1,"op":"list","path":"."}"#),
        Control::Open {
            stream: StreamId(1),
            window: None,
            op: Op::List {
                path: ".".into(),
                depth: 1
            },
        }
    );
    assert_eq!(
        decode(r#"{"type":"open","stream":1,"op":"watch","path":"."}"#),
        Control::Open {
            stream: StreamId(1),
            window: None,
            op: Op::Watch {
                path: ".".into(),
                recursive: true
            },
        }
    );
    assert_eq!(
        decode(r#"{"type":"open","stream":1,"op":"write","path":"f"}"#),
        Control::Open {
            stream: StreamId(1),
            window: None,
            op: Op::Write(tether_proto::op::WriteSpec {
                path: "f".into(),
                mode: None,
                create_parents: false,
                if_exists: tether_proto::op::IfExists::Overwrite,
            }),
        }
    );
    assert_eq!(
        decode(r#"{"type":"signal","stream":1,"signal":"9"}"#),
        Control::Signal {
            stream: StreamId(1),
            signal: "9".into(),
            group: false
        }
    );
    assert_eq!(
        decode(r#"{"type":"error","code":"internal","message":"m"}"#),
        Control::Error {
            stream: None,
            code: ErrorCode::Internal,
            message: "m".into()
        }
    );
    assert_eq!(
        decode(r#"{"type":"exit","stream":1,"status":{}}"#),
        Control::Exit {
            stream: StreamId(1),
            status: Default::default()
        }
    );
    // `null` is the same as absent for optional fields.
    assert_eq!(
        decode(r#"{"type":"open","stream":1,"window":null,"op":"read","path":"f","len":null}"#),
        Control::Open {
            stream: StreamId(1),
            window: None,
            op: Op::Read {
                path: "f".into(),
                offset: 0,
                len: None
            },
        }
    );
}

/// Field order on the wire does not matter: the tags may come last.
#[test]
fn field_order_is_free() {
    let json = r#"{"path":"a","stream":4,"op":"stat","window":10,"type":"open"}"#;
    assert_eq!(
        Frame::decode(control_frame(json)).unwrap(),
        Frame::Control(Control::Open {
            stream: StreamId(4),
            window: Some(10),
            op: Op::Stat { path: "a".into() },
        })
    );
}

#[test]
fn reply_and_event_fields_are_flat() {
    // The reply's and the event's fields sit beside `type` and `stream`, not nested.
    let c = Control::Reply {
        stream: StreamId(2),
        reply: Reply::Written { bytes: 5 },
    };
    assert_eq!(
        serde_json::to_string(&c).unwrap(),
        r#"{"type":"reply","stream":2,"reply":"written","bytes":5}"#
    );
    let c = Control::Event {
        stream: StreamId(2),
        event: WatchEvent::Overflow,
    };
    assert_eq!(
        serde_json::to_string(&c).unwrap(),
        r#"{"type":"event","stream":2,"kind":"overflow"}"#
    );
}

fn control_frame(json: &str) -> Bytes {
    let mut v = vec![0x13, 0, 0, 0, 0, 0];
    v.extend_from_slice(json.as_bytes());
    Bytes::from(v)
}
