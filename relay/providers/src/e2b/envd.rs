//! Starting the agent through envd, E2B's in-sandbox daemon. A template's start command runs
//! once at build time and never sees a sandbox's own variables, so the per-sandbox agent token
//! arrives after create: we call envd's `process.Process/Start` (the Connect protocol, JSON
//! codec, as E2B's SDKs speak it) to run `tether-agent serve` as root with the token in its
//! environment, and read the process's output until the agent says it is listening.
//!
//! A template's ENV steps hold at build time only (envd starts processes with `PATH`, `HOME`,
//! `USER`, `LOGNAME`, the sandbox's envVars and the request's envs, nothing of the image), so
//! `tether image build --target e2b --env` also bakes its variables into
//! [`IMAGE_ENV_FILE`]; [`image_env`] reads it through envd's file API (`GET /files`) and they
//! join the agent's environment, and so every process it starts, under the sandbox's own.
//!
//! Connect server streaming: the request body is one envelope, the response a sequence of
//! them; an envelope is a flags byte, a big-endian u32 length and a JSON message. Flag `0x02`
//! marks the last one, which holds `{"error": ...}` if the call failed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use base64::Engine;
use bytes::{Buf, BytesMut};
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;

use crate::cloud::constants::{
    AGENT_ARGS, AGENT_PROGRAM, AGENT_START_TIMEOUT, AGENT_TOKEN_ENV, REQUEST_TIMEOUT,
};
use crate::cloud::http::{message_of, quote};
use tether_relay_core::provider::ProviderError;

/// envd's RPC path that starts a process.
const START_PATH: &str = "/process.Process/Start";
/// envd's file download path.
const FILES_PATH: &str = "/files";
/// Where a template built by `tether image build --target e2b` keeps the variables its
/// `--env` gave: a JSON object of strings.
pub(super) const IMAGE_ENV_FILE: &str = "/etc/tether/image-env.json";
/// The largest image env file read (it is the sandbox's: a hostile one could be huge).
const MAX_IMAGE_ENV: usize = 64 << 10; // 64 KiB
/// `Authorization: Basic base64("root:")`: envd runs the process as this user. The agent runs
/// as root so that it can start processes as any user.
const ROOT_USER: &str = "Basic cm9vdDo=";
/// The Connect envelope flag of the stream's last message.
const END_STREAM: u8 = 0x02;
/// The agent's readiness line on stdout.
const READY_LINE: &str = "listening ";
/// The most of the agent's output kept for an error message.
const MAX_OUTPUT: usize = 4096; // bytes

/// Where envd is and what it demands.
pub(super) struct Envd {
    /// envd's base URL (port 49983 through the edge).
    pub url: String,
    /// Routing and access headers (`X-Access-Token`, maybe `E2b-Sandbox-Id`/`-Port`).
    pub headers: HeaderMap,
}

/// One `ProcessEvent` as JSON: `{"event": {"start"|"data"|"end"|"keepalive": ...}}`.
#[derive(Debug, Deserialize)]
struct StartResponse {
    #[serde(default)]
    event: Option<Event>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    end: Option<End>,
}

#[derive(Debug, Default, Deserialize)]
struct Data {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct End {
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<String>,
}

/// The variables the template's image env file holds ([`IMAGE_ENV_FILE`]), less those in
/// `overridden` (the sandbox's own, which win); none when the template has no such file.
pub(super) async fn image_env(
    http: &reqwest::Client,
    envd: &Envd,
    overridden: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, ProviderError> {
    let url = format!("{}{FILES_PATH}", envd.url);
    let mut headers = envd.headers.clone();
    headers.insert("authorization", HeaderValue::from_static(ROOT_USER));
    let resp = http
        .get(&url)
        .query(&[("path", IMAGE_ENV_FILE), ("username", "root")])
        .headers(headers)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .map_err(|e| anyhow!("cannot reach envd at {url} to read {IMAGE_ENV_FILE}: {e}"))?;
    let status = resp.status().as_u16();
    if status == 404 {
        return Ok(BTreeMap::new());
    }
    let body = read_bounded(resp, MAX_IMAGE_ENV).await?;
    if status != 200 {
        return Err(ProviderError::Other(anyhow!(
            "envd refused to read {IMAGE_ENV_FILE} (HTTP {status}: {})",
            message_of(&body)
        )));
    }
    let env: BTreeMap<String, String> = serde_json::from_slice(&body).map_err(|e| {
        anyhow!(
            "the template's {IMAGE_ENV_FILE} is not a JSON object of strings ({e}); rebuild \
             the template with `tether image build --target e2b`"
        )
    })?;
    Ok(env
        .into_iter()
        .filter(|(key, _)| key != AGENT_TOKEN_ENV && !overridden.contains(key))
        .filter(|(key, _)| !key.is_empty() && !key.contains(['=', '\0']))
        .collect())
}

/// The body of `resp`, refused past `limit` bytes.
async fn read_bounded(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| anyhow!("the connection to envd broke: {e}"))?
    {
        if body.len() + chunk.len() > limit {
            return Err(ProviderError::Other(anyhow!(
                "envd sent more than {limit} bytes for {IMAGE_ENV_FILE}"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Starts `tether-agent serve` with `agent_token` and `env` (the image's variables) and
/// returns once it listens. The process outlives this call: envd keeps it when the stream
/// closes.
pub(super) async fn start_agent(
    http: &reqwest::Client,
    envd: &Envd,
    agent_token: &str,
    env: &BTreeMap<String, String>,
) -> Result<(), ProviderError> {
    let mut envs = env.clone();
    envs.insert(AGENT_TOKEN_ENV.to_string(), agent_token.to_string());
    let request = serde_json::json!({
        "process": {
            "cmd": AGENT_PROGRAM,
            "args": AGENT_ARGS,
            "envs": envs,
        },
        "stdin": false,
    });
    let body = envelope(
        0,
        &serde_json::to_vec(&request).map_err(anyhow::Error::new)?,
    );
    let mut headers = envd.headers.clone();
    headers.insert("authorization", HeaderValue::from_static(ROOT_USER));
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/connect+json"),
    );
    headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
    let url = format!("{}{START_PATH}", envd.url);
    let run = async {
        let mut resp = http
            .post(&url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| anyhow!("cannot reach envd at {url} to start the agent: {e}"))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(EnvdFailure::Status(status, message_of(&body)));
        }
        let mut buf = BytesMut::new();
        let mut output = Vec::new();
        loop {
            while let Some((flags, message)) = next_envelope(&mut buf) {
                if flags & END_STREAM != 0 {
                    return Err(EnvdFailure::Ended(
                        end_stream_error(&message),
                        text(&output),
                    ));
                }
                let event: StartResponse = serde_json::from_slice(&message).map_err(|e| {
                    anyhow!(
                        "envd sent an event we cannot read: {e} ({})",
                        quote(&message)
                    )
                })?;
                let Some(event) = event.event else { continue };
                if let Some(data) = event.data {
                    for chunk in [data.stdout, data.stderr].into_iter().flatten() {
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(chunk)
                            .map_err(|e| anyhow!("envd sent output that is not base64: {e}"))?;
                        if output.len() < MAX_OUTPUT {
                            output.extend_from_slice(&bytes);
                        }
                    }
                    if text(&output).lines().any(|l| l.starts_with(READY_LINE)) {
                        return Ok(());
                    }
                }
                if let Some(end) = event.end {
                    let why = end.error.unwrap_or(end.status);
                    return Err(EnvdFailure::Exited(end.exit_code, why, text(&output)));
                }
            }
            match resp.chunk().await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
                Ok(None) => {
                    return Err(EnvdFailure::Ended("the stream ended".into(), text(&output)))
                }
                Err(e) => {
                    return Err(anyhow!(
                        "the connection to envd broke while the agent started: {e}"
                    )
                    .into())
                }
            }
        }
    };
    match tokio::time::timeout(AGENT_START_TIMEOUT, run).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) => Err(failure.into_provider_error()),
        Err(_) => Err(ProviderError::Other(anyhow!(
            "the agent did not start listening within {AGENT_START_TIMEOUT:?}"
        ))),
    }
}

/// How starting the agent failed.
#[derive(Debug)]
enum EnvdFailure {
    /// envd answered with an error status.
    Status(u16, String),
    /// The stream ended (with this error) before the agent listened.
    Ended(String, String),
    /// The agent exited: code, status, output.
    Exited(i32, String, String),
    /// Anything else.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for EnvdFailure {
    fn from(e: anyhow::Error) -> Self {
        EnvdFailure::Other(e)
    }
}

impl EnvdFailure {
    fn into_provider_error(self) -> ProviderError {
        let image_hint = format!(
            "the E2B template must have `{AGENT_PROGRAM}` on its PATH (see docs/providers.md)"
        );
        ProviderError::Other(match self {
            EnvdFailure::Status(status, message) => {
                anyhow!("envd refused to start the agent (HTTP {status}: {message})")
            }
            EnvdFailure::Ended(why, output) => {
                anyhow!(
                    "envd ended the agent's start ({why}); {image_hint}{}",
                    tail(&output)
                )
            }
            EnvdFailure::Exited(code, why, output) => anyhow!(
                "the agent exited with status {code} ({why}) instead of listening; \
                 {image_hint}{}",
                tail(&output)
            ),
            EnvdFailure::Other(e) => e,
        })
    }
}

fn tail(output: &str) -> String {
    let output = output.trim();
    if output.is_empty() {
        String::new()
    } else {
        format!("; it printed: {output}")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A Connect envelope around `message`.
fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Takes one complete envelope off the front of `buf`, if there is one.
fn next_envelope(buf: &mut BytesMut) -> Option<(u8, bytes::Bytes)> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    let flags = buf[0];
    buf.advance(5);
    Some((flags, buf.split_to(len).freeze()))
}

/// The error in an end-of-stream message, or a plain "the stream ended".
fn end_stream_error(message: &[u8]) -> String {
    let json: serde_json::Value = serde_json::from_slice(message).unwrap_or_default();
    match json.get("error") {
        Some(e) => format!(
            "{}: {}",
            e.get("code").and_then(|c| c.as_str()).unwrap_or("error"),
            e.get("message").and_then(|m| m.as_str()).unwrap_or("")
        ),
        None => "the process stream ended".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_wait_for_whole_messages() {
        let mut buf = BytesMut::new();
        let one = envelope(0, br#"{"event":{}}"#);
        buf.extend_from_slice(&one[..3]);
        assert!(next_envelope(&mut buf).is_none());
        buf.extend_from_slice(&one[3..]);
        buf.extend_from_slice(&envelope(
            END_STREAM,
            br#"{"error":{"code":"not_found","message":"x"}}"#,
        ));
        let (flags, msg) = next_envelope(&mut buf).unwrap();
        assert_eq!((flags, &msg[..]), (0, &br#"{"event":{}}"#[..]));
        let (flags, msg) = next_envelope(&mut buf).unwrap();
        assert_eq!(flags, END_STREAM);
        assert_eq!(end_stream_error(&msg), "not_found: x");
        assert!(buf.is_empty());
    }
}
