"""``SandboxManager``: several Tether sandboxes at once, for Agno's toolkit (create, connect,
get, list, shut down one or all), as the multi-sandbox manager of Agno's E2B toolkit."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ... import errors
from ..._sync import CodeSession, Sandbox
from ...types import CodeResult

DEFAULT_TTL_S = 360  # as the seed's SandboxManager(default_timeout=360)
MAX_TTL_S = 3600  # the seed's advice: never more than an hour


@dataclass
class SandboxSlot:
    """A managed sandbox and what the manager knows of it."""

    sandbox_id: str
    sandbox: Sandbox
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    code: CodeSession | None = None
    last_result: CodeResult | None = None


class SandboxManager:
    """Lifecycle of several Tether sandboxes: create, connect, get, list, shut down.

    ``default_timeout`` is a new sandbox's TTL in seconds; ``relay``/``token`` default to
    ``TETHER_RELAY``/``TETHER_TOKEN``; other keyword arguments (``image``, ``memory_bytes``,
    ``network``...) go to every :meth:`Sandbox.create`.

    ``api_key`` is accepted so that the E2B toolkit's ``SandboxManager(api_key=None,
    default_timeout=360)`` runs unchanged, and ignored: an E2B key means nothing to a Tether
    relay, and sending it as the relay's token would only replace a working token (from
    ``token=``, ``TETHER_TOKEN`` or the local relay's admin token file) with a wrong one.
    """

    def __init__(
        self,
        api_key: str | None = None,
        default_timeout: int = DEFAULT_TTL_S,
        *,
        relay: str | None = None,
        token: str | None = None,
        **create_options: Any,
    ) -> None:
        del api_key  # see the class's docstring: E2B's key, not Tether's token
        self._auth: dict[str, Any] = {"relay": relay, "token": token}
        self.default_timeout = default_timeout
        self._options = create_options
        self._slots: dict[str, SandboxSlot] = {}
        self._default: str | None = None
        self._lock = threading.Lock()

    def create(
        self, timeout: int | None = None, metadata: Mapping[str, str] | None = None
    ) -> SandboxSlot:
        """Creates a sandbox (``timeout``: its TTL in seconds); the first one is the default."""
        ttl = min(int(timeout or self.default_timeout), MAX_TTL_S)
        labels = {str(k): str(v) for k, v in (metadata or {}).items()}
        sb = Sandbox.create(ttl=ttl, labels=labels, **self._options, **self._auth)
        return self._adopt(SandboxSlot(sb.id, sb, labels))

    def connect(self, sandbox_id: str) -> SandboxSlot:
        """Manages an existing sandbox."""
        with self._lock:
            if sandbox_id in self._slots:
                return self._slots[sandbox_id]
        sb = Sandbox.connect(sandbox_id, **self._auth)
        return self._adopt(SandboxSlot(sb.id, sb, dict(sb.info.labels)))

    def _adopt(self, slot: SandboxSlot) -> SandboxSlot:
        with self._lock:
            self._slots[slot.sandbox_id] = slot
            if self._default is None:
                self._default = slot.sandbox_id
        return slot

    def set_default(self, sandbox_id: str) -> None:
        with self._lock:
            if sandbox_id not in self._slots:
                raise KeyError(f"sandbox {sandbox_id} is not managed; connect to it first")
            self._default = sandbox_id

    def get_slot(self, sandbox_id: str | None = None) -> SandboxSlot:
        """The managed sandbox ``sandbox_id``, or the default one."""
        with self._lock:
            key = sandbox_id or self._default
            if key is None:
                raise LookupError("no sandbox yet: create one (create_sandbox) first")
            slot = self._slots.get(key)
        if slot is None:
            raise LookupError(f"sandbox {key} is not managed; connect to it or create one")
        return slot

    def slots(self) -> list[SandboxSlot]:
        with self._lock:
            return list(self._slots.values())

    def list_account_sandboxes(self) -> list[dict[str, Any]]:
        """Every sandbox the token can see on the relay, managed or not."""
        return [
            {
                "sandbox_id": info.id,
                "started_at": info.created_ms / 1000,
                "state": info.state,
                "metadata": info.labels,
                "managed": info.id in self._slots,
            }
            for info in Sandbox.list(**self._auth)
        ]

    def shutdown(self, sandbox_id: str | None = None) -> dict[str, Any]:
        """Deletes the sandbox and stops managing it."""
        slot = self.get_slot(sandbox_id)
        with self._lock:
            self._slots.pop(slot.sandbox_id, None)
            if self._default == slot.sandbox_id:
                self._default = next(iter(self._slots), None)
        if slot.code is not None:
            try:
                slot.code.close()
            except errors.TetherError:
                pass
        try:
            slot.sandbox.delete()
        except (errors.SandboxNotFound, errors.SandboxGone):
            pass
        return {"status": "success", "sandbox_id": slot.sandbox_id}

    def shutdown_all(self) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for slot in self.slots():
            try:
                results[slot.sandbox_id] = self.shutdown(slot.sandbox_id)
            except errors.TetherError as exc:
                results[slot.sandbox_id] = {"status": "error", "message": str(exc)}
        return {"status": "success", "results": results}

    def force_shutdown_all(self) -> dict[str, Any]:
        """Deletes every sandbox the token can see, managed or not."""
        results: dict[str, Any] = self.shutdown_all()["results"]
        for info in Sandbox.list(**self._auth):
            try:
                Sandbox.connect(info.id, **self._auth).delete()
                results[info.id] = {"status": "success", "sandbox_id": info.id}
            except errors.TetherError as exc:
                results[info.id] = {"status": "error", "message": str(exc)}
        return {"status": "success", "results": results}
