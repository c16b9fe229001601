"""Marked sections of benchmarks/RESULTS.md: each benchmark script owns one and rewrites only it."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: str | Path, begin: str, end: str, text: str) -> None:
    """Replace the text between ``begin`` and ``end`` (inclusive) in ``path`` by ``text``, which
    carries the markers itself; append it when the markers are not there yet."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old and old.index(begin) < old.index(end):
        new = old[:old.index(begin)] + text + old[old.index(end) + len(end):]
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + text + "\n"
    path.write_text(new)


def emit(out: str | Path | None, begin: str, end: str, text: str) -> None:
    """A benchmark's output: its section of ``out`` when given, else stdout (the CLI's print)."""
    if out:
        replace_section(out, begin, end, text)
    else:
        print(text)


def source_revision() -> str:
    """The git commit the benchmark ran at (``+changes`` when the tree differs from it), so a
    results section names the code that made it; "unknown" outside a git checkout."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}+changes" if dirty else rev
