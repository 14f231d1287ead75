"""The collector's version: the package's, and the commit a git checkout runs.

The package version alone (0.1.0) named every build alike; an operator asking
what a node runs, or a bug report, needs the commit. A deployment is a git
checkout installed in place (README), so its `.git` says which commit is
checked out; it is read here without running git.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def version() -> str:
    """`0.1.0+g1a2b3c4d5e6f`, or the package version alone outside a checkout."""
    try:
        base = importlib.metadata.version("collector")
    except importlib.metadata.PackageNotFoundError:
        base = "0+unknown"
    commit = _checked_out_commit(SOURCE_ROOT / ".git")
    return f"{base}+g{commit[:12]}" if commit else base


def _checked_out_commit(dot_git: Path) -> str | None:
    try:
        if dot_git.is_file():  # a worktree or a submodule: "gitdir: PATH", relative to the file's directory
            dot_git = dot_git.parent / dot_git.read_text().removeprefix("gitdir:").strip()
        head = (dot_git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head if _is_commit(head) else None  # detached
        ref = head.removeprefix("ref: ")
        common = dot_git
        if (dot_git / "commondir").is_file():
            common = (dot_git / (dot_git / "commondir").read_text().strip()).resolve()
        for place in (dot_git, common):
            if (place / ref).is_file():
                value = (place / ref).read_text().strip()
                return value if _is_commit(value) else None
        for line in (common / "packed-refs").read_text().splitlines():
            value, _, name = line.partition(" ")
            if name == ref and _is_commit(value):
                return value
    except OSError:
        pass
    return None


def _is_commit(text: str) -> bool:
    return len(text) in (40, 64) and all(char in "0123456789abcdef" for char in text)
