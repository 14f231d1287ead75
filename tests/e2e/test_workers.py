"""`collector serve --workers 2` through the real processes: one socket, one environment."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import trio

from tests.conftest import PAID_KEY, click, write_tenants
from tests.helpers import run_cli

H = {"X-API-Key": PAID_KEY, "Origin": "https://bigco.com"}


class Workers:
    """`serve --workers N` in its own session, so the test can kill the whole group."""

    def __init__(self, tmp_path: Path, workers: int = 2, *extra: str) -> None:
        self.data_dir = tmp_path / "data"
        tenants = write_tenants(tmp_path / "tenants.json")
        self.log = tmp_path / f"serve-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0",
             "--workers", str(workers), "--no-access-log",
             "--data-dir", str(self.data_dir), "--tenants", str(tenants), *extra],
            stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("collector listening on http://127.0.0.1:"), line
        self.url = line.split("listening on ")[1].strip()
        assert not self.url.endswith(":0")

    def children(self) -> list[int]:
        tasks = Path(f"/proc/{self.proc.pid}/task")
        return sorted(int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split())

    def stop(self, timeout: float = 15) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        if code != 0:
            print(self.log.read_text()[-4000:])
        assert self.proc.stdout is not None
        assert self.proc.stdout.read() == "", "the parent printed more than the one listening line"
        return code

    def kill_group(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def metric(text: str, name: str, worker: int | None = None) -> float:
    """A sample without labels, or with `worker`, its value from that worker's labelled sample."""
    labels = "" if worker is None else rf'\{{worker="{worker}"\}}'
    match = re.search(rf"^{name}{labels} ([0-9.e+]+)$", text, re.M)
    assert match, (name, worker)
    return float(match.group(1))


def answering_workers(url: str, workers: int) -> set[int]:
    """Ask /healthz on fresh connections until every worker has answered."""
    seen: set[int] = set()
    deadline = time.monotonic() + 20
    while len(seen) < workers and time.monotonic() < deadline:
        seen.add(httpx.get(url + "/healthz", timeout=5, headers={"Connection": "close"}).json()["worker"])
    return seen


async def post_load(url: str, seconds: float, acknowledged: list[str], pids: Counter[int]) -> None:
    """Many clients, every request on a fresh connection; remembers acknowledged event ids."""

    async def client(n: int) -> None:
        batch = 0
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as http:
            while True:
                eids = [f"c{n}-{batch}-{i}-" + "x" * 100 for i in range(10)]
                batch += 1
                try:
                    response = await http.post(
                        "/v1/events", json={"events": [click(e) for e in eids]}, headers=H
                    )
                    if batch % 5 == 0:
                        pids[(await http.get("/healthz")).json()["pid"]] += 1
                except httpx.HTTPError:
                    return
                if response.status_code == 202 and response.json()["accepted"] == 10:
                    acknowledged.extend(eids)

    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(client, n)


def dump_counts(data_dir: Path) -> Counter[str]:
    rows = [json.loads(line) for line in run_cli("outbox", "dump", data_dir=data_dir).stdout.splitlines()]
    return Counter(row["eid"] for row in rows)


def test_two_workers_share_socket_and_environment_across_map_growth(tmp_path: Path) -> None:
    config = tmp_path / "collector.toml"
    config.write_text("map_size_mb = 1\n")  # tiny: the shared map must grow while both write
    server = Workers(tmp_path, 2, "--config", str(config))
    try:
        assert len(server.children()) == 2
        acknowledged: list[str] = []
        pids: Counter[int] = Counter()
        trio.run(post_load, server.url, 6.0, acknowledged, pids)
        assert len(acknowledged) > 1000
        assert set(pids) == set(server.children()), f"not every worker answered: {pids}"
        # one scrape shows every worker (labelled) and the node's gauges once
        text = httpx.get(server.url + "/metrics", timeout=5).text
        assert metric(text, "collector_workers") == 2
        assert max(metric(text, "collector_lmdb_map_size_bytes", worker) for worker in (0, 1)) > 1024 * 1024
        for worker in (0, 1):
            assert metric(text, "collector_writer_requests_committed", worker) > 0  # both wrote
        assert sum(metric(text, "collector_lmdb_map_growths", worker) for worker in (0, 1)) >= 1
        # rate headers state the key-wide limit; each worker holds half of it
        response = httpx.post(server.url + "/v1/events", json={"events": [click("one-more")]}, headers=H)
        assert response.headers["X-RateLimit-Limit"] == str(60 * 5000)
        acknowledged.append("one-more")
    finally:
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 10
    counts = dump_counts(server.data_dir)
    assert not [eid for eid in acknowledged if counts[eid] != 1], "acknowledged events lost"
    assert max(counts.values()) == 1, "an event was stored twice"
    assert run_cli("check", data_dir=server.data_dir).returncode == 0


def test_kill_9_of_the_whole_group_then_restart_loses_nothing(tmp_path: Path) -> None:
    server = Workers(tmp_path, 2)
    acknowledged: list[str] = []
    pids: Counter[int] = Counter()

    async def load_then_kill() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_load, server.url, 30.0, acknowledged, pids)
            await trio.sleep(2.0)
            server.kill_group()
            await trio.sleep(0.5)  # clients see their connections fail and stop
            nursery.cancel_scope.cancel()

    trio.run(load_then_kill)
    assert len(acknowledged) > 100
    again = Workers(tmp_path, 2)
    try:
        response = httpx.post(
            again.url + "/v1/events", json={"events": [click(acknowledged[0])]}, headers=H
        )
        assert response.json()["duplicates"] == 1
    finally:
        assert again.stop() == 0
    counts = dump_counts(server.data_dir)
    assert not [eid for eid in acknowledged if counts[eid] != 1], "acknowledged events lost"
    assert max(counts.values()) == 1


def test_a_worker_that_dies_is_restarted(tmp_path: Path) -> None:
    server = Workers(tmp_path, 2)
    try:
        first = server.children()
        os.kill(first[1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = server.children()
            if len(now) == 2 and first[1] not in now:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the killed worker was not restarted")
        assert first[0] in now
        # the replacement serves (asked on fresh connections until both answered)
        assert answering_workers(server.url, 2) == {0, 1}
        response = httpx.post(server.url + "/v1/events", json={"events": [click("after")]}, headers=H)
        assert response.status_code == 202
    finally:
        assert server.stop() == 0
    assert dump_counts(server.data_dir)["after"] == 1
    # the supervisor's line names the worker and pid that each of its own lines carries
    # (helper-109: the children's lines could not be told apart)
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    exited = next(line for line in lines if "exited unexpectedly" in line["msg"])
    assert f"worker 1 (pid {first[1]})" in exited["msg"] and "worker" not in exited
    # (the killed one's own lines may have died with it, unwritten: its replacement's)
    replacement = (set(now) - set(first)).pop()
    assert {(line["worker"], line["pid"]) for line in lines if line.get("pid") == replacement} == {(1, replacement)}
    assert {line.get("worker") for line in lines if line["msg"].startswith("listening on")} >= {0, 1}


def test_a_worker_stopped_on_purpose_is_started_again_and_no_crash(tmp_path: Path) -> None:
    # helper-79: a worker recycled with SIGTERM drained and exited 0, was logged at error
    # level as "exited unexpectedly" and counted toward the crash limit.
    server = Workers(tmp_path, 2)
    try:
        first = server.children()
        for _ in range(7):  # more than the crash limit (5 within 60 s), had they counted
            # (not by position: pids wrap, and a replacement may sort before the worker kept)
            recycled = next(pid for pid in server.children() if pid != first[0])
            os.kill(recycled, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # gone, replaced, and the replacement serving
                now = server.children()
                if len(now) == 2 and recycled not in now and answering_workers(server.url, 2) == {0, 1}:
                    break
                time.sleep(0.1)
            assert server.proc.poll() is None, server.log.read_text()[-2000:]
        assert first[0] in server.children()
    finally:
        assert server.stop() == 0
    log = server.log.read_text()
    assert "exited unexpectedly" not in log and log.count("stopped cleanly: starting it again") == 7


def test_every_scrape_counts_every_worker_and_never_goes_back(tmp_path: Path) -> None:
    """/metrics under --workers: each worker's counters, labelled, whichever worker answers.

    A scrape was answered with the accepting worker's own counters alone: they
    went up and down from scrape to scrape (read as counter resets), and no
    scraper can pick a worker on a shared socket (audit helper-38).
    """
    server = Workers(tmp_path, 2)
    series = 'collector_requests_total{route="/v1/events",status="202",worker="%d"}'
    try:
        sent = 0
        for batch in range(400):  # fresh connections until both workers took some
            response = httpx.post(server.url + "/v1/events", json={"events": [click(f"m{batch}")]},
                                  headers={**H, "Connection": "close"})
            sent += response.status_code == 202
            if batch % 40 == 39:
                time.sleep(1.5)  # every worker has published since
                text = httpx.get(server.url + "/metrics", timeout=5, headers={"Connection": "close"}).text
                if all(series % worker in text for worker in (0, 1)):
                    break  # (on a busy machine one worker can win every accept of a round)
        last = {0: 0.0, 1: 0.0}
        for _ in range(12):
            text = httpx.get(server.url + "/metrics", timeout=5, headers={"Connection": "close"}).text
            now = {worker: float(re.search(re.escape(series % worker) + r" (\S+)", text).group(1))  # type: ignore[union-attr]
                   for worker in (0, 1)}
            assert all(now[w] >= last[w] for w in now), (last, now)
            assert sum(now.values()) == sent, (now, sent)
            last = now
        assert all(last.values()), "one worker took no request"
        assert text.count("# TYPE collector_workers gauge") == 1 and "collector_workers 2.0" in text
        # The shared directory removed (a tmp cleaner): scrapes still answer, and it
        # comes back (review helper-44: every scrape was a 500 until a restart).
        child = server.children()[0]
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        shared = Path(argv[argv.index(b"--metrics-dir") + 1].decode())
        shutil.rmtree(shared)
        assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200
        time.sleep(1.5)
        text = httpx.get(server.url + "/metrics", timeout=5, headers={"Connection": "close"}).text
        assert sum(float(re.search(re.escape(series % w) + r" (\S+)", text).group(1))  # type: ignore[union-attr]
                   for w in (0, 1)) == sent
        assert shared.is_dir()
    finally:
        assert server.stop() == 0


def test_sigterm_while_a_worker_restarts_is_a_clean_stop(tmp_path: Path) -> None:
    """Stopping while a crashed worker waits for its restart, or while its replacement starts.

    The crashed worker's -9 was counted against the stop (exit 1); a replacement
    signalled while importing died of the default action (exit 1), and one
    signalled just before serve() watched for it ignored it, served out the
    whole drain time and was killed.
    """
    for delay in (0.1, 0.7, 1.0, 1.3):
        server = Workers(tmp_path, 2)
        os.kill(server.children()[1], signal.SIGKILL)
        time.sleep(delay)
        started = time.monotonic()
        assert server.stop() == 0, delay
        assert time.monotonic() - started < 5, delay


def test_systemd_hears_only_the_parent(tmp_path: Path) -> None:
    """READY=1 once, WATCHDOG=1 and STOPPING=1: all from the parent's pid, none from a worker."""
    import socket
    import struct

    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    listener.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=address, WATCHDOG_USEC="400000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0", "--workers", "2",
         "--data-dir", str(tmp_path / "data"), "--tenants", str(write_tenants(tmp_path / "t.json"))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    heard: list[tuple[int, str]] = []

    def receive() -> str:
        data, ancillary, _, _ = listener.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = next(struct.unpack("iII", cdata[:12])[0] for level, kind, cdata in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
        heard.append((pid, data.decode()))
        return data.decode()

    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        while not receive().startswith("READY=1"):
            pass
        pings = 0
        while pings < 2:
            pings += receive() == "WATCHDOG=1"
        proc.send_signal(signal.SIGTERM)
        while receive() != "STOPPING=1":
            pass
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        listener.close()
    assert {pid for pid, _ in heard} == {proc.pid}
    assert sum(message.startswith("READY=1") for _, message in heard) == 1


def test_sigterm_while_the_workers_start_stops_at_once(tmp_path: Path) -> None:
    """A stop before every worker is up does not wait for the rest to start (audit helper-38).

    The signal was heeded only once all N had started one after another (~0.5 s
    each), and the parent then still announced "listening" and READY=1.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0", "--workers", "8",
         "--no-access-log", "--data-dir", str(tmp_path / "data"),
         "--tenants", str(write_tenants(tmp_path / "t.json"))],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # the parent's trio loop runs and the first workers are starting
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 2.5
        assert proc.stdout is not None and proc.stdout.read() == ""  # it never said it was listening
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # and no worker outlives it
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a worker outlived the parent")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_restarted_worker_refuses_a_lost_key_file_as_a_start_does(tmp_path: Path) -> None:
    # helper-92: a worker the parent restarted ran load_or_create without the lost-key
    # check: with the key file moved away it made a fresh k1, and values sealed with the
    # old k1 (or with the new one, once the right file was back) could not be revealed.
    server = Workers(tmp_path, 2)
    key_file = server.data_dir / "field-keys.json"
    try:
        assert key_file.exists()
        key_file.rename(tmp_path / "kept-keys.json")
        os.kill(server.children()[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "lacks key\n" not in server.log.read_text() \
                and "is missing, but" not in server.log.read_text():
            time.sleep(0.2)
        assert "is missing, but this data directory records sealing with key k1" in server.log.read_text()
        assert not key_file.exists(), "a restarted worker made a fresh key file"
        # helper-93: that refusal was a traceback and a crash; five more took the node down
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "the other workers go on serving" not in server.log.read_text():
            time.sleep(0.2)
        log = server.log.read_text()
        assert "refused to start" in log and "the other workers go on serving" in log, log[-2000:]
        assert "Traceback" not in log and log.count("exited unexpectedly") == 1, log[-2000:]  # (the kill)
        response = httpx.post(server.url + "/v1/events", json={"events": [click("still-served")]}, headers=H)
        assert response.status_code == 202, response.text
        assert server.proc.poll() is None
    finally:
        (tmp_path / "kept-keys.json").rename(key_file)
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=20)
