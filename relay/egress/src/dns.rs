//! The DNS server a sandbox with an allowlist sees (every query to port 53 is redirected to
//! it): allowed names get a fake address from the sandbox's pool (A) or an empty answer
//! (AAAA and other types), every other name NXDOMAIN. Nothing is ever forwarded, so a lookup
//! carries no data out of the sandbox.

use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::constants::{DNS_TCP_TIMEOUT, DNS_TTL_SECS, MAX_DNS_CONNECTIONS, MAX_DNS_UDP_BYTES};
use super::policy::Allowlist;
use super::pool::FakePool;

/// One sandbox's DNS server.
#[derive(Debug)]
pub(super) struct Dns {
    /// The sandbox, for the log.
    pub(super) id: String,
    /// What it may look up.
    pub(super) allowlist: Arc<Allowlist>,
    /// Its fake addresses.
    pub(super) pool: Arc<FakePool>,
}

impl Dns {
    /// The answer to the DNS message `query`, or `None` for what is not a DNS query at all.
    pub(super) fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let req = Message::from_vec(query).ok()?;
        if req.message_type() != MessageType::Query {
            return None;
        }
        let mut resp = Message::new();
        resp.set_id(req.id())
            .set_message_type(MessageType::Response)
            .set_op_code(req.op_code())
            .set_recursion_desired(req.recursion_desired())
            .set_recursion_available(true);
        let code = match (req.op_code(), req.queries()) {
            (OpCode::Query, [q]) => {
                resp.add_query(q.clone());
                let name = q
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                if q.query_class() != DNSClass::IN || !self.allowlist.allows_host(&name) {
                    tracing::info!(
                        sandbox = %self.id,
                        name = %name,
                        "egress refused: DNS lookup of a name not on the allowlist (NXDOMAIN)"
                    );
                    ResponseCode::NXDomain
                } else if q.query_type() == RecordType::A {
                    match self.pool.assign(&name) {
                        Ok(addr) => {
                            resp.add_answer(Record::from_rdata(
                                q.name().clone(),
                                DNS_TTL_SECS,
                                RData::A(A(addr)),
                            ));
                            ResponseCode::NoError
                        }
                        Err(full) => {
                            tracing::warn!(sandbox = %self.id, name = %name, "egress: {full}");
                            ResponseCode::ServFail
                        }
                    }
                } else {
                    // Fake addresses are IPv4 only: other types of an allowed name are empty.
                    ResponseCode::NoError
                }
            }
            (OpCode::Query, _) => ResponseCode::FormErr,
            _ => ResponseCode::NotImp,
        };
        resp.set_response_code(code);
        resp.to_vec().ok()
    }

    /// Answers queries on `socket` until `stop`.
    pub(super) async fn serve_udp(self: Arc<Self>, socket: UdpSocket, stop: CancellationToken) {
        let mut buf = vec![0u8; MAX_DNS_UDP_BYTES];
        loop {
            let (n, from) = tokio::select! {
                _ = stop.cancelled() => return,
                got = socket.recv_from(&mut buf) => match got {
                    Ok(got) => got,
                    Err(e) => {
                        tracing::debug!(sandbox = %self.id, "DNS socket: {e}");
                        continue;
                    }
                },
            };
            if let Some(reply) = self.answer(&buf[..n]) {
                let _ = socket.send_to(&reply, from).await;
            }
        }
    }

    /// Answers length-prefixed queries on connections to `listener` until `stop`.
    pub(super) async fn serve_tcp(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        let slots = Arc::new(Semaphore::new(MAX_DNS_CONNECTIONS));
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            };
            let conn = tokio::select! {
                _ = stop.cancelled() => return,
                c = listener.accept() => c,
            };
            let Ok((conn, _)) = conn else { continue };
            let (dns, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = dns.serve_tcp_conn(conn) => {}
                }
                drop(permit);
            });
        }
    }

    async fn serve_tcp_conn(&self, mut conn: TcpStream) {
        let mut buf = vec![0u8; u16::MAX as usize];
        loop {
            let read = async {
                let len = conn.read_u16().await? as usize;
                conn.read_exact(&mut buf[..len]).await?;
                std::io::Result::Ok(len)
            };
            let Ok(Ok(len)) = tokio::time::timeout(DNS_TCP_TIMEOUT, read).await else {
                return;
            };
            let Some(reply) = self.answer(&buf[..len]) else {
                return;
            };
            let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&reply);
            if conn.write_all(&framed).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use tether_relay_core::egress::policy::HostPattern;

    fn dns() -> (Dns, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let allowlist = Allowlist {
            hosts: vec![HostPattern::parse("api.allowed-parent.test").unwrap()],
            networks: vec![],
        };
        let pool = FakePool::open(&dir.path().join("names"));
        let dns = Dns {
            id: "sb-test".into(),
            allowlist: Arc::new(allowlist),
            pool: Arc::new(pool),
        };
        (dns, dir)
    }

    fn ask(dns: &Dns, name: &str, kind: RecordType) -> Message {
        let mut q = Message::new();
        q.set_id(77)
            .add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        Message::from_vec(&dns.answer(&q.to_vec().unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn allowed_names_get_fake_addresses_and_others_nxdomain() {
        let (dns, _dir) = dns();
        let a = ask(&dns, "API.allowed-parent.test.", RecordType::A);
        assert_eq!(a.id(), 77);
        assert_eq!(a.response_code(), ResponseCode::NoError);
        let Some(RData::A(addr)) = a.answers()[0].data().clone().into() else {
            panic!("no A record")
        };
        assert_eq!(
            dns.pool.name_of(addr.0).as_deref(),
            Some("api.allowed-parent.test")
        );
        let aaaa = ask(&dns, "api.allowed-parent.test.", RecordType::AAAA);
        assert_eq!(aaaa.response_code(), ResponseCode::NoError);
        assert!(aaaa.answers().is_empty());

        for name in [
            "secret-data.allowed-parent.test.",
            "example.com.",
            "allowed-parent.test.",
        ] {
            let no = ask(&dns, name, RecordType::A);
            assert_eq!(no.response_code(), ResponseCode::NXDomain, "{name}");
            assert!(no.answers().is_empty());
        }
        assert!(dns.answer(b"not dns").is_none());
    }
}
