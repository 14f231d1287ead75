"""Start and stop the collector under test, and read its CPU, RSS and fds from /proc."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 60.0


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
                 env: dict[str, str] | None = None, source: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        # The server runs on its defaults: a COLLECTOR_* setting left in the shell
        # would change what is measured without showing anywhere (ignored_settings).
        base = {name: value for name, value in os.environ.items() if not name.startswith("COLLECTOR_")}
        env = dict(base, COLLECTOR_BENCH_ROUTES="1", COLLECTOR_ACCESS_LOG=str(access_log).lower(), **(env or {}))
        if source is not None:
            # Another revision's code (`--against`), ahead of the editable install
            # of this tree on the path; it runs on this tree's virtualenv.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source), base.get("PYTHONPATH"))))
        argv = [sys.executable, "-m", "collector", "serve", "--bind", f"127.0.0.1:{self.port}",
                "--data-dir", str(workdir / "data"), "--tenants", str(tenants)]
        if workers > 1:  # only then: revisions older than `--workers` still start
            argv += ["--workers", str(workers)]
        log_path = os.environ.get("BENCH_SERVER_LOG") or str(workdir / "server.log")
        with open(log_path, "ab") as log:  # BENCH_SERVER_LOG=FILE keeps the server's log lines
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, text=True, cwd=source)
        try:
            line = self._first_line(START_TIMEOUT_S)
            if "listening on" not in line:
                tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"collector did not start: {line.strip() or 'no output'}; its log ends:"
                                   f" {' | '.join(tail) or '(empty)'}")
            self._started = self._all_processes(workers)
        except BaseException:
            self.stop()
            raise

    def _first_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else f"(nothing within {timeout:.0f} s)"

    def _all_processes(self, workers: int) -> set[int]:
        """The server's processes once every worker is up (the parent alone with one worker)."""
        expected = 1 if workers == 1 else 1 + workers
        deadline = time.monotonic() + START_TIMEOUT_S
        pids = set(self.pids())
        while len(pids) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = set(self.pids())
        return pids

    def lost_processes(self) -> str:
        """What died since the start ("" when nothing did): their CPU and counters are gone with them."""
        if self.proc.poll() is not None:
            return f"the collector exited with {self.proc.returncode}"
        gone = self._started - set(self.pids())
        return f"{len(gone)} of the server's {len(self._started)} processes exited mid-run" if gone else ""

    @staticmethod
    def ignored_settings() -> list[str]:
        """COLLECTOR_* variables of this shell that the bench's servers do not get."""
        return sorted(name for name in os.environ if name.startswith("COLLECTOR_"))

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
        """(requests committed, transactions) from /metrics, summed over the workers."""
        totals = self.totals_or_why()
        return totals["committed"], totals["transactions"]

    def totals_or_why(self) -> dict[str, float]:
        """totals(); when the server no longer answers, a RuntimeError that says what died."""
        try:
            return self.totals()
        except httpx.HTTPError as exc:
            raise RuntimeError(self.lost_processes() or f"/metrics did not answer: {exc}") from None

    def totals(self) -> dict[str, float]:
        """Counters from one /metrics scrape, summed over the workers.

        committed and transactions (the group-commit writer), accepted and
        duplicate (events of requests answered 202), rate_limited (POST /v1/events
        answered 429). One scrape covers every
        worker (their samples labelled worker="I"; the figures of a worker
        other than the one answering are up to a second old).
        """
        text = httpx.get(self.url + "/metrics", timeout=10).text

        def total(name: str, labels: str = "") -> float:
            pattern = rf'^{name}{{?{labels}(?:,?worker="\d+")?}}? ([0-9.e+]+)$'
            return sum(float(value) for value in re.findall(pattern, text, re.M))

        return {
            "committed": total("collector_writer_requests_committed"),
            "transactions": total("collector_writer_transactions"),
            "accepted": total("collector_events_total", 'outcome="accepted"'),
            "duplicate": total("collector_events_total", 'outcome="duplicate"'),
            "rate_limited": total("collector_requests_total", 'route="/v1/events",status="429"'),
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk from Debian's packages ...", flush=True)
    install = ["apt-get", "install", "-y", "-q", "wrk"]
    if subprocess.run(install, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
        done = subprocess.run(install, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"bench: could not install wrk with apt-get (exit {done.returncode}; it needs root):"
                f" {(done.stderr or done.stdout).strip()[-400:]}\ninstall it (apt-get install wrk) and run again"
            )
    time.sleep(0.1)
    return shutil.which("wrk") or "/usr/bin/wrk"


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: stop like Ctrl-C, so every server, wrk and temp directory goes."""


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def stop_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP raise Interrupted from now on (a run's `finally` blocks then
    stop its servers), unless ignored: `nohup python -m bench` keeps running at logout."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _interrupt)
