//! Arbitrary bytes as one WebSocket message: `Frame::decode` must never panic, must agree
//! with `Frame::check` about the header, and whatever it accepts must re-encode to bytes
//! that decode to an equal frame.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tether_proto::Frame;

fuzz_target!(|data: &[u8]| {
    let header = Frame::check(data);
    let Ok(frame) = Frame::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    assert!(header.is_ok(), "decode accepted a frame check refused");
    let again = Frame::decode(frame.encode()).expect("a re-encoded frame decodes");
    assert_eq!(again, frame);
});
