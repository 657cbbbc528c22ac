"""langchain-tests' ``SandboxIntegrationTests`` (the standard suite LangChain publishes for
deepagents sandbox backends), run unchanged against ``TetherSandbox`` on a local sandbox made
through the session's real relay.

Nine of its 86 tests are expected failures, each for a reason outside the adapter:

- Two run ``python -c ...``: a local sandbox sees the host's ``/usr``, and Debian's has
  ``python3`` but no ``python``. They are expected to fail only on a host whose ``/usr`` has
  no ``python`` (the suite's own check forbids marking them from inside the test); once this
  fixture creates issue 34's ``base`` template, which has ``python``, they XPASS and fail, so
  the marks are removed then.
- Seven assert a contract that the deepagents release we pin (0.7.32, ``pyproject.toml``'s
  ``deepagents>=0.7,<0.8``) reversed and that this backend follows, as deepagents' own
  ``BaseSandbox`` does: ``glob`` returns absolute paths of regular files only
  (``BackendProtocol.glob``: a relative path "silently bypasses every deny rule"), and
  ``write`` replaces an existing file (the ``write_file`` tool tells the model so).
  langchain-tests 1.1.9, the newest release, still asserts relative paths, directories and
  a refused overwrite. Strict, so a langchain-tests release that catches up shows as XPASS.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests import SandboxIntegrationTests

from tether_sandbox import Sandbox, TetherError
from tether_sandbox.integrations.deepagents import TetherSandbox

_SKEW = (
    "langchain-tests 1.1.9 expects {}; deepagents 0.7.32's protocol (which this backend and "
    "deepagents' own BaseSandbox follow) {}"
)
_GLOB_SKEW = pytest.mark.xfail(
    strict=True,
    reason=_SKEW.format(
        "glob paths relative to the search root, directories included",
        "returns absolute paths of regular files only, so deny rules apply",
    ),
)
_WRITE_SKEW = pytest.mark.xfail(
    strict=True,
    reason=_SKEW.format(
        "write to refuse an existing file", "replaces it, as its write_file tool says"
    ),
)
# A local sandbox sees the host's /usr under this PATH (its /bin and /sbin link into /usr).
LOCAL_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
_NO_PYTHON = pytest.mark.xfail(
    shutil.which("python", path=LOCAL_SANDBOX_PATH) is None,
    strict=True,
    reason="the sandbox has no `python` (the local sandbox sees the host's /usr, which has "
    "only python3); issue 34's `base` template provides it",
)


class TestTetherSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, relay: object) -> Iterator[SandboxBackendProtocol]:
        sb = Sandbox.create(labels={"test": "langchain-standard"}, ttl=600)
        try:
            yield TetherSandbox(sb)
        finally:
            try:
                sb.delete()
            except TetherError:
                pass

    @_NO_PYTHON
    def test_execute_large_stdout_payload(self, sandbox_backend: SandboxBackendProtocol) -> None:
        super().test_execute_large_stdout_payload(sandbox_backend)

    @_NO_PYTHON
    async def test_aexecute_large_stdout_payload(
        self, sandbox_backend: SandboxBackendProtocol
    ) -> None:
        await super().test_aexecute_large_stdout_payload(sandbox_backend)

    @_WRITE_SKEW
    def test_write_existing_file_fails(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_write_existing_file_fails(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob(self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str) -> None:
        super().test_glob(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob_basic_pattern(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_glob_basic_pattern(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob_with_directories(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_glob_with_directories(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob_hidden_files_explicitly(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_glob_hidden_files_explicitly(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob_with_character_class(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_glob_with_character_class(sandbox_backend, sandbox_test_root)

    @_GLOB_SKEW
    def test_glob_with_question_mark(
        self, sandbox_backend: SandboxBackendProtocol, sandbox_test_root: str
    ) -> None:
        super().test_glob_with_question_mark(sandbox_backend, sandbox_test_root)
