"""Start and stop the collector under test, and read its CPU, RSS and fds from /proc."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Collector:
    def __init__(self, workdir: Path, tenants: Path, *, access_log: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, COLLECTOR_BENCH_ROUTES="1", COLLECTOR_ACCESS_LOG=str(access_log).lower())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--bind", f"127.0.0.1:{self.port}",
             "--data-dir", str(workdir / "data"), "--tenants", str(tenants)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"collector did not start: {line!r}")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(match.group(1)) * 1024 if match else 0

    def peak_rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        return int(match.group(1)) * 1024 if match else 0

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def writer_counts(self) -> tuple[float, float]:
        """(requests committed, transactions) from /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {}
        for name in ("collector_writer_requests_committed", "collector_writer_transactions"):
            match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
            values[name] = float(match.group(1)) if match else 0.0
        return values["collector_writer_requests_committed"], values["collector_writer_transactions"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ensure_wrk() -> str:
    for candidate in ("/usr/bin/wrk", "/usr/local/bin/wrk"):
        if os.path.exists(candidate):
            return candidate
    print("installing wrk from Debian's packages ...", flush=True)
    install = ["apt-get", "install", "-y", "-q", "wrk"]
    if subprocess.run(install, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
        subprocess.run(install, capture_output=True, check=True)
    time.sleep(0.1)
    return "/usr/bin/wrk"
