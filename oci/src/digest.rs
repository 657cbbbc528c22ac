//! Content addresses: the `sha256:<hex>` digests that name every blob of an OCI image, and a
//! writer that computes one while the bytes pass through it.

use std::fmt;
use std::io::{self, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// The only algorithm we write or accept.
const PREFIX: &str = "sha256:";
/// Hex digits in a SHA-256 digest.
const HEX_LEN: usize = 64;

/// A validated `sha256:` digest in lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex digits>`.
    pub fn parse(s: &str) -> Result<Digest, String> {
        let Some(hex) = s.strip_prefix(PREFIX) else {
            return Err(format!(
                "digest {s:?} is not sha256 (the only algorithm supported)"
            ));
        };
        let valid =
            hex.len() == HEX_LEN && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !valid {
            return Err(format!("digest {s:?} is not 64 lowercase hex digits"));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(hasher: Sha256) -> Digest {
        Digest(format!("{PREFIX}{}", hex::encode(hasher.finalize())))
    }

    /// The hex part, which names the blob's file in a layout.
    pub fn hex(&self) -> &str {
        &self.0[PREFIX.len()..]
    }

    /// The digest as written in JSON and URLs.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for people.
    pub fn short(&self) -> &str {
        &self.hex()[..12]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A writer that hashes and counts what it passes on to `inner`.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// The inner writer, the digest and the length of everything written.
    pub(crate) fn finish(self) -> (W, Digest, u64) {
        (self.inner, Digest::from_hasher(self.hasher), self.len)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The digest and length of everything `reader` yields.
pub(crate) fn digest_reader(mut reader: impl io::Read) -> io::Result<(Digest, u64)> {
    let mut writer = HashingWriter::new(io::sink());
    io::copy(&mut reader, &mut writer)?;
    let (_, digest, len) = writer.finish();
    Ok((digest, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_lowercase_hex() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::of(b"").as_str(), empty);
        assert_eq!(Digest::parse(empty).unwrap().short(), "e3b0c44298fc");
        assert!(Digest::parse(&empty.to_uppercase()).is_err());
        assert!(Digest::parse("sha512:abcd").unwrap_err().contains("sha256"));
        assert!(Digest::parse("sha256:abcd").is_err());
    }

    #[test]
    fn the_writer_hashes_what_passes() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello").unwrap();
        let (inner, digest, len) = w.finish();
        assert_eq!(inner, b"hello");
        assert_eq!(len, 5);
        assert_eq!(digest, Digest::of(b"hello"));
        assert_eq!(digest_reader(&b"hello"[..]).unwrap(), (digest, 5));
    }
}
