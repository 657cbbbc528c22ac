"""The stateful code session's driver: runs inside the sandbox under any Python 3.8+, with
the standard library only. The SDK uploads this file and starts it as a background process.

Protocol (one JSON object per line): requests ``{"id": N, "code": "..."}`` on stdin; replies
``{"id": N, "stdout", "stderr", "value", "error", "images"}`` on the original stdout. The
user's code gets /dev/null as stdin, and its stdout and stderr (its child processes' too) go
to temporary files that the driver reads back after each run, so nothing it prints can be
mistaken for a reply.
"""

import ast
import base64
import builtins
import io
import json
import linecache
import os
import signal
import sys
import tempfile
import traceback

os.environ.setdefault("MPLBACKEND", "Agg")
CELL = "<cell>"
_running = [False]


def _interrupt(signum, frame):
    # The SDK interrupts a cell that runs past its timeout with SIGINT; one that arrives
    # between cells must not kill the driver.
    if _running[0]:
        raise KeyboardInterrupt


def _capture_fd(fd):
    f = tempfile.TemporaryFile()
    os.dup2(f.fileno(), fd)
    return f


def _drain(f, fd):
    os.lseek(fd, 0, os.SEEK_SET)
    size = os.fstat(f.fileno()).st_size
    data = os.pread(f.fileno(), size, 0) if size else b""
    os.ftruncate(f.fileno(), 0)
    return data.decode("utf-8", "replace")


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    images = []
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png")
        images.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    plt.close("all")
    return images


def _run(code, namespace, number):
    # Each cell gets a file name of its own in linecache, so tracebacks show its lines.
    name = f"{CELL[:-1]}-{number}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    value = None
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        result = eval(compile(last, name, "eval"), namespace)
        if result is not None:
            namespace["_"] = result
            value = repr(result)
    return value


def _error(exc):
    tb = exc.__traceback__
    # Drop the driver's own frames: the user's traceback starts at their cell.
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL[:-1]):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    return {"name": type(exc).__name__, "value": str(exc), "traceback": lines}


def main():
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out_file, err_file = _capture_fd(1), _capture_fd(2)
    sys.stdin = open(0, closefd=False)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    signal.signal(signal.SIGINT, _interrupt)
    last_id, last_reply = 0, ""
    for line in requests:
        request = json.loads(line)
        # After a reconnect the SDK repeats the request it awaits: answer it again from
        # memory rather than run the cell twice.
        if request["id"] <= last_id:
            if request["id"] == last_id:
                replies.write(last_reply)
                replies.flush()
            continue
        value, error, images = None, None, []
        _running[0] = True
        try:
            value = _run(request["code"], namespace, request["id"])
        except BaseException as exc:
            error = _error(exc)
        finally:
            _running[0] = False
        try:
            images = _figures()
        except Exception as exc:
            error = error or _error(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        reply = {
            "id": request["id"],
            "stdout": _drain(out_file, 1),
            "stderr": _drain(err_file, 2),
            "value": value,
            "error": error,
            "images": images,
        }
        last_id, last_reply = request["id"], json.dumps(reply) + "\n"
        replies.write(last_reply)
        replies.flush()


if __name__ == "__main__":
    main()
