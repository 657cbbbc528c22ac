//! What the first bytes of a connection from a sandbox say about where it is going: the server
//! name of a TLS ClientHello, or the request head of plain HTTP. Parsed from peeked bytes, so
//! whatever the proxy forwards is exactly what the client sent.

use super::constants::MAX_HEAD_BYTES;

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Opening {
    /// More bytes are needed to tell.
    Incomplete,
    /// A TLS ClientHello, with its server name if it sent one.
    Tls(Option<String>),
    /// A complete HTTP/1 request head.
    Http(Head),
    /// Neither TLS nor HTTP (or a head too large to be one).
    Other,
}

/// An HTTP/1 request head.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    /// Bytes the head takes, its final blank line included.
    pub(super) len: usize,
    /// The method, e.g. `GET` or `CONNECT`.
    pub(super) method: String,
    /// The request target as sent (origin form `/x`, absolute `http://h/x`, authority `h:443`).
    pub(super) target: String,
    /// The `Host` header, if any.
    pub(super) host: Option<String>,
    /// The headers in order, as sent.
    pub(super) headers: Vec<(String, Vec<u8>)>,
}

/// Classifies the bytes a client sent first.
pub(super) fn opening(bytes: &[u8]) -> Opening {
    match bytes.first() {
        None => Opening::Incomplete,
        // A TLS handshake record.
        Some(0x16) => match client_hello_sni(bytes) {
            Sni::Incomplete => Opening::Incomplete,
            Sni::Found(name) => Opening::Tls(name),
            Sni::Malformed => Opening::Other,
        },
        Some(b) if b.is_ascii_uppercase() => match head(bytes) {
            Ok(Some(head)) => Opening::Http(head),
            Ok(None) if bytes.len() < MAX_HEAD_BYTES => Opening::Incomplete,
            _ => Opening::Other,
        },
        Some(_) => Opening::Other,
    }
}

/// Parses an HTTP/1 request head: `Ok(None)` while incomplete.
pub(super) fn head(bytes: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(len) = req.parse(bytes)? else {
        return Ok(None);
    };
    let host = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .map(|h| h.trim().to_string());
    Ok(Some(Head {
        len,
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        host,
        headers: req
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect(),
    }))
}

/// The host of an authority `host[:port]` or `[v6]:port`, lowercase, and its port if given.
pub(super) fn split_authority(authority: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port.parse().ok()?)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some((host.trim_end_matches('.').to_ascii_lowercase(), port))
}

enum Sni {
    Incomplete,
    Found(Option<String>),
    Malformed,
}

/// The server name of the ClientHello at the start of `bytes` (one TLS record).
fn client_hello_sni(bytes: &[u8]) -> Sni {
    if bytes.len() < 5 {
        return Sni::Incomplete;
    }
    let record_len = u16::from_be_bytes([bytes[3], bytes[4]]) as usize;
    if bytes.len() < 5 + record_len {
        return Sni::Incomplete;
    }
    match parse_hello(&bytes[5..5 + record_len]) {
        Some(name) => Sni::Found(name),
        None => Sni::Malformed,
    }
}

/// A cursor over a byte slice whose reads fail past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize)
    }
}

/// `Some(None)`: a well-formed ClientHello without a server name.
fn parse_hello(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let n = r.u8()?;
    r.take(n)?; // session id
    let n = r.u16()?;
    r.take(n)?; // cipher suites
    let n = r.u8()?;
    r.take(n)?; // compression methods
    if r.0.is_empty() {
        return Some(None);
    }
    let n = r.u16()?;
    let mut exts = Reader(r.take(n)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let n = exts.u16()?;
        let body = exts.take(n)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(body);
        let n = list.u16()?;
        let mut names = Reader(list.take(n)?);
        while !names.0.is_empty() {
            let kind = names.u8()?;
            let n = names.u16()?;
            let name = names.take(n)?;
            if kind == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls sends it for `name`.
    fn hello(name: &str) -> Vec<u8> {
        let mut ext = Vec::new();
        let entry_len = 3 + name.len();
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name.as_bytes());
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn the_server_name_is_read_from_a_client_hello() {
        let bytes = hello("API.Allowed.Test");
        assert_eq!(
            opening(&bytes),
            Opening::Tls(Some("api.allowed.test".into()))
        );
        assert_eq!(opening(&bytes[..bytes.len() - 1]), Opening::Incomplete);
        let mut bad = bytes.clone();
        bad[5] = 2; // a ServerHello
        assert_eq!(opening(&bad), Opening::Other);
        // Lengths pointing past the record are malformed, never a panic.
        let mut lying = bytes;
        let n = lying.len();
        lying[n - 20] = 0xff;
        let _ = opening(&lying);
    }

    #[test]
    fn http_heads_and_authorities_parse() {
        let req = b"GET http://a.test:8080/x HTTP/1.1\r\nHost: a.test:8080\r\n\r\nbody";
        let Opening::Http(head) = opening(req) else {
            panic!("not http")
        };
        assert_eq!(head.len, req.len() - 4);
        assert_eq!(head.target, "http://a.test:8080/x");
        assert_eq!(head.host.as_deref(), Some("a.test:8080"));
        assert_eq!(opening(b"GET / HTTP/1.1\r\nHo"), Opening::Incomplete);
        assert_eq!(opening(b"\x00\x01binary"), Opening::Other);

        assert_eq!(
            split_authority("A.test:443"),
            Some(("a.test".into(), Some(443)))
        );
        assert_eq!(split_authority("a.test"), Some(("a.test".into(), None)));
        assert_eq!(split_authority("[::1]:80"), Some(("::1".into(), Some(80))));
        assert_eq!(split_authority("a.test:x"), None);
        assert_eq!(split_authority(":80"), None);
    }
}
