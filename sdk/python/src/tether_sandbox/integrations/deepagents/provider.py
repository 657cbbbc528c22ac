"""``TetherProvider``: Tether as a deepagents-code ``SandboxProvider``, registered under the
``deepagents_code.sandbox_providers`` entry point as ``tether``. It works without
``deepagents-code`` installed too (a plain class with the same methods)."""

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
