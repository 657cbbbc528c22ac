"""``AsyncSandbox``: one sandbox on a relay. Its lifecycle (create, get-or-create, connect,
list, renew, pause, resume, delete) goes over REST; everything inside it goes over one
WebSocket, opened lazily and re-opened after a drop.

Pause and the one WebSocket: the relay resumes a paused sandbox when a new session opens
(unless it was created with ``auto_resume=False``), but a session opened before the pause
stays open and is no resume trigger (its streams must live through the pause). So a sandbox
this object paused, or found paused, is resumed by the object itself before its next call
reaches the sandbox: :meth:`AsyncSandbox._connection` is the one place every call passes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from ._code import AsyncCodeSession, run_code_fields
from ._commands import AsyncCommands
from ._constants import INITIAL_WINDOW
from ._files import AsyncFiles
from ._ports import AsyncPorts
from ._protocol import Connection, Message, Stream, expect_reply
from ._pty import AsyncPty
from ._relay import AsyncRelayClient, RelayConfig
from ._templates import template_image
from .errors import Conflict, ProtocolError, SandboxPaused, paused
from .types import AgentInfo, CommandResult, IdleAction, NetworkMode, SandboxInfo, Secret

Language = Literal["python", "node", "bash"]


def egress_fields(
    network: NetworkMode | None,
    allow_hosts: Sequence[str] | None,
    allow_cidrs: Sequence[str] | None,
    secrets: Sequence[Secret] | None,
) -> dict[str, Any]:
    """The create body's ``network``, ``egress`` and ``secrets``. An allowlist (or a secret)
    implies ``network="allowlist"``; any other mode with one is refused here."""
    for name, given in (("allow_hosts", allow_hosts), ("allow_cidrs", allow_cidrs)):
        if isinstance(given, str):
            raise TypeError(f"{name} takes a list of strings, not one string")
    body: dict[str, Any] = {}
    fenced = bool(allow_hosts or allow_cidrs or secrets)
    if fenced and network not in (None, "allowlist"):
        raise ValueError(
            f'allow_hosts, allow_cidrs and secrets need network="allowlist", not {network!r}'
        )
    mode = "allowlist" if fenced else network
    if mode is not None:
        body["network"] = mode
    egress: dict[str, list[str]] = {}
    if allow_hosts:
        egress["allow_hosts"] = list(allow_hosts)
    if allow_cidrs:
        egress["allow_cidrs"] = list(allow_cidrs)
    if egress:
        body["egress"] = egress
    if secrets:
        body["secrets"] = [s.to_json() for s in secrets]
    return body


class AsyncSandbox:
    """A sandbox, driven with ``async`` calls. Make one with :meth:`create`,
    :meth:`get_or_create` or :meth:`connect`; use it as an ``async with`` block to close the
    connection at the end (:meth:`delete` removes the sandbox itself).

    - ``sandbox.commands``: processes (:class:`AsyncCommands`)
    - ``sandbox.files``: the file system (:class:`AsyncFiles`)
    - ``sandbox.pty``: terminals (:class:`AsyncPty`)
    - ``sandbox.ports``: preview URLs and local forwards (:class:`AsyncPorts`)
    - :meth:`run_code` and :meth:`code_session`: code in python, node or bash
    - :meth:`pause` and :meth:`resume`: freeze every process in it, memory kept, and go on
    """

    def __init__(self, info: SandboxInfo, relay: AsyncRelayClient) -> None:
        self.info = info
        self._relay = relay
        self._conn: Connection | None = None
        self._conn_lock = asyncio.Lock()
        # Set by pause() (or a pause() that found it paused): the next call resumes it first,
        # since this object's open session would not.
        self._known_paused = False
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)
        self.ports = AsyncPorts(self)

    @property
    def id(self) -> str:
        """The relay's id of the sandbox, e.g. ``sb-3f9a2c``."""
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, relay={self._relay.config.url!r})"

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        image: str | None = None,
        template: str | None = None,
        provider: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        ttl: float | None = None,
        idle_timeout: float | None = None,
        cpus: float | None = None,
        memory_bytes: int | None = None,
        pids: int | None = None,
        disk_bytes: int | None = None,
        network: NetworkMode | None = None,
        allow_hosts: Sequence[str] | None = None,
        allow_cidrs: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        seccomp_unconfined: bool = False,
        on_idle: IdleAction | None = None,
        auto_resume: bool | None = None,
        get_or_create: bool = False,
        relay: str | None = None,
        token: str | None = None,
    ) -> AsyncSandbox:
        """Creates a sandbox. ``ttl`` and ``idle_timeout`` are seconds; the relay's policy
        fills in limits left out. With ``get_or_create``, returns the tenant's sandbox with
        exactly these ``labels`` if there is one (``info.created`` says which).

        ``allow_hosts`` (``api.openai.com``, ``*.pypi.org``, or a preset such as
        ``@package-registries``: PyPI, npm, Debian and crates.io), ``allow_cidrs``
        (``10.1.0.0/16``) and ``secrets`` (:class:`Secret`) make ``network`` ``"allowlist"``:
        the sandbox reaches only those; ``info.network`` says what enforces it, and lists a
        preset's hosts.

        ``template`` (``"base"``, ``"data-science"``) creates from a template instead of
        ``image``: on the local provider the one ``tether image build --template NAME`` built
        on this machine (:class:`TemplateNotBuilt` says how to build it when it is not), on a
        cloud provider the image built as ``tether-NAME``. Not the default: a template's user
        (``user``) cannot write ``/workspace``, where the framework adapters work.

        ``on_idle="pause"`` (or ``"stop"``) makes ``idle_timeout`` pause (or stop) the
        sandbox instead of deleting it (a provider that cannot refuses it with
        :class:`ProviderUnsupported`). ``auto_resume=False`` keeps a paused or stopped sandbox
        so until :meth:`resume` or :meth:`start`: reaching it raises :class:`SandboxPaused`
        instead of waking it (by default, a new session or a preview request wakes it)."""
        if template is not None and image is not None:
            raise ValueError("give image or template, not both")
        if template is not None:
            image = template_image(template, provider)
        body: dict[str, Any] = egress_fields(network, allow_hosts, allow_cidrs, secrets)
        for name, value in (
            ("image", image),
            ("provider", provider),
            ("ttl", ttl),
            ("idle_timeout", idle_timeout),
            ("cpus", cpus),
            ("memory_bytes", memory_bytes),
            ("pids", pids),
            ("disk_bytes", disk_bytes),
        ):
            if value is not None:
                body[name] = value
        if labels:
            body["labels"] = dict(labels)
        if env:
            body["env"] = dict(env)
        if seccomp_unconfined:
            body["seccomp_unconfined"] = True
        if on_idle is not None:
            body["on_idle"] = on_idle
        if auto_resume is not None:
            body["auto_resume"] = auto_resume
        if get_or_create:
            if not labels:
                raise ValueError("get_or_create needs labels to find the sandbox by")
            body["get_or_create"] = True
        client = AsyncRelayClient(RelayConfig.resolve(relay, token))
        try:
            info = await client.create(body)
        except BaseException:
            await client.aclose()
            raise
        return cls(info, client)

    @classmethod
    async def get_or_create(cls, labels: Mapping[str, str], **kwargs: Any) -> AsyncSandbox:
        """The tenant's sandbox with exactly ``labels`` (e.g. ``{"thread": thread_id}``),
        created with ``kwargs`` if there is none."""
        return await cls.create(labels=labels, get_or_create=True, **kwargs)

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, relay: str | None = None, token: str | None = None
    ) -> AsyncSandbox:
        """An existing sandbox by id. Raises :class:`SandboxNotFound` or
        :class:`SandboxGone`. A paused one stays paused until the first call that reaches it,
        which resumes it (or, created with ``auto_resume=False``, raises
        :class:`SandboxPaused` until :meth:`resume`)."""
        client = AsyncRelayClient(RelayConfig.resolve(relay, token))
        try:
            info = await client.get(sandbox_id)
        except BaseException:
            await client.aclose()
            raise
        return cls(info, client)

    @staticmethod
    async def list(
        *,
        labels: Mapping[str, str] | None = None,
        relay: str | None = None,
        token: str | None = None,
    ) -> list[SandboxInfo]:
        """The tenant's sandboxes, those with all of ``labels`` if given."""
        client = AsyncRelayClient(RelayConfig.resolve(relay, token))
        try:
            return await client.list(dict(labels) if labels else None)
        finally:
            await client.aclose()

    async def refresh(self) -> SandboxInfo:
        """Re-reads the sandbox's state from the relay."""
        self.info = await self._relay.get(self.id)
        return self.info

    async def renew(self, ttl: float) -> SandboxInfo:
        """Sets the TTL to ``ttl`` seconds from now."""
        self.info = await self._relay.renew(self.id, max(1, round(ttl)))
        return self.info

    async def pause(self) -> SandboxInfo:
        """Pauses the sandbox: every process in it stops where it is, its memory kept, and
        nothing it runs uses CPU until it resumes. Streams already attached (a command's
        output, a PTY) stay open and lose nothing: their output goes on after the resume.

        The next call that reaches the sandbox through this object (a command, a file)
        resumes it first, unless it was created with ``auto_resume=False``: then such calls
        raise :class:`SandboxPaused` until :meth:`resume`. Raises :class:`SandboxPaused` if it
        is paused already, :class:`ProviderUnsupported` if its provider cannot pause."""
        try:
            self.info = await self._relay.pause(self.id)
        except Conflict as exc:
            # Paused by someone else: this object's session would not wake it either.
            self._known_paused = True
            raise paused(exc) from None
        self._known_paused = True
        return self.info

    async def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox where it was. Raises :class:`Conflict` if it is not
        paused."""
        try:
            self.info = await self._relay.resume(self.id)
        except Conflict:
            self._known_paused = False  # it runs already: nothing for the next call to wake
            raise
        self._known_paused = False
        return self.info

    async def stop(self) -> SandboxInfo:
        """Stops the sandbox: every process in it ends (its agent too, so this object's
        connection closes), its files are kept. The next call that reaches it starts it again
        with its files as they were, unless it was created with ``auto_resume=False``: then
        such calls raise :class:`SandboxPaused` until :meth:`start`. Raises :class:`Conflict`
        if it is stopped already, :class:`ProviderUnsupported` if its provider cannot stop."""
        await self.close()
        self.info = await self._relay.stop(self.id)
        self._known_paused = False
        return self.info

    async def start(self) -> SandboxInfo:
        """Starts a stopped sandbox again, its files as they were and no process from
        before. Raises :class:`Conflict` if it is not stopped."""
        self.info = await self._relay.start(self.id)
        return self.info

    async def delete(self) -> None:
        """Deletes the sandbox and everything in it, and closes this client."""
        await self.close()
        try:
            await self._relay.delete(self.id)
        finally:
            await self._relay.aclose()

    kill = delete
    """E2B's name for :meth:`delete`."""

    async def close(self) -> None:
        """Closes the connection to the sandbox (background processes keep running)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def aclose(self) -> None:
        """Closes the connection and the relay client; the sandbox keeps running."""
        await self.close()
        await self._relay.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- the connection ----------------------------------------------------------------------

    async def _connection(self) -> Connection:
        async with self._conn_lock:
            if self._known_paused:
                await self._wake()
            if self._conn is None or self._conn.closed:
                try:
                    self._conn = await self._relay.connect(self.id)
                except Conflict as exc:
                    # The relay refuses a session only to a sandbox paused without auto-resume.
                    raise paused(exc) from None
            return self._conn

    async def _wake(self) -> None:
        """Resumes the sandbox this object knows paused, as a new session would: unless it
        was created without auto-resume, and is still paused."""
        if not self.info.auto_resume:
            self.info = await self._relay.get(self.id)
            if self.info.state == "paused":
                raise SandboxPaused(
                    f"sandbox {self.id} is paused, and was created with auto_resume=False: "
                    "call resume() first",
                    status=409,
                    code="conflict",
                )
        else:
            try:
                self.info = await self._relay.resume(self.id)
            except Conflict:
                pass  # another client resumed it first, which is as good
        self._known_paused = False

    async def _open(self, op: str, fields: Message, *, window: int = INITIAL_WINDOW) -> Stream:
        """Opens a stream for ``op`` on the live connection (reconnecting if it dropped)."""
        conn = await self._connection()
        return await conn.open_stream(op, fields, window=window)

    async def capabilities(self) -> frozenset[str]:
        """What the sandbox's agent announced it supports."""
        return (await self._connection()).capabilities

    async def agent_info(self) -> AgentInfo:
        """Facts about the agent and the machine it runs on."""
        reply = await expect_reply(await self._open("info", {}), "info")
        try:
            return AgentInfo(
                agent_version=str(reply["agent_version"]),
                os=str(reply["os"]),
                arch=str(reply["arch"]),
                user=str(reply["user"]),
                home=str(reply["home"]),
                cwd=str(reply["cwd"]),
                hostname=str(reply["hostname"]),
                cpus=int(reply["cpus"]),
                memory_bytes=int(reply["memory_bytes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"the info reply is malformed: {exc}") from None

    # --- code --------------------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        language: Language = "python",
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Runs ``code`` once in a fresh ``python3``, ``node`` or ``bash`` (no state kept
        between calls; see :meth:`code_session` for that)."""
        argv = run_code_fields(language)
        return await self.commands.run(argv, stdin=code, env=env, cwd=cwd, timeout=timeout)

    async def code_session(
        self,
        *,
        python: str = "python3",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncCodeSession:
        """Starts a stateful Python session (variables persist between runs, like a notebook)."""
        return await AsyncCodeSession.start(self, python=python, env=env, cwd=cwd)
