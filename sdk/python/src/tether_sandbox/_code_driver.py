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
        return [], []
    images, charts = [], []
    for num in plt.get_fignums():
        fig = plt.figure(num)
        try:
            charts.append(_chart(fig))
        except Exception:  # a figure the extractor does not understand still has its PNG
            charts.append({"type": "unknown", "title": None, "elements": []})
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        images.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    plt.close("all")
    return images, charts


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if f == f and abs(f) != float("inf") else None


def _axes_chart(ax):
    # The data behind a matplotlib axes, in the shape of E2B's chart objects: line and
    # scatter charts as labelled point lists, bar charts as labelled values.
    chart = {
        "title": ax.get_title() or None,
        "x_label": ax.get_xlabel() or None,
        "y_label": ax.get_ylabel() or None,
    }
    bars = [c for c in ax.containers if type(c).__name__ == "BarContainer"]
    if bars:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        elements = []
        for c in bars:
            group = c.get_label() if not str(c.get_label()).startswith("_") else None
            for i, rect in enumerate(c.patches):
                x = rect.get_x() + rect.get_width() / 2
                label = ticks[i] if i < len(ticks) and ticks[i] else _num(x)
                elements.append({"label": label, "group": group, "value": _num(rect.get_height())})
        return {"type": "bar", **chart, "elements": elements}
    scatters = [c for c in ax.collections if type(c).__name__ == "PathCollection"]
    if scatters and not ax.get_lines():
        elements = [
            {
                "label": None if str(c.get_label()).startswith("_") else c.get_label(),
                "points": [[_num(x), _num(y)] for x, y in c.get_offsets()],
            }
            for c in scatters
        ]
        return {"type": "scatter", **chart, "elements": elements}
    lines = ax.get_lines()
    if lines:
        elements = []
        for line in lines:
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            label = line.get_label()
            elements.append(
                {
                    "label": None if str(label).startswith("_") else label,
                    "points": [[_num(xs[i]), _num(ys[i])] for i in range(min(len(xs), len(ys)))],
                }
            )
        return {"type": "line", **chart, "elements": elements}
    return {"type": "unknown", **chart, "elements": []}


def _chart(fig):
    axes = fig.get_axes()
    if len(axes) == 1:
        return _axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": [_axes_chart(a) for a in axes]}


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
        value, error, images, charts = None, None, [], []
        _running[0] = True
        try:
            value = _run(request["code"], namespace, request["id"])
        except BaseException as exc:
            error = _error(exc)
        finally:
            _running[0] = False
        try:
            images, charts = _figures()
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
            "charts": charts,
        }
        last_id, last_reply = request["id"], json.dumps(reply) + "\n"
        replies.write(last_reply)
        replies.flush()


if __name__ == "__main__":
    main()
