"""Checks that the examples the READMEs show are the files examples/check runs.

A fenced code block preceded by a marker line

    <!-- example: examples/python/quickstart.py -->

must be byte for byte the named file (a path from the repository's root). With
``(excerpt)`` after the path, the block must be a run of consecutive lines of the file, its
common indentation removed (a few lines of a longer program, e.g. a Rust example that CI
compiles). A marker not followed by a fenced block, or naming a missing file, fails too.

    python3 examples/readme_examples.py FILE.md...   check these documents (exit 1 on a mismatch)
    python3 examples/readme_examples.py --write FILE.md...   copy each named file into its block
    python3 examples/readme_examples.py --self-test  check the checker on documents it must refuse

Standard library only: it runs with any python3, before any environment is set up.
"""

from __future__ import annotations

import re
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- example: (?P<path>\S+)(?P<excerpt> \(excerpt\))? -->$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)[\w+-]*$")


def blocks(document: str) -> list[tuple[int, str, bool, str | None]]:
    """Each marker in ``document``: its line number, the path it names, whether it is an
    excerpt, and the fenced block right after it (``None`` when there is none)."""
    lines = document.split("\n")
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        body = None
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence:
            close = fence["fence"]
            for j in range(i + 2, len(lines)):
                if lines[j] == close:
                    body = "\n".join(lines[i + 2 : j]) + "\n"
                    break
        found.append((i + 1, m["path"], m["excerpt"] is not None, body))
    return found


def is_excerpt(block: str, text: str) -> bool:
    """Whether ``block``'s lines are consecutive lines of ``text``, dedented."""
    want = block.rstrip("\n").split("\n")
    have = text.split("\n")
    for start in range(len(have) - len(want) + 1):
        run = "\n".join(have[start : start + len(want)])
        if textwrap.dedent(run).split("\n") == want:
            return True
    return False


def check(document: Path, root: Path = REPO) -> list[str]:
    """The problems of ``document``'s marked examples, as sentences; none when all match."""
    problems = []
    try:
        where = document.resolve().relative_to(root)
    except ValueError:
        where = document
    for line, path, excerpt, body in blocks(document.read_text()):
        at = f"{where}:{line}"
        target = root / path
        if body is None:
            problems.append(f"{at}: the marker for {path} is not followed by a fenced code block")
        elif not target.is_file():
            problems.append(f"{at}: {path} does not exist")
        elif excerpt and not is_excerpt(body, target.read_text()):
            problems.append(f"{at}: the block is not an excerpt of {path}: copy it from the file")
        elif not excerpt and body.encode() != target.read_bytes():
            problems.append(
                f"{at}: the block differs from {path}: copy the file into the README "
                f"(or the README's block into the file) so that they are the same"
            )
    return problems


def write(document: Path, root: Path = REPO) -> int:
    """Replaces each whole-file block of ``document`` with its file; returns how many changed.
    Excerpts are left alone (which lines to show is the writer's choice)."""
    lines = document.read_text().split("\n")
    changed = 0
    for line, path, excerpt, body in reversed(blocks("\n".join(lines))):
        target = root / path
        if excerpt or body is None or not target.is_file():
            continue
        text = target.read_text()
        if body != text:
            start = line + 1  # the fence's line, 0-based index of the block's first line
            lines[start : start + body.count("\n")] = text.rstrip("\n").split("\n")
            changed += 1
    document.write_text("\n".join(lines))
    return changed


def self_test() -> list[str]:
    """Runs the checker on documents it must accept and refuse; returns what went wrong."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ex.py").write_text("def f():\n    return 42\n\nprint(f())\n")
        cases = {
            "same": ("<!-- example: ex.py -->\n```python\ndef f():\n    return 42\n\nprint(f())\n```\n", 0),
            "differs": ("<!-- example: ex.py -->\n```python\ndef f():\n    return 41\n\nprint(f())\n```\n", 1),
            "a line short": ("<!-- example: ex.py -->\n```python\ndef f():\n    return 42\n```\n", 1),
            "missing file": ("<!-- example: nope.py -->\n```python\nx\n```\n", 1),
            "no block": ("<!-- example: ex.py -->\ntext\n", 1),
            "excerpt": ("<!-- example: ex.py (excerpt) -->\n```python\nreturn 42\n```\n", 0),
            "bad excerpt": ("<!-- example: ex.py (excerpt) -->\n```python\nreturn 43\n```\n", 1),
            "unmarked": ("```python\nanything\n```\n", 0),
        }
        for name, (text, want) in cases.items():
            doc = root / f"{name}.md"
            doc.write_text(text)
            got = len(check(doc, root))
            if got != want:
                failures.append(f"self-test {name!r}: {got} problem(s), expected {want}")
        doc = root / "stale.md"
        doc.write_text("before\n" + cases["differs"][0] + "after\n")
        if write(doc, root) != 1 or check(doc, root) or not doc.read_text().endswith("```\nafter\n"):
            failures.append("self-test 'write': the stale block was not replaced by its file")
    return failures


def main(args: list[str]) -> int:
    if args[:1] == ["--write"]:
        for doc in args[1:]:
            print(f"readme_examples: {doc}: {write(Path(doc))} block(s) rewritten")
        return 0
    if args == ["--self-test"]:
        problems = self_test()
        print("readme_examples: self-test " + ("failed" if problems else "ok"))
    else:
        problems = [p for doc in args for p in check(Path(doc))]
        count = sum(len(blocks(Path(doc).read_text())) for doc in args)
        if not problems:
            print(f"readme_examples: {count} marked block(s) in {len(args)} document(s) match")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
