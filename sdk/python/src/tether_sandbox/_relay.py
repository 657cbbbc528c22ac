"""The relay's REST API (client/src/api.rs): where the relay is and which token to use, and
every call (create, get, list, delete, renew, pause, resume, preview) with retries and backoff
on 429 and 5xx. Also opens a sandbox's WebSocket with the same retries."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ._constants import (
    ADMIN_TOKEN_FILE,
    CLIENT_NAME,
    DEFAULT_RELAY,
    HTTP_TIMEOUT_S,
    RETRY_AFTER_MAX_S,
    RETRY_ATTEMPTS,
    RETRY_BASE_S,
    RETRY_MAX_S,
)
from ._preview import PreviewInfo
from ._protocol import Connection
from .errors import ProtocolError, RelayError, RelayUnreachable, relay_error
from .types import SandboxInfo


def default_data_dir() -> Path:
    """Where a local relay keeps its data (and admin token), as the CLI finds it."""
    if os.environ.get("TETHER_HOME"):
        return Path(os.environ["TETHER_HOME"])
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]) / "tether"
    return Path(os.environ.get("HOME") or "/root") / ".local/share/tether"


@dataclass(frozen=True)
class RelayConfig:
    """Where the relay is and the API token to use."""

    url: str
    token: str | None

    @classmethod
    def resolve(cls, relay: str | None, token: str | None) -> RelayConfig:
        """Arguments first, then ``TETHER_RELAY``/``TETHER_TOKEN``, then the local relay's
        address and admin token file, as the ``tether`` CLI does."""
        url = relay or os.environ.get("TETHER_RELAY") or DEFAULT_RELAY
        if "://" not in url:
            url = "http://" + url
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"relay URL {url!r} must start with http:// or https://")
        tok = token or os.environ.get("TETHER_TOKEN")
        if not tok:
            try:
                tok = (default_data_dir() / ADMIN_TOKEN_FILE).read_text().strip() or None
            except OSError:
                tok = None
        return cls(url, tok)

    def __repr__(self) -> str:  # never show the token
        return f"RelayConfig(url={self.url!r}, token={'***' if self.token else None})"


def _backoff(attempt: int, retry_after: str | None) -> float:
    if retry_after:
        try:
            return min(float(retry_after), RETRY_AFTER_MAX_S)
        except ValueError:
            pass
    delay: float = min(RETRY_BASE_S * (2**attempt), RETRY_MAX_S)
    return delay * (0.5 + random.random() / 2)


def _retryable(status: int, idempotent: bool = True) -> bool:
    # 500 is a bug in the relay and 501 a missing feature: retrying cannot help. 429 and 503
    # mean the relay did nothing; another 5xx may come after it acted, so a request that is
    # not idempotent (a pause: its retry would find the sandbox paused) is not sent again.
    if not idempotent:
        return status in (429, 503)
    return status == 429 or (status >= 502 and status <= 599)


class AsyncRelayClient:
    """One relay, as one API token's holder sees it."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        headers = {"User-Agent": CLIENT_NAME}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._http = httpx.AsyncClient(base_url=config.url, headers=headers, timeout=HTTP_TIMEOUT_S)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: list[tuple[str, str | int | float | bool | None]] | None = None,
        idempotent: bool = True,
    ) -> Any:
        for attempt in range(RETRY_ATTEMPTS):
            try:
                response = await self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                # Not retried: a relay that is not there should say so at once.
                raise RelayUnreachable(
                    f"cannot reach the relay at {self.config.url}: {exc or type(exc).__name__}; "
                    "start one with `tether serve`, or set TETHER_RELAY to its address"
                ) from None
            if response.status_code < 400:
                if response.status_code == 204 or not response.content:
                    return None
                return response.json()
            if _retryable(response.status_code, idempotent) and attempt + 1 < RETRY_ATTEMPTS:
                await asyncio.sleep(_backoff(attempt, response.headers.get("retry-after")))
                continue
            raise self._error(response)
        raise AssertionError("unreachable")

    def _error(self, response: httpx.Response) -> RelayError:
        code, message = "", ""
        try:
            body = response.json()
            code = str(body["error"]["code"])
            message = str(body["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        if response.status_code == 401 and not self.config.token:
            message = (
                "no API token: set TETHER_TOKEN (or pass token=) to a token from "
                "`tether token create`, or the relay's admin token"
            )
        return relay_error(
            response.status_code,
            code,
            message or f"the relay answered HTTP {response.status_code}",
        )

    async def create(self, body: dict[str, Any]) -> SandboxInfo:
        return SandboxInfo.from_json(await self._request("POST", "/v1/sandboxes", json=body))

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request("GET", f"/v1/sandboxes/{_seg(sandbox_id)}")
        )

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("label", f"{k}={v}") for k, v in (labels or {}).items()
        ]
        body = await self._request("GET", "/v1/sandboxes", params=params)
        items = body.get("sandboxes", body) if isinstance(body, dict) else body
        return [SandboxInfo.from_json(item) for item in items]

    async def delete(self, sandbox_id: str) -> None:
        await self._request("DELETE", f"/v1/sandboxes/{_seg(sandbox_id)}")

    async def renew(self, sandbox_id: str, ttl_secs: int) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request(
                "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/renew", json={"ttl_secs": ttl_secs}
            )
        )

    async def pause(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/pause", idempotent=False)
        )

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request(
                "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/resume", idempotent=False
            )
        )

    async def stop(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/stop", idempotent=False)
        )

    async def start(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.from_json(
            await self._request("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/start", idempotent=False)
        )

    async def preview(self, sandbox_id: str) -> PreviewInfo:
        body = await self._request("GET", f"/v1/sandboxes/{_seg(sandbox_id)}/preview")
        fields = ("token", "host_url", "path_url")
        if not isinstance(body, dict) or not all(isinstance(body.get(f), str) for f in fields):
            # Not the body itself in the message: it carries the token.
            raise ProtocolError("the relay's preview answer is malformed")
        return PreviewInfo(body["token"], body["host_url"], body["path_url"])

    async def connect(self, sandbox_id: str) -> Connection:
        """Opens the sandbox's WebSocket through the relay, retrying 502 and 503."""
        base = "ws" + self.config.url[len("http") :]
        url = f"{base}/v1/sandboxes/{_seg(sandbox_id)}/ws"
        for attempt in range(RETRY_ATTEMPTS):
            try:
                return await Connection.open(url, self.config.token, CLIENT_NAME)
            except RelayError as exc:
                if not _retryable(exc.status) or attempt + 1 == RETRY_ATTEMPTS:
                    raise
            await asyncio.sleep(_backoff(attempt, None))
        raise AssertionError("unreachable")


def _seg(value: str) -> str:
    return quote(value, safe="")
