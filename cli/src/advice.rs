//! What a person should do after a client error. `tether-client` says what happened, in terms
//! any program can use; the CLI, its commands and its MCP server alike, is the one place that
//! says which command to run next.

use tether_client::ClientError;

/// `err` as a sentence that ends in what to do; `relay` names the relay as the user gave it,
/// where the error's own URL is one the client built (a tunnel's `ws://` URL).
pub(crate) fn sentence(err: &ClientError, relay: Option<&str>) -> String {
    match err {
        ClientError::Connect { url, reason } => {
            let mut msg = format!(
                "no relay at {}: start one with `tether serve` (or use `tether run`, which needs \
                 none)",
                relay.unwrap_or(url)
            );
            // Beyond the usual "nobody listens", a cause helps (TLS, DNS, a proxy).
            let uninformative = ["refused", "error sending request"];
            if !uninformative
                .iter()
                .any(|u| reason.to_lowercase().contains(u))
            {
                msg.push_str(&format!(" [{reason}]"));
            }
            msg
        }
        // Reached and asked, then gone: unlike a relay that is not there, it may have done
        // what was asked, so retrying blindly could make a second sandbox.
        ClientError::Interrupted { url, reason } => format!(
            "the relay at {} went away in the middle of the request ({reason}): it may have \
             done what was asked, so a sandbox being created may exist; check with `tether ls` \
             before retrying",
            relay.unwrap_or(url)
        ),
        ClientError::NotRelay { url, reason } => format!(
            "{} answered, but not as a Tether relay ({reason}): check the relay's address \
             (--relay or TETHER_RELAY)",
            relay.unwrap_or(url)
        ),
        ClientError::Disconnected => "the connection to the sandbox was lost; retry, or check \
                                      that the relay and the sandbox are up (`tether ls`)"
            .into(),
        ClientError::PeerSilent { .. } => {
            format!("{err} (`tether ls` shows whether the relay answers)")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_names_the_command_the_library_does_not() {
        let refused = ClientError::Connect {
            url: "ws://127.0.0.1:1/v1/sandboxes/sb-1/ws".into(),
            reason: "tcp connect error: Connection refused (os error 111)".into(),
        };
        assert!(!refused.to_string().contains("tether "));
        assert_eq!(
            sentence(&refused, Some("http://127.0.0.1:1")),
            "no relay at http://127.0.0.1:1: start one with `tether serve` (or use `tether \
             run`, which needs none)"
        );
        let dns = ClientError::Connect {
            url: "http://relay.invalid".into(),
            reason: "dns error: failed to lookup address".into(),
        };
        assert!(sentence(&dns, None).ends_with("[dns error: failed to lookup address]"));
        let cut = ClientError::Interrupted {
            url: "http://r".into(),
            reason: "connection closed".into(),
        };
        assert!(!cut.to_string().contains("tether "));
        assert!(sentence(&cut, None).contains("`tether ls`"));
        assert!(sentence(&ClientError::Disconnected, None).contains("`tether ls`"));
    }
}
