"""The notify protocol, with the test playing systemd on a NOTIFY_SOCKET."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import write_tenants


def test_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=address, WATCHDOG_USEC="400000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "data"), "--tenants", str(write_tenants(tmp_path / "t.json"))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    try:
        messages = []
        while not any(m.startswith("READY=1") for m in messages):
            messages.append(listener.recv(4096).decode())
        ready = next(m for m in messages if m.startswith("READY=1"))
        assert "STATUS=listening on http://127.0.0.1:" in ready
        pings = 0
        while pings < 2:  # every 0.2 s from the event loop
            pings += listener.recv(4096).decode() == "WATCHDOG=1"
        proc.send_signal(signal.SIGTERM)
        while listener.recv(4096).decode() != "STOPPING=1":
            pass
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        listener.close()


def test_unit_file_declares_notify_and_hardening() -> None:
    unit = (Path(__file__).parents[2] / "systemd" / "collector.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "DynamicUser=yes", "StateDirectory=collector", "TimeoutStopSec=15"):
        assert line in unit


def test_unit_passes_systemd_analyze_verify() -> None:
    import shutil

    import pytest

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    script = Path(__file__).parents[2] / "systemd" / "verify"
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
