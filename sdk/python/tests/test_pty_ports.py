"""Terminals, listening ports, preview URLs and local forwards."""

from __future__ import annotations

import httpx

from tether_sandbox import AsyncSandbox, Sandbox

SERVER = (
    "mkdir -p /tmp/site && echo served-from-sandbox > /tmp/site/index.html && "
    "exec python3 -u -m http.server 8000 --bind 127.0.0.1 --directory /tmp/site"
)


def _wait_for_port(sandbox: Sandbox, port: int) -> None:
    # Readiness: the server's own "Serving HTTP" line on stderr.
    h = sandbox.commands.start(SERVER, background=True, tag="web")
    for chunk in h:
        if b"Serving HTTP" in chunk.data:
            break
    h.detach()
    assert port in [p.port for p in sandbox.ports.list()]


def test_pty_write_resize_read(sandbox: Sandbox) -> None:
    term = sandbox.pty.start(["sh"], cols=100, rows=30)
    term.write("stty size; tty >/dev/null && echo IS-A-$((1 + 1))-TTY\n")
    seen = bytearray()
    chunks = iter(term)
    while b"IS-A-2-TTY\r\n" not in seen:  # the output, not the echoed input
        seen += next(chunks).data
    assert b"30 100" in seen
    term.resize(120, 40)
    term.write("stty size; exit 7\n")
    result = term.wait()
    assert b"40 120" in result.stdout_bytes and result.exit_code == 7


def test_preview_url_and_local_forward(sandbox: Sandbox) -> None:
    _wait_for_port(sandbox, 8000)
    host_url, path_url = sandbox.ports.preview_urls(8000)
    assert "tether_preview_token=" in host_url and "tether_preview_token=" in path_url
    r = httpx.get(path_url, follow_redirects=True, timeout=30)
    assert r.status_code == 200 and r.text == "served-from-sandbox\n"
    with sandbox.ports.forward(8000) as fwd:
        for _ in range(3):  # each request is its own forwarded connection
            r = httpx.get(fwd.url + "/index.html", timeout=30)
            assert r.text == "served-from-sandbox\n"


async def test_async_pty(asandbox: AsyncSandbox) -> None:
    seen: list[bytes] = []
    term = await asandbox.pty.start(on_data=seen.append)
    await term.write("echo $((40 + 2)); exit\n")
    result = await term.wait()
    assert b"42" in b"".join(seen) and result.exit_code == 0
