"""collector --version's commit, read from .git without running git."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collector.version import _checked_out_commit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_checkout_a_branch_and_packed_refs(tmp_path: Path) -> None:
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    assert _checked_out_commit(git) is None  # (no such branch yet)
    (git / "packed-refs").write_text(f"# pack-refs\n{COMMIT} refs/heads/main\n")
    assert _checked_out_commit(git) == COMMIT
    (git / "HEAD").write_text(COMMIT[::-1] + "\n")  # detached
    assert _checked_out_commit(git) == COMMIT[::-1]


def test_a_relative_gitdir_is_the_git_files_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # helper-121: a submodule's "gitdir: ../.git/modules/code" was read against the working
    # directory, so the commit was said only when run from the checkout itself
    modules = tmp_path / ".git" / "modules" / "code"
    modules.mkdir(parents=True)
    (modules / "HEAD").write_text(COMMIT + "\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / ".git").write_text("gitdir: ../.git/modules/code\n")
    monkeypatch.chdir(os.sep)
    assert _checked_out_commit(code / ".git") == COMMIT
