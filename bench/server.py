"""Start and stop the collector under test, and read its CPU, RSS and fds from /proc."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """pid and its descendants (children of every thread: trio may fork from a worker thread)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return pids


def _status_kb(pid: int, field: str) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(rf"{field}:\s+(\d+) kB", status)
    return int(match.group(1)) if match else 0


class Collector:
    """`collector serve` (with `--workers N`: the parent and its workers, measured as one tree)."""

    def __init__(self, workdir: Path, tenants: Path, *, access_log: bool = True, workers: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        env = dict(os.environ, COLLECTOR_BENCH_ROUTES="1", COLLECTOR_ACCESS_LOG=str(access_log).lower(),
                   **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--bind", f"127.0.0.1:{self.port}",
             "--data-dir", str(workdir / "data"), "--tenants", str(tenants), "--workers", str(workers)],
            # BENCH_SERVER_LOG=FILE keeps the server's log lines (they are dropped otherwise)
            stdout=subprocess.PIPE, stderr=self._log_file(), env=env, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"collector did not start: {line!r}")

    @staticmethod
    def _log_file() -> int | IO[bytes]:
        path = os.environ.get("BENCH_SERVER_LOG")
        return open(path, "ab") if path else subprocess.DEVNULL  # noqa: SIM115 (the child holds it)

    def pids(self) -> list[int]:
        return _tree(self.proc.pid)

    def cpu_seconds(self) -> float:
        """CPU of the parent and every worker (a restarted worker's earlier CPU is not counted)."""
        total = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / CLOCK_TICKS

    def rss_bytes(self) -> int:
        return sum(_status_kb(pid, "VmRSS") for pid in self.pids()) * 1024

    def rss_parts(self) -> tuple[int, int]:
        """(anonymous, file-backed) resident bytes: heap versus LMDB's mapped data pages."""
        pids = self.pids()
        anon = sum(_status_kb(pid, "RssAnon") for pid in pids)
        mapped = sum(_status_kb(pid, "RssFile") + _status_kb(pid, "RssShmem") for pid in pids)
        return anon * 1024, mapped * 1024

    def peak_rss_bytes(self) -> int:
        return sum(_status_kb(pid, "VmHWM") for pid in self.pids()) * 1024

    def open_fds(self) -> int:
        total = 0
        for pid in self.pids():
            try:
                total += len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
        return total

    def writer_counts(self) -> tuple[float, float]:
        """(requests committed, transactions) from /metrics, summed over the workers.

        One scrape covers every worker (their samples labelled worker="I"; the
        figures of a worker other than the one answering are up to a second old).
        """
        text = httpx.get(self.url + "/metrics", timeout=10).text

        def total(name: str) -> float:
            return sum(float(value) for value in re.findall(rf'^{name}(?:{{worker="\d+"}})? ([0-9.e+]+)$', text, re.M))

        return total("collector_writer_requests_committed"), total("collector_writer_transactions")

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
