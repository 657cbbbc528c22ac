#!/usr/bin/env python3
"""Measures commands the same way whatever they talk to, for bench/compare.sh.

  measure.py run N [--setup SH] -- CMD...         time N runs of CMD (latency)
  measure.py rate N BYTES [--setup SH] -- CMD...  time N runs of CMD moving BYTES (throughput)
  measure.py keys N -- CMD...                     keystroke echo through a local terminal
  measure.py swerex N PORT TOKEN                  SWE-ReX `execute` of `true` (needs swe-rex)
  measure.py table RESULTS BENCH_JSON             the side-by-side table

Each measurement prints one JSON object on stdout. `keys` runs CMD on a new local PTY (as a
user's terminal), waits until CMD puts it in raw mode (ssh -tt and tether exec -t -i do), then
types one byte at a time and times its echo, which comes from the far end's PTY. Keys
alternate a letter and an erase (DEL: echoed as backspace-space-backspace) so the remote line
never grows. `--setup` runs a shell command before each run, untimed.
"""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

WARMUP = 3          # untimed runs before `run` and `rate` start timing
KEY_WARMUP = 10     # untimed keystrokes
KEYS = [(b"a", 1), (b"\x7f", 3)]
READY_TIMEOUT = 30  # seconds for CMD to take the terminal and echo a first key


def latency(samples_ns):
    s = sorted(samples_ns)
    n = len(s)
    p99 = s[min(n, max(1, -(-n * 99 // 100))) - 1]
    return {"median_us": s[(n - 1) // 2] / 1e3, "p99_us": p99 / 1e3,
            "worst_us": s[-1] / 1e3, "samples": n}


def split_args(args):
    """(options before `--`, command after it)."""
    if "--" not in args:
        sys.exit("measure.py: put the command after --")
    i = args.index("--")
    return args[:i], args[i + 1:]


def timed_runs(n, opts, cmd):
    setup = None
    if opts and opts[0] == "--setup":
        setup = opts[1]
    times = []
    for i in range(n + WARMUP):
        if setup:
            subprocess.run(setup, shell=True, check=True)
        start = time.perf_counter_ns()
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        took = time.perf_counter_ns() - start
        if done.returncode != 0:
            sys.exit(f"measure.py: {' '.join(cmd)} exited with {done.returncode}")
        if i >= WARMUP:
            times.append(took)
    return times


def cmd_run(args):
    n = int(args[0])
    opts, cmd = split_args(args[1:])
    print(json.dumps(latency(timed_runs(n, opts, cmd))))


def cmd_rate(args):
    n, size = int(args[0]), int(args[1])
    opts, cmd = split_args(args[2:])
    # Throughput runs are long: one warm-up is enough.
    global WARMUP
    WARMUP = 1
    rates = sorted(size / (t / 1e9) for t in timed_runs(n, opts, cmd))
    print(json.dumps({"median_bytes_per_s": rates[len(rates) // 2],
                      "worst_bytes_per_s": rates[0], "bytes": size, "runs": n}))


def read_exactly(fd, want, timeout):
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < want:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no echo within {timeout} s (got {got!r})")
        got += os.read(fd, 64)
    return got


def cmd_keys(args):
    n = int(args[0])
    _, cmd = split_args(args[1:])
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        # The local terminal echoes by itself until the client makes it raw.
        while termios.tcgetattr(fd)[3] & termios.ECHO:
            if time.monotonic() > deadline:
                sys.exit(f"measure.py: {' '.join(cmd)} never put the terminal in raw mode")
            time.sleep(0.001)
        samples = []
        for i in range(n + KEY_WARMUP):
            key, echo = KEYS[i % 2]
            start = time.perf_counter_ns()
            os.write(fd, key)
            read_exactly(fd, echo, READY_TIMEOUT if i < 2 else 5)
            took = time.perf_counter_ns() - start
            if i >= KEY_WARMUP:
                samples.append(took)
        print(json.dumps(latency(samples)))
        os.write(fd, b"\x04")  # Ctrl-D on the (now empty) remote line: cat exits
    finally:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            try:
                select.select([fd], [], [], 0.05) and os.read(fd, 4096)
            except OSError:
                pass
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def cmd_swerex(args):
    import asyncio
    from swerex.runtime.abstract import Command
    from swerex.runtime.remote import RemoteRuntime

    n, port, token = int(args[0]), int(args[1]), args[2]

    async def main():
        runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token,
                                timeout=30)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                if (await runtime.is_alive()).is_alive:
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                sys.exit("measure.py: swerex-remote did not come up")
            await asyncio.sleep(0.05)
        samples = []
        for i in range(n + WARMUP):
            start = time.perf_counter_ns()
            r = await runtime.execute(Command(command=["true"]))
            took = time.perf_counter_ns() - start
            if r.exit_code != 0:
                sys.exit(f"measure.py: SWE-ReX ran `true` with exit code {r.exit_code}")
            if i >= WARMUP:
                samples.append(took)
        return samples

    print(json.dumps(latency(asyncio.run(main()))))


# The side-by-side: (row label, tether result, ssh result). Results are
# ("m", key) for a measure.py result and ("b", key) for a figure of `tether bench --json`.
ROWS = [
    ("exec `true`, new client process", ("m", "exec_cli"), ("m", "ssh_true")),
    ("exec `true`, warm connection (tether: library)", ("b", "exec_warm"), ("m", "ssh_true")),
    ("exec `true`, warm: library | SWE-ReX execute", ("b", "exec_warm"), ("m", "swerex_exec")),
    ("keystroke echo, local terminal", ("m", "keys_cli"), ("m", "ssh_keys")),
    ("keystroke echo (tether: library)", ("b", "keystroke"), ("m", "ssh_keys")),
    ("stdout, piped to /dev/null", ("m", "stdout_cli"), ("m", "ssh_stdout")),
    ("stdout, piped (tether: library)", ("b", "stdout_piped"), ("m", "ssh_stdout")),
    ("download: exec cat | ssh cat", ("m", "down_cat"), ("m", "ssh_down_cat")),
    ("download: tether cp | scp", ("m", "down_cp"), ("m", "scp_down")),
    ("download (tether: library)", ("b", "download"), ("m", "ssh_down_cat")),
    ("upload: exec -i cat | ssh cat", ("m", "up_cat"), ("m", "ssh_up_cat")),
    ("upload: tether cp | scp", ("m", "up_cp"), ("m", "scp_up")),
    ("upload (tether: library)", ("b", "upload"), ("m", "ssh_up_cat")),
]


def fmt(r):
    if r is None:
        return "n/a", None, None
    if "median_us" in r:
        m = r["median_us"] / 1e3
        return f"{m:.3f} ms  p99 {r['p99_us'] / 1e3:.3f} ms", m, "latency"
    m = r["median_bytes_per_s"]
    unit = f"{m / 1e9:.2f} GB/s" if m >= 1e9 else f"{m / 1e6:.0f} MB/s"
    return f"{unit}  worst {r['worst_bytes_per_s'] / 1e6:.0f} MB/s", m, "rate"


def cmd_table(args):
    measured = {}
    with open(args[0]) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                measured[r.pop("key")] = r
    try:
        with open(args[1]) as f:
            report = json.load(f)
        bench = {fig["key"]: fig for fig in report["figures"]}
        floors = report["floors"]
    except (OSError, ValueError, KeyError):
        bench, floors = {}, []  # `tether bench` failed: its rows show n/a

    def find(ref):
        source, key = ref
        r = measured.get(key) if source == "m" else bench.get(key)
        return None if r is None or r.get("kind") == "failed" else r

    print(f"{'':48}{'tether':<34}{'OpenSSH (or as named)':<34}tether vs peer")
    for label, t_ref, s_ref in ROWS:
        t_text, t, kind = fmt(find(t_ref))
        s_text, s, _ = fmt(find(s_ref))
        verdict = ""
        if t and s:
            if kind == "latency":
                verdict = f"{s / t:.2f}× as fast" if t <= s else f"{t / s:.2f}× as slow"
            else:
                verdict = f"{t / s:.2f}× the throughput"
        print(f"{label:<48}{t_text:<34}{s_text:<34}{verdict}")
    if floors:
        print("\nfloors in the same run (tether bench):")
        for floor in floors:
            text, _, _ = fmt(None if floor.get("kind") == "failed" else floor)
            print(f"  {floor['name']:<46}{text}")
    direct = [fig for fig in bench.values() if fig.get("direct")]
    if direct:
        print("\nthrough the relay vs straight to the agent (tether bench --direct):")
        for fig in direct:
            d = fig["direct"]
            relayed_text, relayed, kind = fmt(None if fig.get("kind") == "failed" else fig)
            direct_text, straight, _ = fmt(None if d.get("kind") == "failed" else d)
            cost = ""
            if relayed and straight:
                if kind == "latency":
                    cost = f"+{(relayed - straight) * 1e3:.0f} µs"
                else:
                    cost = f"{relayed / straight:.0%} of direct"
            print(f"  {fig['name']:<46}{relayed_text:<34}{direct_text:<34}{cost}")


if __name__ == "__main__":
    commands = {"run": cmd_run, "rate": cmd_rate, "keys": cmd_keys, "swerex": cmd_swerex,
                "table": cmd_table}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](sys.argv[2:])
