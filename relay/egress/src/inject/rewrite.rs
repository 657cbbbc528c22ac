//! The injection policy on one request head: the request must be for the connection's host,
//! and the placeholders of the secrets bound to that host are replaced in header values, in
//! `Basic` credentials and in the target. Bodies are not this module's business: they are
//! never rewritten.

use std::borrow::Cow;

use base64::engine::general_purpose::{
    GeneralPurpose, GeneralPurposeConfig, STANDARD as BASE64, STANDARD_NO_PAD as BASE64_NO_PAD,
};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, HOST, PROXY_AUTHORIZATION};
use hyper::http::request::Parts;
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{Method, StatusCode, Uri};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tether_client::api::SecretValue;

use super::MIN_SCRUBBED_VALUE;
use tether_relay_core::egress::policy::{BoundSecret, PLACEHOLDER_PREFIX};

/// What a secret's value may hold unencoded in a request target: RFC 3986's unreserved
/// characters. Everything else is percent-encoded, so a value cannot add a query parameter or
/// a path segment.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Standard base64 with or without its padding, for what an upstream echoes: some strip it.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The secrets whose placeholders are replaced on one connection: those bound to its host.
pub(super) struct Secrets(Vec<Secret>);

struct Secret {
    name: String,
    placeholder: String,
    value: SecretValue,
}

/// Why the injector answers a request itself instead of forwarding it: a status and a sentence
/// for the sandbox (never holding a secret's value).
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: String) -> Self {
        Self { status, message }
    }
}

impl Secrets {
    /// The secrets among `all` that are bound to `host`.
    pub(super) fn for_host(all: &[BoundSecret], host: &str) -> Self {
        Self(
            all.iter()
                .filter(|s| s.hosts.iter().any(|p| p.matches(host)))
                .map(|s| Secret {
                    name: s.name.clone(),
                    placeholder: s.placeholder.clone(),
                    value: s.value.clone(),
                })
                .collect(),
        )
    }

    /// How many secrets are bound to the connection's host.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Replaces the placeholders in the head's header values and target (which [`direct`] has
    /// put in origin form); returns the names of the secrets put in.
    pub(super) fn apply(&self, parts: &mut Parts) -> Result<Vec<&str>, Refusal> {
        let mut used = Vec::new();
        for (name, value) in parts.headers.iter_mut() {
            if let Some(mut replaced) = self.in_header(name, value, &mut used)? {
                // Kept out of Debug output and HTTP/2 header compression tables.
                replaced.set_sensitive(true);
                *value = replaced;
            }
        }
        if let Some(pq) = parts.uri.path_and_query() {
            let render = |s: &Secret| {
                Ok(Cow::Owned(
                    utf8_percent_encode(s.value.expose(), UNRESERVED)
                        .to_string()
                        .into_bytes(),
                ))
            };
            if let Some(target) = self.replace(pq.as_str().as_bytes(), &mut used, render)? {
                // Percent-encoding leaves only characters a target may hold.
                let target = PathAndQuery::try_from(target).map_err(|e| {
                    Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!("the request target cannot carry the secret: {e}"),
                    )
                })?;
                parts.uri = Uri::from(target);
            }
        }
        Ok(used)
    }

    /// Puts placeholders back where a response's header values carry a secret's value in any
    /// form [`Secrets::apply`] sends it in: as is (header values), percent-encoded (the target:
    /// a redirect whose `Location` repeats the query) and inside base64 `Basic` credentials (an
    /// error header that echoes `Authorization`), so the sandbox does not learn it that way;
    /// returns the names of the secrets found. Bodies are not searched (they may be compressed,
    /// and are streamed).
    pub(super) fn scrub(&self, headers: &mut HeaderMap) -> Vec<&str> {
        let mut found = Vec::new();
        for value in headers.values_mut() {
            let mut current = Cow::Borrowed(value.as_bytes());
            for secret in &self.0 {
                let plain = secret.value.expose();
                if plain.len() < MIN_SCRUBBED_VALUE {
                    continue;
                }
                let encoded = utf8_percent_encode(plain, UNRESERVED).to_string();
                for needle in [plain, encoded.as_str()] {
                    if find(&current, needle.as_bytes()).is_some() {
                        let replaced =
                            replace_all(&current, needle.as_bytes(), secret.placeholder.as_bytes());
                        current = Cow::Owned(replaced);
                        if !found.contains(&secret.name.as_str()) {
                            found.push(secret.name.as_str());
                        }
                    }
                }
            }
            if let Some(decoded) = self.scrub_base64(&current, &mut found) {
                current = Cow::Owned(decoded);
            }
            if let Cow::Owned(bytes) = current {
                // A placeholder is letters, digits and `-`: the result is a valid value.
                if let Ok(scrubbed) = HeaderValue::from_bytes(&bytes) {
                    *value = scrubbed;
                }
            }
        }
        found
    }

    /// `value` with every base64 token (a run of the standard alphabet, its padding at the end)
    /// whose decoded bytes hold a secret's value encoded again with the placeholder there
    /// instead: the `Basic` credentials [`Secrets::in_basic`] made, echoed back whole or in
    /// another header. `None` if no token holds a value.
    fn scrub_base64<'s>(&'s self, value: &[u8], found: &mut Vec<&'s str>) -> Option<Vec<u8>> {
        let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
        let mut out: Option<Vec<u8>> = None;
        let (mut copied, mut i) = (0, 0);
        while i < value.len() {
            if !alphabet(value[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < value.len() && alphabet(value[i]) {
                i += 1;
            }
            let unpadded = i;
            while i < value.len() && i - unpadded < 2 && value[i] == b'=' {
                i += 1;
            }
            if i - start < MIN_SCRUBBED_VALUE {
                continue;
            }
            let Ok(mut decoded) = LENIENT_BASE64.decode(&value[start..i]) else {
                continue;
            };
            let mut hit = false;
            for secret in &self.0 {
                let plain = secret.value.expose().as_bytes();
                if plain.len() < MIN_SCRUBBED_VALUE || find(&decoded, plain).is_none() {
                    continue;
                }
                decoded = replace_all(&decoded, plain, secret.placeholder.as_bytes());
                hit = true;
                if !found.contains(&secret.name.as_str()) {
                    found.push(secret.name.as_str());
                }
            }
            if hit {
                let encoded = if i > unpadded {
                    BASE64.encode(&decoded)
                } else {
                    BASE64_NO_PAD.encode(&decoded)
                };
                let out = out.get_or_insert_with(Vec::new);
                out.extend_from_slice(&value[copied..start]);
                out.extend_from_slice(encoded.as_bytes());
                copied = i;
            }
        }
        let mut out = out?;
        out.extend_from_slice(&value[copied..]);
        Some(out)
    }

    /// A header value with the placeholders replaced, or `None` if it holds none.
    fn in_header<'s>(
        &'s self,
        name: &HeaderName,
        value: &HeaderValue,
        used: &mut Vec<&'s str>,
    ) -> Result<Option<HeaderValue>, Refusal> {
        if *name == AUTHORIZATION || *name == PROXY_AUTHORIZATION {
            if let Some(basic) = self.in_basic(value.as_bytes(), used)? {
                return Ok(Some(basic));
            }
        }
        let render = |s: &'s Secret| -> Result<Cow<'s, [u8]>, Refusal> {
            let value = s.value.expose();
            if value
                .bytes()
                .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
            {
                Ok(Cow::Borrowed(value.as_bytes()))
            } else {
                Err(Refusal::new(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "the value of secret {} cannot go in the `{name}` header: it holds \
                         control characters or line breaks; store the value exactly as the \
                         upstream expects it (`tether secret set {} < file` keeps a trailing \
                         newline)",
                        s.name, s.name
                    ),
                ))
            }
        };
        match self.replace(value.as_bytes(), used, render)? {
            // Valid: the original was a header value, and so is every value spliced in.
            Some(bytes) => Ok(Some(HeaderValue::from_bytes(&bytes).map_err(|_| {
                Refusal::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the `{name}` header cannot carry the secret"),
                )
            })?)),
            None => Ok(None),
        }
    }

    /// `Basic` credentials (base64 of `user:password`) with the placeholders replaced inside,
    /// or `None` if the value is not `Basic` or its decoded credentials hold no placeholder (a
    /// placeholder standing for the whole encoded token is then replaced as is).
    fn in_basic<'s>(
        &'s self,
        value: &[u8],
        used: &mut Vec<&'s str>,
    ) -> Result<Option<HeaderValue>, Refusal> {
        let Ok(text) = std::str::from_utf8(value) else {
            return Ok(None);
        };
        let Some((scheme, token)) = text.trim().split_once(' ') else {
            return Ok(None);
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            return Ok(None);
        }
        let Ok(credentials) = BASE64.decode(token.trim()) else {
            return Ok(None);
        };
        let render = |s: &'s Secret| -> Result<Cow<'s, [u8]>, Refusal> {
            Ok(Cow::Borrowed(s.value.expose().as_bytes()))
        };
        let Some(replaced) = self.replace(&credentials, used, render)? else {
            return Ok(None);
        };
        let encoded = format!("{scheme} {}", BASE64.encode(replaced));
        Ok(Some(
            HeaderValue::try_from(encoded).expect("base64 is a valid header value"),
        ))
    }

    /// `haystack` with each of these secrets' placeholders replaced by what `render` makes of
    /// the secret; `None` if no placeholder occurs.
    fn replace<'s>(
        &'s self,
        haystack: &[u8],
        used: &mut Vec<&'s str>,
        render: impl Fn(&'s Secret) -> Result<Cow<'s, [u8]>, Refusal>,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        if find(haystack, PLACEHOLDER_PREFIX.as_bytes()).is_none() {
            return Ok(None);
        }
        let mut current = Cow::Borrowed(haystack);
        for secret in &self.0 {
            let placeholder = secret.placeholder.as_bytes();
            if find(&current, placeholder).is_none() {
                continue;
            }
            let with = render(secret)?;
            current = Cow::Owned(replace_all(&current, placeholder, &with));
            if !used.contains(&secret.name.as_str()) {
                used.push(&secret.name);
            }
        }
        Ok(match current {
            Cow::Owned(bytes) => Some(bytes),
            Cow::Borrowed(_) => None,
        })
    }
}

/// Checks that the request is for `host:port`, by its `Host` header and by the authority of
/// an absolute-form target, then leaves it in origin form with a `Host` header (added when
/// missing), as the upstream expects.
pub(super) fn direct(parts: &mut Parts, host: &str, port: u16) -> Result<(), Refusal> {
    if parts.method == Method::CONNECT {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "CONNECT inside a connection to {host} is not forwarded; connect to the \
                 destination directly (the egress proxy decides where it may go)"
            ),
        ));
    }
    let misdirected = |named: &str| {
        Refusal::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this connection is for {host}, but the request is for {named}; the egress \
                 proxy sends a request only to the host its connection was opened for"
            ),
        )
    };
    let mut hosts = parts.headers.get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the request has more than one Host header".into(),
        ));
    }
    if let Some(header) = header {
        let named = String::from_utf8_lossy(header.as_bytes());
        if !names(&named, host, port) {
            return Err(misdirected(&named));
        }
    }
    if let Some(authority) = parts.uri.authority() {
        if !names(authority.as_str(), host, port) {
            return Err(misdirected(authority.as_str()));
        }
    }
    if header.is_none() {
        let value = if port == 443 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        let value = HeaderValue::try_from(value).expect("a host name is a valid header value");
        parts.headers.insert(HOST, value);
    }
    if parts.uri.authority().is_some() || parts.uri.scheme().is_some() {
        let target = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(target);
    }
    Ok(())
}

/// Whether an authority (`name` or `name:port`, no user info) names `host` on `port`.
fn names(authority: &str, host: &str, port: u16) -> bool {
    if authority.contains('@') {
        return false;
    }
    let Ok(authority) = authority.parse::<Authority>() else {
        return false;
    };
    authority
        .host()
        .trim_end_matches('.')
        .eq_ignore_ascii_case(host)
        && authority.port_u16().is_none_or(|p| p == port)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut rest = haystack;
    while let Some(at) = find(rest, needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Request;
    use tether_relay_core::egress::policy::HostPattern;

    const KEY: &str = "tether-secret-0123456789abcdef0123456789abcdef";
    const OTHER: &str = "tether-secret-fedcba9876543210fedcba9876543210";

    fn bound(name: &str, placeholder: &str, value: &str, host: &str) -> BoundSecret {
        BoundSecret {
            name: name.into(),
            placeholder: placeholder.into(),
            value: SecretValue::new(value),
            hosts: vec![HostPattern::parse(host).unwrap()],
        }
    }

    fn secrets(host: &str) -> Secrets {
        Secrets::for_host(
            &[
                bound("API_KEY", KEY, "sk-real/+=&value", "api.test"),
                bound("OTHER_KEY", OTHER, "other-real", "*.other.test"),
            ],
            host,
        )
    }

    fn head(target: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder().uri(target);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn header<'a>(parts: &'a Parts, name: &str) -> &'a str {
        parts.headers.get(name).unwrap().to_str().unwrap()
    }

    #[test]
    fn placeholders_in_headers_are_replaced_and_marked_sensitive() {
        let mut parts = head(
            "/v1",
            &[
                ("authorization", &format!("Bearer {KEY}")),
                ("x-api-key", KEY),
                ("cookie", &format!("a=1; k={KEY}; b={KEY}")),
                ("x-plain", "nothing here"),
            ],
        );
        let secrets = secrets("api.test");
        let used = secrets.apply(&mut parts).unwrap();
        assert_eq!(used, ["API_KEY"]);
        assert_eq!(header(&parts, "authorization"), "Bearer sk-real/+=&value");
        assert_eq!(header(&parts, "x-api-key"), "sk-real/+=&value");
        assert_eq!(
            header(&parts, "cookie"),
            "a=1; k=sk-real/+=&value; b=sk-real/+=&value"
        );
        assert!(parts.headers.get("x-api-key").unwrap().is_sensitive());
        assert!(!parts.headers.get("x-plain").unwrap().is_sensitive());
        assert!(!format!("{parts:?}").contains("sk-real"));
    }

    #[test]
    fn basic_credentials_are_decoded_replaced_and_encoded() {
        let token = BASE64.encode(format!("user:{KEY}"));
        let mut parts = head("/", &[("authorization", &format!("basic {token}"))]);
        secrets("api.test").apply(&mut parts).unwrap();
        let expected = BASE64.encode("user:sk-real/+=&value");
        assert_eq!(header(&parts, "authorization"), format!("basic {expected}"));

        // A placeholder that stands for the whole encoded token is replaced as it is.
        let mut parts = head("/", &[("authorization", &format!("Basic {KEY}"))]);
        secrets("api.test").apply(&mut parts).unwrap();
        assert_eq!(header(&parts, "authorization"), "Basic sk-real/+=&value");
    }

    #[test]
    fn placeholders_in_the_target_are_replaced_percent_encoded() {
        let mut parts = head(&format!("/keys/{KEY}/x?key={KEY}&n=1"), &[]);
        secrets("api.test").apply(&mut parts).unwrap();
        assert_eq!(
            parts.uri.to_string(),
            "/keys/sk-real%2F%2B%3D%26value/x?key=sk-real%2F%2B%3D%26value&n=1"
        );
    }

    #[test]
    fn only_secrets_bound_to_the_host_are_replaced() {
        let mut parts = head(
            &format!("/?k={OTHER}"),
            &[("authorization", &format!("Bearer {OTHER}"))],
        );
        let on_api = secrets("api.test");
        let used = on_api.apply(&mut parts).unwrap();
        assert!(used.is_empty());
        assert_eq!(header(&parts, "authorization"), format!("Bearer {OTHER}"));
        assert_eq!(parts.uri.to_string(), format!("/?k={OTHER}"));

        let mut parts = head("/", &[("x-a", OTHER), ("x-b", KEY)]);
        let on_other = secrets("eu.other.test");
        let used = on_other.apply(&mut parts).unwrap();
        assert_eq!(used, ["OTHER_KEY"]);
        assert_eq!(header(&parts, "x-a"), "other-real");
        assert_eq!(header(&parts, "x-b"), KEY);
    }

    #[test]
    fn a_value_unfit_for_a_header_is_refused_without_showing_it() {
        let all = [bound("NL", KEY, "line1\nline2-hidden", "api.test")];
        let mut parts = head("/", &[("x-key", KEY)]);
        let refusal = Secrets::for_host(&all, "api.test")
            .apply(&mut parts)
            .unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_GATEWAY);
        assert!(refusal.message.contains("secret NL"), "{}", refusal.message);
        assert!(!refusal.message.contains("hidden"), "{}", refusal.message);
    }

    #[test]
    fn secret_values_in_response_headers_become_placeholders_again() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "location",
            HeaderValue::from_static("/next?key=sk-real%2F%2B%3D%26value"),
        );
        headers.insert(
            "x-echo",
            HeaderValue::from_static("Bearer sk-real/+=&value"),
        );
        headers.insert("x-other", HeaderValue::from_static("other-real"));
        let secrets = secrets("api.test");
        assert_eq!(secrets.scrub(&mut headers), ["API_KEY"]);
        assert_eq!(headers["location"], format!("/next?key={KEY}").as_str());
        assert_eq!(headers["x-echo"], format!("Bearer {KEY}").as_str());
        // Only the host's own secrets are looked for.
        assert_eq!(headers["x-other"], "other-real");

        // The `Basic` credentials the injector sent, echoed back as they were or without their
        // padding and beside other text, go back to the sandbox's own credentials.
        let mut parts = head(
            "/",
            &[(
                "authorization",
                &format!("Basic {}", BASE64.encode(format!("user:{KEY}"))),
            )],
        );
        secrets.apply(&mut parts).unwrap();
        let sent = header(&parts, "authorization");
        let token = sent.strip_prefix("Basic ").unwrap().to_string();
        let mut headers = HeaderMap::new();
        headers.insert("x-echo-auth", HeaderValue::from_str(sent).unwrap());
        let bare = token.trim_end_matches('=');
        headers.insert(
            "x-seen",
            HeaderValue::from_str(&format!("got={bare};ok")).unwrap(),
        );
        assert_eq!(secrets.scrub(&mut headers), ["API_KEY"]);
        let mine = BASE64.encode(format!("user:{KEY}"));
        assert_eq!(headers["x-echo-auth"], format!("Basic {mine}").as_str());
        assert_eq!(
            headers["x-seen"],
            format!("got={};ok", mine.trim_end_matches('=')).as_str()
        );
        for value in headers.values() {
            let text = value.to_str().unwrap();
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '/')) {
                if let Ok(plain) = LENIENT_BASE64.decode(word) {
                    assert!(find(&plain, b"sk-real").is_none(), "{text}");
                }
            }
        }

        // Values too short to tell from ordinary text are left alone.
        let short = Secrets::for_host(&[bound("PIN", KEY, "1234", "api.test")], "api.test");
        let mut headers = HeaderMap::new();
        headers.insert("x-n", HeaderValue::from_static("1234"));
        assert!(short.scrub(&mut headers).is_empty());
    }

    #[test]
    fn requests_for_another_host_are_misdirected() {
        for (target, host_header) in [
            ("/", Some("evil.test")),
            ("/", Some("api.test.evil.test")),
            ("/", Some("api.test:8443")),
            ("/", Some("user@api.test")),
            ("https://evil.test/", None),
            ("https://evil.test/", Some("api.test")),
        ] {
            let mut parts = match host_header {
                Some(h) => head(target, &[("host", h)]),
                None => head(target, &[]),
            };
            let refusal = direct(&mut parts, "api.test", 443).unwrap_err();
            assert_eq!(
                refusal.status,
                StatusCode::MISDIRECTED_REQUEST,
                "{host_header:?}"
            );
        }
        let mut parts = head("/", &[("host", "api.test"), ("host", "api.test")]);
        assert_eq!(
            direct(&mut parts, "api.test", 443).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );

        let mut parts = Request::builder()
            .method(Method::CONNECT)
            .uri("api.test:443")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(
            direct(&mut parts, "api.test", 443).unwrap_err().status,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn requests_for_the_host_go_in_origin_form_with_a_host_header() {
        let mut parts = head("https://API.test:443/a?b=c", &[("host", "api.test.")]);
        direct(&mut parts, "api.test", 443).unwrap();
        assert_eq!(parts.uri.to_string(), "/a?b=c");
        assert_eq!(header(&parts, "host"), "api.test.");

        let mut parts = head("/x", &[]);
        direct(&mut parts, "api.test", 8443).unwrap();
        assert_eq!(header(&parts, "host"), "api.test:8443");
    }
}
