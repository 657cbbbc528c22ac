//! Protocol upgrades through the injector (WebSockets: `wss://` APIs that take their key in
//! the handshake's headers): the handshake is a request like any other, its placeholders
//! replaced; once the upstream answers 101, the two connections are joined byte for byte, and
//! nothing after the handshake is rewritten.

use hyper::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;
use tracing::debug;

/// The protocol a request asks to upgrade to (its `Upgrade` header, when its `Connection`
/// header lists `upgrade`).
pub(super) fn requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let listed = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    listed.then(|| headers.get(UPGRADE).cloned()).flatten()
}

/// Puts back the two hop-by-hop headers an upgrade needs, on the request to the upstream and
/// on its 101 to the sandbox.
pub(super) fn restore(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// Joins the sandbox's upgraded connection to the upstream's, until either side closes.
pub(super) fn tunnel(client: OnUpgrade, upstream: OnUpgrade, host: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(both) => both,
            Err(e) => {
                debug!("egress: the upgrade with {host} did not complete: {e}");
                return;
            }
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((out, back)) => {
                debug!("egress: the upgraded connection to {host} closed ({out} bytes out, {back} back)")
            }
            Err(e) => debug!("egress: the upgraded connection to {host} broke: {e}"),
        }
    })
}
