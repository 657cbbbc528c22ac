"""``TetherProvider``: Tether as a deepagents-code ``SandboxProvider``, registered under the
``deepagents_code.sandbox_providers`` entry point as ``tether``. It works without
``deepagents-code`` installed too (a plain class with the same methods).

Its methods are the provider contract of deepagents' sandbox-providers page: ``list(*,
cursor=None, **kwargs)`` → ``{"items": [{"sandbox_id", "metadata"}], "cursor"}``,
``get_or_create``, ``delete``, and their async twins ``alist``, ``aget_or_create``,
``adelete``."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from ... import errors
from ..._sync import Sandbox
from .backend import TetherSandbox

if TYPE_CHECKING:
    _ProviderBase = object
else:
    try:
        from deepagents_code.integrations.sandbox_provider import SandboxProvider as _ProviderBase
    except ImportError:  # deepagents-code is optional: the provider works on its own too
        _ProviderBase = object


def _provider_api() -> tuple[type[Exception], Any]:
    """deepagents-code's not-found error and metadata class, when it is installed."""
    try:
        from deepagents_code.integrations.sandbox_provider import (
            SandboxNotFoundError,
            SandboxProviderMetadata,
        )
    except ImportError:
        return errors.SandboxNotFound, None
    return SandboxNotFoundError, SandboxProviderMetadata


class TetherProvider(_ProviderBase):
    """Tether as a deepagents-code sandbox provider (entry point name ``tether``).

    Configured from arguments or the environment (``TETHER_RELAY``, ``TETHER_TOKEN``,
    ``TETHER_IMAGE``). ``get_or_create(sandbox_id=...)`` reconnects; ``get_or_create(
    thread_id=...)`` or ``labels=`` finds the sandbox with those labels or creates it (one
    sandbox per conversation); otherwise a new sandbox is created. Extra keyword arguments go
    to :meth:`Sandbox.create` (``image``, ``ttl``, ``env``, ``memory_bytes``...).
    """

    def __init__(
        self,
        *,
        relay: str | None = None,
        token: str | None = None,
        ttl: float | None = 3600,
        **create_kwargs: Any,
    ) -> None:
        self._relay, self._token = relay, token
        self._defaults: dict[str, Any] = {"ttl": ttl, **create_kwargs}
        if "image" not in self._defaults and os.environ.get("TETHER_IMAGE"):
            self._defaults["image"] = os.environ["TETHER_IMAGE"]

    @property
    def metadata(self) -> Any:
        metadata = _provider_api()[1]
        if metadata is None:
            return None
        return metadata(name="tether", working_dir="/workspace", supports_sandbox_id=True)

    def list(self, *, cursor: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The sandboxes this token can see, as deepagents' ``SandboxListResponse``:
        ``{"items": [{"sandbox_id", "metadata": {"state", "labels", "created_at",
        "expires_at", "provider", "image"}}], "cursor": None}``. ``labels=`` or
        ``thread_id=`` keep only the sandboxes with those labels (as ``get_or_create`` sets
        them). The relay answers with every sandbox at once, so there is never a next page:
        a ``cursor`` is accepted and the returned one is always ``None``."""
        labels = dict(kwargs.pop("labels", None) or {})
        thread_id = kwargs.pop("thread_id", None)
        if thread_id is not None:
            labels["thread_id"] = str(thread_id)
        infos = Sandbox.list(labels=labels or None, relay=self._relay, token=self._token)
        items = [
            {
                "sandbox_id": info.id,
                "metadata": {
                    "state": info.state,
                    "labels": dict(info.labels),
                    "created_at": info.created_ms / 1000,
                    "expires_at": None if info.expires_ms is None else info.expires_ms / 1000,
                    "provider": info.provider,
                    "image": info.image,
                },
            }
            for info in infos
        ]
        return {"items": items, "cursor": None}

    async def alist(self, *, cursor: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return await asyncio.to_thread(lambda: self.list(cursor=cursor, **kwargs))

    def get_or_create(self, *, sandbox_id: str | None = None, **kwargs: Any) -> TetherSandbox:
        auth = {"relay": self._relay, "token": self._token}
        if sandbox_id:
            try:
                return TetherSandbox(Sandbox.connect(sandbox_id, **auth))
            except (errors.SandboxNotFound, errors.SandboxGone) as exc:
                not_found = _provider_api()[0]
                raise not_found(f"no Tether sandbox {sandbox_id}: {exc}") from exc
        # deepagents-code passes these for other providers (a startup timeout, a script).
        kwargs.pop("setup_script_path", None)
        kwargs.pop("timeout", None)
        labels = dict(kwargs.pop("labels", None) or {})
        thread_id = kwargs.pop("thread_id", None)
        if thread_id is not None:
            labels["thread_id"] = str(thread_id)
        options = {**self._defaults, **kwargs, **auth}
        if labels:
            sb = Sandbox.get_or_create(labels, **options)
        else:
            sb = Sandbox.create(**options)
        return TetherSandbox(sb)

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        try:
            Sandbox.connect(sandbox_id, relay=self._relay, token=self._token).delete()
        except (errors.SandboxNotFound, errors.SandboxGone):
            pass  # deleting is idempotent

    async def aget_or_create(
        self, *, sandbox_id: str | None = None, **kwargs: Any
    ) -> TetherSandbox:
        return await asyncio.to_thread(lambda: self.get_or_create(sandbox_id=sandbox_id, **kwargs))

    async def adelete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        await asyncio.to_thread(lambda: self.delete(sandbox_id=sandbox_id, **kwargs))
