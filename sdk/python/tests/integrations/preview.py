"""Fetching preview URLs from tests."""

from __future__ import annotations

import httpx


def fetch(url: str) -> httpx.Response:
    """GETs a preview URL. Browsers resolve ``*.localhost`` to loopback by themselves; this
    resolver may not, so the request goes to 127.0.0.1 with the URL's host name."""
    parsed = httpx.URL(url)
    if parsed.host.endswith(".localhost"):
        return httpx.get(
            parsed.copy_with(host="127.0.0.1"),
            headers={"Host": f"{parsed.host}:{parsed.port}" if parsed.port else parsed.host},
            follow_redirects=True,
            timeout=30,
        )
    return httpx.get(url, follow_redirects=True, timeout=30)
