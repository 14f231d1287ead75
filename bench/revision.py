"""The code of another git revision, for `python -m bench --against REV`.

The revision is exported with `git archive` into a temp directory (the
repository, its worktrees and its index are left alone) and served from there
by putting it first on the server's PYTHONPATH. It runs on this tree's
virtualenv: a revision that needs other dependency versions fails to start,
and the bench reports that like any server that does not start.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class UnknownRevision(ValueError):
    pass


def _git(*argv: str, text: bool = True) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=text, timeout=60)


def describe_tree() -> str:
    """This tree's short commit, `+changes` when it differs from it; "" outside a git checkout."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return ""
        changed = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return str(head.stdout).strip() + ("+changes" if str(changed.stdout).strip() else "")


def export(rev: str, into: Path) -> str:
    """Extract revision `rev` of this repository into `into`; its short commit hash."""
    try:
        # Resolved first and peeled after: `^{commit}` appended to REV itself
        # would break revisions that end in free text, such as `:/message`.
        named = _git("rev-parse", "--verify", "--end-of-options", rev)
        resolved = named if named.returncode != 0 else _git(
            "rev-parse", "--short", "--verify", "--end-of-options", f"{str(named.stdout).strip()}^{{commit}}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownRevision(f"git could not be run: {exc}") from None
    if resolved.returncode != 0:
        raise UnknownRevision(f"{rev!r} is not a commit of {ROOT}")
    short = str(resolved.stdout).strip()
    archive = _git("archive", "--format=tar", short, text=False)
    if archive.returncode != 0:
        raise UnknownRevision(f"git archive {short} failed: {archive.stderr!r}")
    assert isinstance(archive.stdout, bytes)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return short
