//! Bytes on a JSON wire: [`WireBytes`], and [`WirePath`], its name where it holds a file name.
//!
//! A Unix file name, argument or environment variable is any bytes but NUL; JSON strings are
//! Unicode. Bytes that are valid UTF-8 travel as a plain JSON string, as they always have; bytes
//! that are not travel as `{"b64": "<standard base64 of the bytes>"}`, so no name or argument is
//! ever replaced or merged with another. Receivers accept both forms wherever such a field goes
//! (PROTOCOL.md, "Paths" and "Processes").

use std::borrow::Cow;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The key of the byte form: `{"b64": "..."}`.
const B64_KEY: &str = "b64";

/// A byte string as exactly its bytes: a path or file name as the filesystem holds it, an
/// argument or an environment variable as `execve` takes it.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireBytes(Vec<u8>);

/// A path or file name: [`WireBytes`] under the name the path fields use.
pub type WirePath = WireBytes;

impl WireBytes {
    /// The path's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The path's bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// The bytes as text, when they are valid UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The bytes as text with invalid bytes replaced by U+FFFD: for display only, never to
    /// name a file or pass an argument (two byte strings can decode alike).
    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }

    /// The path's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the path is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the path contains `byte`.
    pub fn contains(&self, byte: u8) -> bool {
        self.0.contains(&byte)
    }

    /// The path as an OS path (Unix: the same bytes).
    #[cfg(unix)]
    pub fn as_path(&self) -> &std::path::Path {
        std::path::Path::new(self.as_os_str())
    }

    /// The bytes as an OS string (Unix: the same bytes), for an argument or a variable.
    #[cfg(unix)]
    pub fn as_os_str(&self) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(&self.0)
    }
}

impl From<&str> for WireBytes {
    fn from(s: &str) -> WireBytes {
        WireBytes(s.as_bytes().to_vec())
    }
}

impl From<&WireBytes> for WireBytes {
    fn from(p: &WireBytes) -> WireBytes {
        p.clone()
    }
}

impl From<String> for WireBytes {
    fn from(s: String) -> WireBytes {
        WireBytes(s.into_bytes())
    }
}

impl From<&String> for WireBytes {
    fn from(s: &String) -> WireBytes {
        WireBytes(s.as_bytes().to_vec())
    }
}

impl From<Vec<u8>> for WireBytes {
    fn from(b: Vec<u8>) -> WireBytes {
        WireBytes(b)
    }
}

impl From<&[u8]> for WireBytes {
    fn from(b: &[u8]) -> WireBytes {
        WireBytes(b.to_vec())
    }
}

#[cfg(unix)]
impl From<&std::path::Path> for WireBytes {
    fn from(p: &std::path::Path) -> WireBytes {
        use std::os::unix::ffi::OsStrExt;
        WireBytes(p.as_os_str().as_bytes().to_vec())
    }
}

#[cfg(unix)]
impl From<std::path::PathBuf> for WireBytes {
    fn from(p: std::path::PathBuf) -> WireBytes {
        use std::os::unix::ffi::OsStringExt;
        WireBytes(p.into_os_string().into_vec())
    }
}

#[cfg(unix)]
impl From<std::ffi::OsString> for WireBytes {
    fn from(s: std::ffi::OsString) -> WireBytes {
        use std::os::unix::ffi::OsStringExt;
        WireBytes(s.into_vec())
    }
}

#[cfg(unix)]
impl From<&std::ffi::OsStr> for WireBytes {
    fn from(s: &std::ffi::OsStr) -> WireBytes {
        use std::os::unix::ffi::OsStrExt;
        WireBytes(s.as_bytes().to_vec())
    }
}

impl PartialEq<str> for WireBytes {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for WireBytes {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

/// Lossy, for messages: a name that is not UTF-8 shows U+FFFD where its bad bytes are.
impl fmt::Display for WireBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

/// Like a string's debug form, with bytes that are not UTF-8 as `\xNN`.
impl fmt::Debug for WireBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl Serialize for WireBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_str() {
            Some(text) => s.serialize_str(text),
            None => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry(B64_KEY, &STANDARD.encode(&self.0))?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for WireBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WireBytes, D::Error> {
        d.deserialize_any(PathVisitor)
    }
}

struct PathVisitor;

impl<'de> Visitor<'de> for PathVisitor {
    type Value = WireBytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a string, or {"b64": "..."} for bytes that are not UTF-8"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<WireBytes, E> {
        Ok(WireBytes::from(v))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<WireBytes, E> {
        Ok(WireBytes::from(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireBytes, A::Error> {
        let mut bytes = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key != B64_KEY {
                return Err(de::Error::unknown_field(&key, &[B64_KEY]));
            }
            let text: Cow<'de, str> = map.next_value()?;
            let decoded = STANDARD
                .decode(text.as_bytes())
                .map_err(|e| de::Error::custom(format!("a b64 field is not valid base64: {e}")))?;
            bytes = Some(decoded);
        }
        bytes
            .map(WireBytes)
            .ok_or_else(|| de::Error::missing_field(B64_KEY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_a_plain_string_and_other_bytes_are_base64() {
        let plain = WirePath::from("src/main.rs");
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#""src/main.rs""#);
        let odd = WirePath::from(b"bad\xfe".to_vec());
        assert_eq!(
            serde_json::to_string(&odd).unwrap(),
            r#"{"b64":"YmFk/g=="}"#
        );
        for p in [plain, odd, WirePath::from(b"\xff".to_vec())] {
            let back: WirePath = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
            assert_eq!(back, p);
        }
    }

    #[test]
    fn two_names_that_decode_alike_stay_apart() {
        let a = serde_json::to_string(&WirePath::from(b"\xfe".to_vec())).unwrap();
        let b = serde_json::to_string(&WirePath::from(b"\xff".to_vec())).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn malformed_byte_forms_are_refused_with_a_reason() {
        let bad = serde_json::from_str::<WirePath>(r#"{"b64":"%%"}"#).unwrap_err();
        assert!(bad.to_string().contains("not valid base64"), "{bad}");
        let other = serde_json::from_str::<WirePath>(r#"{"hex":"ff"}"#).unwrap_err();
        assert!(other.to_string().contains("b64"), "{other}");
        assert!(serde_json::from_str::<WirePath>("{}").is_err());
        assert!(serde_json::from_str::<WirePath>("3").is_err());
    }

    #[test]
    fn debug_escapes_what_is_not_printable() {
        let p = WirePath::from(b"a\n\xfe".to_vec());
        assert_eq!(format!("{p:?}"), r#""a\n\xfe""#);
    }
}
