//! Preview URLs: the relay's two forms of one preview, and which of them the SDK hands out.
//!
//! The relay serves a port inside a sandbox by host name, `http://PORT-ID.localhost:RELAYPORT/`
//! (each sandbox and port its own origin; an app's absolute links keep working), and by path,
//! `http://RELAY/preview/ID/PORT/` (reached wherever the relay is; every sandbox shares the
//! relay's origin, and an app's absolute links escape the prefix). Both carry the sandbox's
//! preview token in the `tether_preview_token` query parameter: a program gets the page at once,
//! a browser gets a cookie and a redirect that drops the token from its address bar.
//!
//! Which form `fetchable` picks, and why it asks the resolver. Browsers and curl resolve
//! `*.localhost` to loopback by themselves (RFC 6761), but Node's fetch (undici, through
//! `dns.lookup`) and Python's httpx, requests and urllib ask the platform's resolver
//! (`getaddrinfo`). On Linux, glibc answers `*.localhost` only when `hosts:` in
//! /etc/nsswitch.conf names nss-myhostname or systemd-resolved, which Debian's default
//! `files dns` and most container images leave out; other platforms differ again. A rule by
//! platform would be wrong somewhere, so the SDK asks that same resolver about the very name, and
//! takes the host form only when:
//! - the name resolves within `PREVIEW_RESOLVE_TIMEOUT_MS`;
//! - for a `localhost` name, every address is loopback (a DNS server that answers for
//!   `.localhost`, as some wildcard resolvers do, would otherwise receive requests carrying the
//!   token), and the SDK itself reaches the relay at a loopback address (a loopback name reaches
//!   the relay only when the relay runs on this machine).
//! Otherwise (and where there is no `node:dns`) it takes the path form, whose address is the one
//! the SDK reached the relay at, so every client that can reach the relay can fetch it. The
//! choice is made for clients on the machine that runs the SDK. Nothing here logs a URL: each
//! carries the token.

import { PREVIEW_RESOLVE_TIMEOUT_MS, PREVIEW_TOKEN_PARAM } from "./constants.js";

/** The relay's URL template (`{port}` in it) for `port`, carrying `token`. */
export function withToken(template: string, port: number, token: string): string {
  return `${template.replace("{port}", String(port))}?${PREVIEW_TOKEN_PARAM}=${encodeURIComponent(token)}`;
}

/** `hostUrl` when clients on this machine that use the platform's resolver can reach it (the
 * rules above), `pathUrl` otherwise. */
export async function fetchable(hostUrl: string, pathUrl: string): Promise<string> {
  const host = hostname(hostUrl);
  if (!host) return pathUrl;
  const local = host === "localhost" || host.endsWith(".localhost");
  if (local && !isLoopback(hostname(pathUrl))) return pathUrl;
  const addresses = await resolve(host);
  if (addresses.length === 0) return pathUrl;
  if (local && !addresses.every(isLoopback)) return pathUrl;
  return hostUrl;
}

function hostname(url: string): string | undefined {
  try {
    // URL keeps IPv6 literals in brackets.
    return new URL(url).hostname.replace(/^\[(.*)\]$/, "$1").toLowerCase() || undefined;
  } catch {
    return undefined;
  }
}

/** The addresses the platform's resolver gives `host`; none when it fails or is slow. */
async function resolve(host: string): Promise<string[]> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const dns = await import("node:dns");
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("resolver timed out")), PREVIEW_RESOLVE_TIMEOUT_MS);
    });
    const found = await Promise.race([dns.promises.lookup(host, { all: true }), timeout]);
    return found.map((a) => a.address);
  } catch {
    return [];
  } finally {
    clearTimeout(timer);
  }
}

function isLoopback(host: string | undefined): boolean {
  if (host === undefined) return false;
  if (host === "localhost" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)) return true;
  if (!host.includes(":")) return false;
  try {
    // The URL parser writes IPv6 canonically: ::1 in any spelling, ::ffff:127.x.y.z as 7fxx.
    // The resolver gives link-local addresses with their zone (fe80::1%eth0): not loopback.
    const canonical = new URL(`http://[${host}]/`).hostname;
    return canonical === "[::1]" || canonical.startsWith("[::ffff:7f");
  } catch {
    return false;
  }
}
