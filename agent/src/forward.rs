//! Port forwarding: carry a TCP connection to a port inside the sandbox as a stream, and list
//! the ports that are listening.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tether_proto::limits::DATA_CHUNK;
use tether_proto::op::{ListeningPort, Reply};
use tether_proto::{Channel, ErrorCode};

use crate::stream::{Inbound, OpError, OpResult, StreamCtx};

/// `connect`: dials `host:port` and pumps bytes both ways until both directions are done.
pub(crate) async fn connect(ctx: StreamCtx, host: Option<String>, port: u16) -> OpResult {
    let host = host.unwrap_or_else(|| "127.0.0.1".to_string());
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => OpError::new(
                ErrorCode::NotFound,
                format!("nothing is listening on {host}:{port} inside the sandbox"),
            ),
            _ => OpError::io(&format!("connect to {host}:{port}"), &e),
        })?;
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr) = tcp.into_split();
    let (out, mut input) = ctx.split();

    let downstream = async {
        let mut buf = BytesMut::with_capacity(DATA_CHUNK);
        loop {
            let credit = out.reserve(DATA_CHUNK).await;
            buf.clear();
            buf.resize(credit, 0);
            let n = match rd.read(&mut buf[..credit]).await {
                Ok(n) => n,
                Err(e) => {
                    out.refund(credit);
                    return Err(OpError::io("read from forwarded connection", &e));
                }
            };
            out.refund(credit - n);
            if n == 0 {
                return out.eof(Channel::Out).await;
            }
            out.data_reserved(Channel::Out, &buf[..n]).await?;
        }
    };

    // Owns the input half and hands it back after the client's eof, so cancel is still
    // heard while the server's side drains.
    let upstream = async move {
        loop {
            match input.recv().await {
                Some(Inbound::Data(bytes)) => {
                    wr.write_all(&bytes)
                        .await
                        .map_err(|e| OpError::io("write to forwarded connection", &e))?;
                    input.consumed(bytes.len()).await;
                }
                Some(Inbound::Eof) => {
                    let _ = wr.shutdown().await;
                    return Ok(Some(input));
                }
                Some(Inbound::Cancel) | None => return Ok(None),
                Some(_) => {}
            }
        }
    };

    tokio::pin!(downstream, upstream);
    let mut down_done = false;
    let mut drained: Option<crate::stream::StreamIn> = None;
    let mut up_done = false;
    while !(down_done && up_done) {
        tokio::select! {
            r = &mut downstream, if !down_done => {
                r?;
                down_done = true;
            }
            r = &mut upstream, if !up_done => {
                match r? {
                    Some(input) => drained = Some(input),
                    None => return Ok(()), // cancelled
                }
                up_done = true;
            }
            m = async { drained.as_mut().expect("guarded").recv().await }, if drained.is_some() => {
                if matches!(m, Some(Inbound::Cancel) | None) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// `ports`: the TCP ports in LISTEN state, from /proc/net/tcp and tcp6.
pub(crate) async fn ports(ctx: StreamCtx) -> OpResult {
    let mut ports = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = tokio::fs::read_to_string(file).await else {
            continue;
        };
        ports.extend(text.lines().skip(1).filter_map(|l| parse_listen(l, v6)));
    }
    ports.sort_by(|a, b| (a.port, &a.address).cmp(&(b.port, &b.address)));
    ports.dedup();
    ctx.out.reply(Reply::Ports { ports }).await
}

/// Parses one line of /proc/net/tcp{,6}; `Some` for sockets in LISTEN state (0A).
fn parse_listen(line: &str, v6: bool) -> Option<ListeningPort> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let (addr, port) = fields.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let address = if v6 {
        let bytes: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(addr.get(i * 2..i * 2 + 2).unwrap_or("00"), 16))
            .collect::<Result<_, _>>()
            .ok()?;
        // The kernel prints each 32-bit word in host (little-endian) order.
        let mut octets = [0u8; 16];
        for w in 0..4 {
            for b in 0..4 {
                octets[w * 4 + b] = bytes[w * 4 + 3 - b];
            }
        }
        std::net::Ipv6Addr::from(octets).to_string()
    } else {
        let n = u32::from_str_radix(addr, 16).ok()?;
        std::net::Ipv4Addr::from(n.swap_bytes()).to_string()
    };
    Some(ListeningPort { port, address })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_tcp() {
        let l = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        assert_eq!(
            parse_listen(l, false),
            Some(ListeningPort {
                port: 8080,
                address: "127.0.0.1".into()
            })
        );
        let l6 = "   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 0";
        assert_eq!(parse_listen(l6, true).unwrap().address, "::1");
        let est = "   1: 0100007F:1F90 0100007F:A000 01 0";
        assert_eq!(parse_listen(est, false), None);
    }
}
