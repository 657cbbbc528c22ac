"""Tether's deepagents backend against deepagents' generic ``BaseSandbox`` path, side by side.

Both run on the same sandbox over the same connection: the generic path is deepagents' own
``BaseSandbox`` with only ``execute``/``upload_files``/``download_files`` provided (by Tether),
so its ``read`` and ``edit`` are ``python3 -c`` scripts run through ``execute``; Tether's
backend does each with one native file operation. Prints, per operation, the median, p99 and
total wall time of N calls.

    python bench/deepagents_backend.py [--calls 100] [--image oci:PATH]

Uses ``TETHER_RELAY`` / ``TETHER_TOKEN`` (or the local relay's defaults) and the default
local sandbox (which has python3, as the generic path needs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from tether_sandbox import Sandbox
from tether_sandbox.integrations.deepagents import TetherSandbox


class GenericPath(BaseSandbox):
    """deepagents' generic path: BaseSandbox's scripts over Tether's execute."""

    def __init__(self, inner: TetherSandbox) -> None:
        self._inner = inner

    @property
    def id(self) -> str:
        return self._inner.id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self._inner.execute(command, timeout=timeout)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self._inner.upload_files(files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self._inner.download_files(paths)


def timed(calls: int, fn: Callable[[int], Any]) -> list[float]:
    out = []
    for i in range(calls + 1):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out[1:]  # the first call warms up and is not counted


def row(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"{name:<10} median {statistics.median(ordered) * 1000:7.2f} ms"
        f"   p99 {p99 * 1000:7.2f} ms   total {sum(ordered):6.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--image", default=None, help="an image with python3 (default: local)")
    args = parser.parse_args()

    with Sandbox.create(image=args.image, labels={"bench": "deepagents"}, ttl=900) as sb:
        try:
            tether = TetherSandbox(sb)
            generic = GenericPath(tether)
            text = "".join(f"line {i}: value v0\n" for i in range(200))
            sb.files.write("/workspace/bench.txt", text)
            print(f"{args.calls} calls each, sandbox {sb.id}, file of 200 lines")
            for label, backend in (("tether", tether), ("generic", generic)):

                def read(_: int, b: BaseSandbox = backend) -> None:
                    r = b.read("/workspace/bench.txt")
                    assert r.error is None and r.file_data is not None, r.error

                def edit(i: int, b: BaseSandbox = backend) -> None:
                    old, new = ("line 7: value v0", "line 7: value v1")[:: -1 if i % 2 else 1]
                    r = b.edit("/workspace/bench.txt", old, new)
                    assert r.error is None, r.error

                def echo(_: int, b: BaseSandbox = backend) -> None:
                    assert b.execute("echo hi").output == "hi\n"

                sb.files.write("/workspace/bench.txt", text)
                print(f"\n{label} ({type(backend).__name__})")
                print(row("execute", timed(args.calls, echo)))
                print(row("read", timed(args.calls, read)))
                print(row("edit", timed(args.calls, edit)))
        finally:
            sb.delete()


if __name__ == "__main__":
    main()
