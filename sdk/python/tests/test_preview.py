"""Preview URLs: the one the SDK returns by default is fetched by httpx, requests, urllib and
curl on this machine; the host form is returned only where the platform's resolver gives its
name loopback addresses; the token stays out of the SDK's logs."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from preview_clients import fetch
from tether_sandbox import AsyncSandbox, Sandbox

SERVER = (
    "mkdir -p /tmp/site && echo served-from-sandbox > /tmp/site/index.html && "
    "exec python3 -u -m http.server 8000 --bind 127.0.0.1 --directory /tmp/site"
)
BODY = "served-from-sandbox\n"


def _serve(sandbox: Sandbox) -> None:
    # Readiness: the server's own "Serving HTTP" line.
    h = sandbox.commands.start(SERVER, background=True, tag="web")
    for chunk in h:
        if b"Serving HTTP" in chunk.data:
            break
    h.detach()


def _token(url: str) -> str:
    return parse_qs(urlsplit(url).query)["tether_preview_token"][0]


def test_default_preview_url_is_fetched_by_every_client(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    _serve(sandbox)
    with caplog.at_level(logging.DEBUG):
        url = sandbox.ports.preview_url(8000)
        host_url, path_url = sandbox.ports.preview_urls(8000)
    assert url in (host_url, path_url)
    assert fetch(url) == BODY
    # Both forms stay available, and the path form is fetched by every client wherever the
    # relay is reachable.
    assert fetch(path_url) == BODY
    assert _token(url) not in caplog.text


async def test_async_preview_url_is_fetched_by_every_client(
    asandbox: AsyncSandbox, relay: object
) -> None:
    handle = await asandbox.commands.start(SERVER, background=True)
    async for chunk in handle:
        if b"Serving HTTP" in chunk.data:
            break
    await handle.detach()
    url = await asandbox.ports.preview_url(8000)
    assert await asyncio.to_thread(fetch, url) == BODY


def _resolver(answer: str) -> Callable[..., Any]:
    """getaddrinfo answering ``answer`` for every ``*.localhost`` name, as nss-myhostname
    (loopback) or a wildcard DNS server (anything) would; other names as the machine does."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".localhost"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, 0))]
        return real(host, *args, **kwargs)

    return getaddrinfo


def test_host_form_only_where_the_resolver_gives_loopback(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI's machines differ in whether they resolve *.localhost, so the resolver is stood in
    # for: the SDK asks getaddrinfo (socket.getaddrinfo, through the event loop).
    _serve(sandbox)
    host_url, path_url = sandbox.ports.preview_urls(8000)
    monkeypatch.setattr(socket, "getaddrinfo", _resolver("127.0.0.1"))
    assert sandbox.ports.preview_url(8000) == host_url
    # The host form works for what resolves *.localhost by itself (curl, as browsers do).
    curl = subprocess.run(
        ["curl", "-sS", "--fail", "--max-time", "30", host_url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert curl.returncode == 0 and curl.stdout == BODY, curl.stderr
    # A resolver that sends the name elsewhere must not get the token.
    monkeypatch.setattr(socket, "getaddrinfo", _resolver("203.0.113.7"))
    assert sandbox.ports.preview_url(8000) == path_url
