"""Helpers for end-to-end tests: run the real CLI, read the outbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio


def run_cli(
    *args: str, data_dir: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`env`: variables set on top of this process's environment."""
    argv = [sys.executable, "-m", "collector", *args]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env} if env else None
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{argv} exited {result.returncode}: {result.stderr}")
    return result


async def outbox_dump(data_dir: Path) -> list[dict[str, object]]:
    result = await trio.to_thread.run_sync(lambda: run_cli("outbox", "dump", data_dir=data_dir))
    return [json.loads(line) for line in result.stdout.splitlines() if line]
