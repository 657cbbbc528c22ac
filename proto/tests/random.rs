//! Property test: `Frame::decode` never panics on any input, and whatever it accepts
//! re-encodes to a frame that decodes equal. The inputs come from a seeded PRNG, so a
//! failure reproduces; the `fuzz/` crate explores the same property with coverage guidance.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

mod samples;

use bytes::Bytes;
use tether_proto::{Frame, ProtoError};

/// SplitMix64: tiny, seedable, good enough to spread inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }
}

/// Checks the property for one input and reports whether it decoded.
fn check(input: Vec<u8>) -> bool {
    let header = Frame::check(&input);
    match Frame::decode(Bytes::from(input)) {
        Ok(frame) => {
            assert!(header.is_ok(), "decode accepted what check refused");
            let again = Frame::decode(frame.encode());
            assert_eq!(again.as_ref(), Ok(&frame), "re-encoding changed {frame:?}");
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

/// A header that passes phase one most of the time, so payload parsing gets exercised.
fn plausible_header(rng: &mut Rng) -> Vec<u8> {
    let version = if rng.below(8) == 0 {
        rng.byte() >> 4
    } else {
        1
    };
    let kind = if rng.below(8) == 0 {
        rng.byte() & 0x0f
    } else {
        1 + rng.below(3) as u8
    };
    let stream = match rng.below(4) {
        0 => 0,
        1 => u32::MAX,
        _ => rng.below(16) as u32,
    };
    let channel = if rng.below(8) == 0 {
        rng.byte()
    } else {
        rng.below(3) as u8
    };
    let mut v = vec![(version << 4) | kind];
    v.extend_from_slice(&stream.to_be_bytes());
    v.push(channel);
    v
}

/// Pieces of JSON that make random control payloads reach deep into the decoder.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"type\"",
    "\"open\"",
    "\"op\"",
    "\"exec\"",
    "\"stream\"",
    "\"reply\"",
    "\"kind\"",
    "\"command\"",
    "\"argv\"",
    "\"hello\"",
    "\"protocol\"",
    "1",
    "0",
    "-1",
    "1e3",
    "4294967296",
    "null",
    "true",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    " ",
    "\"window\"",
    "\"path\"",
    "\"status\"",
    "\"code\"",
    "\"not_found\"",
];

fn mutate(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.byte();
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            2 => {
                let len = rng.below(v.len() + 1);
                v.truncate(len);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let j = i + rng.below(v.len() - i + 1);
                v.drain(i..j);
            }
            4 => {
                let i = rng.below(v.len() + 1);
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(i..i, token.iter().copied());
            }
            _ => {
                let i = rng.below(v.len() + 1);
                let len = rng.below(8);
                let junk = rng.bytes(len);
                v.splice(i..i, junk);
            }
        }
    }
    v
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x7e7e_0001);
    for _ in 0..50_000 {
        let len = rng.below(48);
        check(rng.bytes(len));
    }
}

#[test]
fn random_payloads_behind_plausible_headers() {
    let mut rng = Rng(0x7e7e_0002);
    let mut decoded = 0;
    for _ in 0..50_000 {
        let mut v = plausible_header(&mut rng);
        if rng.below(2) == 0 {
            let len = rng.below(16);
            v.extend(rng.bytes(len));
        } else {
            for _ in 0..rng.below(12) {
                v.extend_from_slice(TOKENS[rng.below(TOKENS.len())].as_bytes());
            }
        }
        decoded += check(v) as usize;
    }
    // Data and window frames decode often; the property is not checked vacuously.
    assert!(decoded > 5_000, "only {decoded} inputs decoded");
}

#[test]
fn mutated_valid_frames() {
    let seeds: Vec<Vec<u8>> = samples::controls()
        .into_iter()
        .map(|c| Frame::Control(c).encode().to_vec())
        .collect();
    let mut rng = Rng(0x7e7e_0003);
    let (mut decoded, mut rejected) = (0, 0);
    for _ in 0..100_000 {
        let seed = seeds[rng.below(seeds.len())].clone();
        if check(mutate(&mut rng, seed)) {
            decoded += 1;
        } else {
            rejected += 1;
        }
    }
    // Both outcomes happen, so both paths were exercised.
    assert!(
        decoded > 1_000 && rejected > 1_000,
        "{decoded} decoded, {rejected} rejected"
    );
}

#[test]
fn every_decode_error_kind_is_reachable_from_random_input() {
    let mut rng = Rng(0x7e7e_0004);
    let mut seen = [false; 8];
    for _ in 0..50_000 {
        let mut v = plausible_header(&mut rng);
        let len = rng.below(6);
        v.extend(rng.bytes(len));
        let len = rng.below(v.len() + 4);
        v.truncate(len);
        let index = match Frame::decode(Bytes::from(v)) {
            Ok(_) => continue,
            Err(ProtoError::Truncated(_)) => 0,
            Err(ProtoError::TooLarge(_)) => 1,
            Err(ProtoError::WrongVersion(_)) => 2,
            Err(ProtoError::UnknownKind(_)) => 3,
            Err(ProtoError::UnknownChannel(_)) => 4,
            Err(ProtoError::BadWindow(_)) => 5,
            Err(ProtoError::ZeroStream) => 6,
            Err(ProtoError::BadControl(_)) => 7,
        };
        seen[index] = true;
    }
    // Everything but TooLarge (which needs a megabyte) shows up.
    seen[1] = true;
    assert_eq!(seen, [true; 8]);
}
