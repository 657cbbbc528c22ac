"""Preview URLs: the relay's two forms of one preview, and which of them the SDK hands out.

The relay serves a port inside a sandbox by host name, ``http://PORT-ID.localhost:RELAYPORT/``
(each sandbox and port its own origin; an app's absolute links keep working), and by path,
``http://RELAY/preview/ID/PORT/`` (reached wherever the relay is; every sandbox shares the
relay's origin, and an app's absolute links escape the prefix). Both carry the sandbox's
preview token in the ``tether_preview_token`` query parameter: a program gets the page at once,
a browser gets a cookie and a redirect that drops the token from its address bar.

Which form :func:`fetchable` picks, and why it asks the resolver. Browsers and curl resolve
``*.localhost`` to loopback by themselves (RFC 6761), but httpx, requests, urllib and Node's
fetch ask the platform's resolver (``getaddrinfo``). On Linux, glibc answers ``*.localhost``
only when ``hosts:`` in /etc/nsswitch.conf names nss-myhostname or systemd-resolved, which
Debian's default ``files dns`` and most container images leave out; other platforms differ
again. A rule by platform would be wrong somewhere, so the SDK asks the same resolver those
clients will ask, about the very name, and takes the host form only when:

- the name resolves within :data:`PREVIEW_RESOLVE_TIMEOUT_S`;
- for a ``localhost`` name, every address is loopback (a DNS server that answers for
  ``.localhost``, as some wildcard resolvers do, would otherwise receive requests carrying the
  token), and the SDK itself reaches the relay at a loopback address (a loopback name reaches
  the relay only when the relay runs on this machine).

Otherwise it takes the path form, whose address is the one the SDK reached the relay at, so
every client that can reach the relay can fetch it. The choice is made for clients on the
machine that runs the SDK. Nothing here logs a URL: each carries the token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from ._constants import PREVIEW_RESOLVE_TIMEOUT_S, PREVIEW_TOKEN_PARAM


@dataclass(frozen=True)
class PreviewInfo:
    """The relay's answer to ``GET /v1/sandboxes/{id}/preview``."""

    token: str = field(repr=False)  # never in a repr, so never in a log line or traceback
    host_url: str
    """``http://{port}-ID.localhost:RELAYPORT/``."""
    path_url: str
    """``http://RELAY/preview/ID/{port}/``."""


def with_token(template: str, port: int, token: str) -> str:
    """The relay's URL template (``{port}`` in it) for ``port``, carrying ``token``."""
    url = template.replace("{port}", str(port))
    return f"{url}?{PREVIEW_TOKEN_PARAM}={quote(token, safe='')}"


async def fetchable(host_url: str, path_url: str) -> str:
    """``host_url`` when clients on this machine that use the platform's resolver can reach
    it (the rules in the module's doc), ``path_url`` otherwise."""
    host = urlsplit(host_url).hostname
    if not host:
        return path_url
    local = host == "localhost" or host.endswith(".localhost")
    if local and not _is_loopback(urlsplit(path_url).hostname):
        return path_url
    addresses = await _resolve(host)
    if not addresses:
        return path_url
    if local and not all(_is_loopback(a) for a in addresses):
        return path_url
    return host_url


async def _resolve(host: str) -> list[str]:
    """The addresses the platform's resolver gives ``host``; none when it fails or is slow."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), PREVIEW_RESOLVE_TIMEOUT_S
        )
    except (OSError, asyncio.TimeoutError, UnicodeError):
        return []
    return [str(info[4][0]) for info in infos]


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        # getaddrinfo gives IPv6 link-local addresses with their zone (fe80::1%eth0).
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
