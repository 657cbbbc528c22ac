"""Fetching a preview URL as users' programs do: with httpx (redirects not followed: a program
must get the page itself, not a browser's cookie-and-redirect), requests, urllib and curl, each
given the URL exactly as the SDK returned it. Shared by the core and the adapters' tests.

No assertion message quotes the URL: it carries the sandbox's preview token."""

from __future__ import annotations

import subprocess
import urllib.request

import httpx
import requests

TIMEOUT_S = 30.0  # seconds for one fetch


def fetch(url: str) -> str:
    """The body that every client gets from ``url``; fails unless each gets a 200 and the same
    body."""
    bodies: dict[str, str] = {}
    r = httpx.get(url, timeout=TIMEOUT_S)
    assert r.status_code == 200, f"httpx got {r.status_code}"
    bodies["httpx"] = r.text
    rq = requests.get(url, timeout=TIMEOUT_S, allow_redirects=False)
    assert rq.status_code == 200, f"requests got {rq.status_code}"
    bodies["requests"] = rq.text
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        assert answer.status == 200, f"urllib got {answer.status}"
        bodies["urllib"] = answer.read().decode()
    curl = subprocess.run(
        ["curl", "-sS", "--fail", "--max-time", str(int(TIMEOUT_S)), url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert curl.returncode == 0, f"curl exited {curl.returncode}: {curl.stderr}"
    bodies["curl"] = curl.stdout
    assert len(set(bodies.values())) == 1, bodies
    return bodies["httpx"]
