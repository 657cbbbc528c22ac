mod samples;
use bytes::Bytes;
use tether_proto::control::Control;
use tether_proto::*;
fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}
#[test]
fn print() {
    let d = Frame::Data {
        stream: StreamId(1),
        channel: Channel::Out,
        payload: Bytes::from_static(b"hello\n"),
    };
    println!("DATA {}", hex(&d.encode()));
    let d = Frame::Data {
        stream: StreamId(1),
        channel: Channel::In,
        payload: Bytes::from_static(b"ls\n"),
    };
    println!("DATAIN {}", hex(&d.encode()));
    let w = Frame::Window {
        stream: StreamId(1),
        credit: 65536,
    };
    println!("WINDOW {}", hex(&w.encode()));
    let c = Frame::Control(Control::Closed {
        stream: StreamId(1),
    });
    println!("CLOSED {}", hex(&c.encode()));
    let c = Frame::Control(Control::Hello {
        protocol: 1,
        token: None,
        client: "tether-cli/0.1.0".into(),
    });
    println!("HELLO {}", hex(&c.encode()));
    for c in samples::controls() {
        println!("JSON {}", serde_json::to_string(&c).unwrap());
    }
}
