//! `PROTOCOL.md` says what the code does: its frames are the exact wire bytes, its JSON
//! examples decode, every field the code can send is documented where its message is, and its
//! limits table matches `limits.rs`. Change the code and the document together.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

mod samples;

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::Value;
use tether_proto::control::Control;
use tether_proto::limits;
use tether_proto::{Channel, Frame, StreamId, PROTOCOL_VERSION};

const DOC: &str = include_str!("../PROTOCOL.md");

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn unhex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex byte {h:?}")))
        .collect()
}

/// The golden vectors PROTOCOL.md shows, built from typed values.
#[test]
fn golden_frames_have_these_exact_bytes() {
    let data = Frame::Data {
        stream: StreamId(1),
        channel: Channel::Out,
        payload: Bytes::from_static(b"hello\n"),
    };
    assert_eq!(hex(&data.encode()), "11 00 00 00 01 01 68 65 6c 6c 6f 0a");

    let stdin = Frame::Data {
        stream: StreamId(1),
        channel: Channel::In,
        payload: Bytes::from_static(b"ls\n"),
    };
    assert_eq!(hex(&stdin.encode()), "11 00 00 00 01 00 6c 73 0a");

    let window = Frame::Window {
        stream: StreamId(1),
        credit: 65_536,
    };
    assert_eq!(hex(&window.encode()), "12 00 00 00 01 00 00 01 00 00");

    let window = Frame::Window {
        stream: StreamId(2),
        credit: 2 << 20,
    };
    assert_eq!(hex(&window.encode()), "12 00 00 00 02 00 00 20 00 00");

    let closed = Frame::Control(Control::Closed {
        stream: StreamId(1),
    });
    let bytes = closed.encode();
    assert_eq!(hex(&bytes[..6]), "13 00 00 00 00 00");
    assert_eq!(&bytes[6..], br#"{"type":"closed","stream":1}"#);

    let hello = Frame::Control(Control::Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        client: "tether-cli/0.1.0".into(),
    });
    let bytes = hello.encode();
    assert_eq!(bytes.len(), 63);
    assert_eq!(
        &bytes[6..],
        br#"{"type":"hello","protocol":1,"client":"tether-cli/0.1.0"}"#
    );
}

/// A fenced code block of the document: its info string and its text.
struct Block {
    lang: String,
    text: String,
    line: usize,
}

fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    for (i, line) in DOC.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match current.take() {
                Some(block) => out.push(block),
                None => {
                    current = Some(Block {
                        lang: info.trim().to_string(),
                        text: String::new(),
                        line: i + 1,
                    })
                }
            }
        } else if let Some(block) = current.as_mut() {
            block.text.push_str(trimmed);
            block.text.push('\n');
        }
    }
    assert!(current.is_none(), "unclosed code block");
    out
}

/// True when everything `example` says is in `encoded`: the example may leave out optional
/// fields, but may not name a field the encoder would not write (a typo would otherwise be
/// silently ignored by the decoder) or give one a different value.
fn is_subset(example: &Value, encoded: &Value) -> bool {
    match (example, encoded) {
        (Value::Object(a), Value::Object(b)) => a.iter().all(|(k, v)| match b.get(k) {
            Some(w) => is_subset(v, w),
            None => v.is_null(),
        }),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(v, w)| is_subset(v, w))
        }
        (a, b) => a == b,
    }
}

fn check_example(json: &Value, where_: &str) -> Control {
    let mut wire = vec![0x13, 0, 0, 0, 0, 0];
    wire.extend(serde_json::to_vec(json).unwrap());
    let control = match Frame::decode(Bytes::from(wire)) {
        Ok(Frame::Control(c)) => c,
        other => panic!("{where_}: {json} does not decode: {other:?}"),
    };
    let encoded = serde_json::to_value(&control).unwrap();
    assert!(
        is_subset(json, &encoded),
        "{where_}: {json} has fields or values the encoder would not write: {encoded}"
    );
    control
}

#[test]
fn every_json_example_is_a_valid_message() {
    let mut checked = 0;
    let mut types = BTreeSet::new();
    for block in blocks() {
        let where_ = format!("PROTOCOL.md block at line {}", block.line);
        if block.lang == "json" {
            for value in serde_json::Deserializer::from_str(&block.text).into_iter::<Value>() {
                let value = value.unwrap_or_else(|e| panic!("{where_}: {e}"));
                types.insert(samples::control_name(&check_example(&value, &where_)));
                checked += 1;
            }
        } else {
            // Transcripts in other blocks: a line's JSON runs from `{"type":` to its end.
            for line in block.text.lines() {
                if let Some(at) = line.find(r#"{"type":"#) {
                    let value: Value = serde_json::from_str(&line[at..])
                        .unwrap_or_else(|e| panic!("{where_}: {line}: {e}"));
                    types.insert(samples::control_name(&check_example(&value, &where_)));
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} examples found");
    // Every message type has at least one example.
    let all: BTreeSet<_> = samples::controls()
        .iter()
        .map(samples::control_name)
        .collect();
    assert_eq!(types, all, "some message type has no example");
}

#[test]
fn every_hex_example_is_an_exact_frame() {
    let mut checked = 0;
    for block in blocks().into_iter().filter(|b| b.lang == "hex") {
        let bytes = unhex(&block.text);
        let frame = Frame::decode(Bytes::from(bytes.clone()))
            .unwrap_or_else(|e| panic!("hex block at line {}: {e}", block.line));
        assert_eq!(frame.encode().as_ref(), &bytes[..], "line {}", block.line);
        checked += 1;
    }
    assert!(checked >= 5);
}

fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.bytes().take_while(|&b| b == b'#').count();
    let text = line[level..].strip_prefix(' ')?;
    (level > 0).then_some((level, text))
}

/// The document's lines outside code blocks, so a `#` in an example is not a heading.
fn prose() -> Vec<&'static str> {
    let mut in_code = false;
    DOC.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            !in_code
        })
        .collect()
}

/// The text under the heading that starts with `` `name` `` inside the `## ` section whose
/// title contains `chapter`, up to the next heading of the same or a higher level.
fn section(chapter: &str, name: &str) -> String {
    let lines = prose();
    let start = lines
        .iter()
        .position(|l| l.starts_with("## ") && l.contains(chapter))
        .unwrap_or_else(|| panic!("no chapter {chapter:?}"));
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |i| start + 1 + i);
    let chapter_lines = &lines[start + 1..end];
    let tag = format!("`{name}`");
    let at = chapter_lines
        .iter()
        .position(|l| heading(l).is_some_and(|(lvl, t)| lvl >= 3 && t.starts_with(&tag)))
        .unwrap_or_else(|| panic!("no heading {tag} in chapter {chapter:?}"));
    let level = heading(chapter_lines[at]).unwrap().0;
    chapter_lines[at + 1..]
        .iter()
        .take_while(|l| heading(l).is_none_or(|(lvl, _)| lvl > level))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_names(text: &str, keys: impl IntoIterator<Item = String>, what: &str) {
    for key in keys {
        assert!(
            text.contains(&format!("`{key}`")),
            "PROTOCOL.md does not describe field `{key}` of {what}"
        );
    }
}

/// Field names inside nested objects (not maps of user data, such as `env`).
fn nested_keys(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone());
                if k != "env" {
                    nested_keys(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| nested_keys(v, out)),
        _ => {}
    }
}

#[test]
fn every_field_is_documented_in_its_section() {
    for c in samples::controls() {
        let name = samples::control_name(&c);
        let Value::Object(fields) = serde_json::to_value(&c).unwrap() else {
            unreachable!()
        };
        let own: &[&str] = match &c {
            Control::Open { op, .. } => {
                let op_name = samples::op_name(op);
                let text = section("Operations", op_name);
                let keys = fields
                    .keys()
                    .filter(|k| !["type", "stream", "window", "op"].contains(&k.as_str()));
                assert_names(&text, keys.cloned(), &format!("op {op_name}"));
                &["type", "stream", "window", "op"]
            }
            Control::Reply { reply, .. } => {
                let reply_name = samples::reply_name(reply);
                let text = section("Replies", reply_name);
                let keys = fields
                    .keys()
                    .filter(|k| !["type", "stream", "reply"].contains(&k.as_str()));
                assert_names(&text, keys.cloned(), &format!("reply {reply_name}"));
                &["type", "stream", "reply"]
            }
            Control::Event { .. } => {
                let text = section("Operations", "watch");
                let keys = fields
                    .keys()
                    .filter(|k| !["type", "stream", "kind"].contains(&k.as_str()));
                assert_names(&text, keys.cloned(), "watch events");
                &["type", "stream", "kind"]
            }
            _ => &[],
        };
        let text = section("Control messages", name);
        let keys = fields
            .keys()
            .filter(|k| *k != "type" && (own.is_empty() || own.contains(&k.as_str())));
        assert_names(&text, keys.cloned(), &format!("message {name}"));

        let mut nested = BTreeSet::new();
        for (k, v) in &fields {
            if k != "env" {
                nested_keys(v, &mut nested);
            }
        }
        for key in nested {
            assert!(
                DOC.contains(&format!("`{key}`")) || DOC.contains(&format!("\"{key}\"")),
                "PROTOCOL.md never names the nested field {key:?} of {name}"
            );
        }
    }
}

#[test]
fn every_error_code_and_event_kind_is_documented() {
    let errors = section_by_title("Errors");
    for code in samples::codes() {
        assert!(
            errors.contains(&format!("| `{code}` |")),
            "error code {code} is not in the table of section Errors"
        );
    }
    let watch = section("Operations", "watch");
    for event in samples::events() {
        let kind = samples::event_name(&event);
        assert!(
            watch.contains(&format!("| `{kind}` |")),
            "event kind {kind}"
        );
    }
}

fn section_by_title(chapter: &str) -> String {
    let start = DOC
        .find(&format!(". {chapter}\n"))
        .unwrap_or_else(|| panic!("no chapter {chapter}"));
    let rest = &DOC[start..];
    rest[..rest[1..].find("\n## ").map_or(rest.len(), |i| i + 1)].to_string()
}

#[test]
fn limits_table_matches_the_code() {
    let rows = [
        ("FRAME_VERSION", limits::FRAME_VERSION as u64),
        ("HEADER_LEN", limits::HEADER_LEN as u64),
        ("MAX_PAYLOAD", limits::MAX_PAYLOAD as u64),
        ("DATA_CHUNK", limits::DATA_CHUNK as u64),
        ("BULK_CHUNK", limits::BULK_CHUNK as u64),
        ("INITIAL_WINDOW", limits::INITIAL_WINDOW as u64),
        ("MAX_WINDOW", limits::MAX_WINDOW as u64),
        ("DEFAULT_RING", limits::DEFAULT_RING as u64),
        ("PING_INTERVAL_SECS", limits::PING_INTERVAL_SECS),
        ("EXIT_RETENTION_SECS", limits::EXIT_RETENTION_SECS),
    ];
    let table = section_by_title("Limits");
    for (name, value) in rows {
        let row = format!("| `{name}` | {value} |");
        assert!(
            table.contains(&row),
            "PROTOCOL.md's limits table lacks {row}"
        );
    }
    assert_eq!(PROTOCOL_VERSION, 1, "PROTOCOL.md describes version 1");
}
