//! Answering a registry's authentication challenge. A 401 carries `WWW-Authenticate`:
//! `Basic` is answered with the credentials from the docker config file; `Bearer realm=…,
//! service=…` by fetching a token for `repository:NAME:pull,push` from the realm (with those
//! credentials when there are some, anonymously otherwise). The answer that worked is kept
//! for the following requests.

use std::collections::BTreeMap;

use base64::Engine;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::Url;
use serde::Deserialize;
use tokio::sync::Mutex;

use super::credentials::{self, Credentials};
use super::error::{chain, ImageError};

/// The authentication state of one repository of one registry.
pub(crate) struct Auth {
    /// The registry as the user wrote it, for messages and the config file.
    host: String,
    repository: String,
    credentials: Option<Credentials>,
    /// The `Authorization` value that last worked.
    current: Mutex<Option<HeaderValue>>,
}

/// A token endpoint's answer (Docker's field, or OAuth's).
#[derive(Deserialize)]
struct Token {
    token: Option<String>,
    access_token: Option<String>,
}

impl Auth {
    /// Looks up the credentials for `host` in the docker config file.
    pub(crate) fn new(host: &str, repository: &str) -> Result<Auth, ImageError> {
        Ok(Auth {
            host: host.to_string(),
            repository: repository.to_string(),
            credentials: credentials::lookup(host)?,
            current: Mutex::new(None),
        })
    }

    /// The `Authorization` value to send, once a challenge has been answered.
    pub(crate) async fn current(&self) -> Option<HeaderValue> {
        self.current.lock().await.clone()
    }

    /// Keeps `value` for the following requests.
    pub(crate) async fn remember(&self, value: HeaderValue) {
        *self.current.lock().await = Some(value);
    }

    /// The `Authorization` value that answers `challenge` (a `WWW-Authenticate` value).
    pub(crate) async fn answer(
        &self,
        http: &reqwest::Client,
        challenge: &str,
    ) -> Result<HeaderValue, ImageError> {
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let creds = self
                    .credentials
                    .as_ref()
                    .ok_or_else(|| self.refused("it asks for a user name and password"))?;
                Ok(basic(creds))
            }
            "bearer" => {
                let realm = params
                    .get("realm")
                    .ok_or_else(|| self.refused("its token challenge names no realm"))?;
                let mut url = Url::parse(realm).map_err(|_| {
                    self.refused(&format!("its token realm {realm:?} is not a URL"))
                })?;
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = params.get("service") {
                        query.append_pair("service", service);
                    }
                    query.append_pair(
                        "scope",
                        &format!("repository:{}:pull,push", self.repository),
                    );
                }
                let mut request = http.get(url);
                if let Some(creds) = &self.credentials {
                    request = request.header(AUTHORIZATION, basic(creds));
                }
                let unreachable = |e: reqwest::Error| {
                    self.refused(&format!(
                        "its token service cannot be reached: {}",
                        chain(&e)
                    ))
                };
                let response = request.send().await.map_err(unreachable)?;
                if !response.status().is_success() {
                    let anonymous = if self.credentials.is_some() {
                        ""
                    } else {
                        " to an anonymous request"
                    };
                    return Err(self.refused(&format!(
                        "its token service answered HTTP {}{anonymous}",
                        response.status().as_u16()
                    )));
                }
                let token: Token = response.json().await.map_err(unreachable)?;
                let token = token
                    .token
                    .or(token.access_token)
                    .ok_or_else(|| self.refused("its token service returned no token"))?;
                HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| self.refused("its token is not a valid header value"))
            }
            _ => Err(self.refused(&format!(
                "it asks for authentication this client does not speak ({challenge:?})"
            ))),
        }
    }

    /// An [`ImageError::Auth`] saying `reason` and which credentials were used.
    pub(crate) fn refused(&self, reason: &str) -> ImageError {
        let creds = match (&self.credentials, credentials::config_path()) {
            (Some(c), _) => format!("; the credentials used are user {:?}'s from the docker config file", c.username),
            (None, Some(path)) => format!(
                "; no credentials for it were found in {} (run `docker login {}`, or set DOCKER_CONFIG)",
                path.display(),
                self.host
            ),
            (None, None) => "; no docker config file was found (set DOCKER_CONFIG)".into(),
        };
        ImageError::Auth {
            registry: self.host.clone(),
            reason: format!("{reason}{creds}"),
        }
    }
}

/// `Basic base64(user:password)`.
fn basic(creds: &Credentials) -> HeaderValue {
    let encoded = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", creds.username, creds.password));
    HeaderValue::from_str(&format!("Basic {encoded}")).expect("base64 is a valid header value")
}

/// `Bearer realm="https://a/token",service="reg",scope="repository:x:pull,push"` → the
/// scheme and its parameters (values may be quoted, and quoted values may hold commas).
fn parse_challenge(header: &str) -> (String, BTreeMap<String, String>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = chars.by_ref().take_while(|c| *c != ',').collect();
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    (scheme.to_string(), params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed_with_quoted_commas() {
        let (scheme, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
        let (scheme, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (scheme.as_str(), p["realm"].as_str()),
            ("Basic", "Registry Realm")
        );
        assert!(parse_challenge("").1.is_empty());
    }

    #[test]
    fn basic_auth_is_base64_user_colon_password() {
        let creds = Credentials {
            username: "user".into(),
            password: "pa:ss".into(),
        };
        assert_eq!(basic(&creds), "Basic dXNlcjpwYTpzcw==");
    }
}
