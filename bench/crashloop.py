"""`python -m bench.crashloop`: kill -9 the collector at random points of a mixed load, N times.

Each round starts the collector on the same data directory, runs concurrent
writers (batches of mixed sizes, some replays of acknowledged batches), and
SIGKILLs it after a random 0.3-1.5 s. At the end the outbox is dumped and
compared with every event whose 202 counted it as accepted.
Report: acknowledged, found, lost (acknowledged but missing), duplicated
(stored more than once). Lost and duplicated must both be 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import httpx
import trio

from bench.scenarios import BENCH_KEY, ORIGIN, write_tenants
from bench.server import Interrupted, free_port, stop_like_ctrl_c

HEADERS = {"X-API-Key": BENCH_KEY, "Origin": ORIGIN}


def event(eid: str) -> dict[str, object]:
    return {
        "type": "pageview", "_eid": eid, "visitorId": "v", "sessionId": "s", "timestamp": 1_795_000_000_000,
        "page": {"url": "https://bench.example/", "path": "/", "title": "t"},
        "device": {"userAgent": "Mozilla/5.0", "viewport": {"width": 1, "height": 1}},
    }  # fmt: skip


async def _load(url: str, round_no: int, acknowledged: set[str], pid: int, kill_after: float) -> None:
    async def writer(worker: int, client: httpx.AsyncClient) -> None:
        rng = random.Random(round_no * 1000 + worker)
        batch = 0
        sent: list[list[str]] = []
        while True:
            if sent and rng.random() < 0.2:
                eids = rng.choice(sent)  # a replay of something already acknowledged
            else:
                eids = [f"r{round_no}-w{worker}-b{batch}-{i}" for i in range(rng.choice((1, 5, 25)))]
                batch += 1
            try:
                response = await client.post("/v1/events", json={"events": [event(e) for e in eids]}, headers=HEADERS)
            except httpx.HTTPError:
                return
            if response.status_code == 202:
                acknowledged.update(eids)
                sent.append(eids)

    async with httpx.AsyncClient(base_url=url, timeout=5) as client, trio.open_nursery() as nursery:
        for worker in range(12):
            nursery.start_soon(writer, worker, client)
        await trio.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)


def crashloop(rounds: int, workdir: Path, seed: int = 7) -> dict[str, int]:
    tenants, _ = write_tenants(workdir)
    data_dir = workdir / "data"
    rng = random.Random(seed)
    acknowledged: set[str] = set()
    for round_no in range(rounds):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--bind", f"127.0.0.1:{port}",
             "--data-dir", str(data_dir), "--tenants", str(tenants), "--no-access-log"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            assert proc.stdout is not None
            if "listening on" not in proc.stdout.readline():
                raise RuntimeError(f"round {round_no}: the collector did not start")
            trio.run(_load, f"http://127.0.0.1:{port}", round_no, acknowledged, proc.pid, rng.uniform(0.3, 1.5))
            proc.wait(timeout=10)
        finally:  # stopped (Ctrl-C, SIGTERM) or failed mid-round: no collector left serving
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    dump = subprocess.run(
        [sys.executable, "-m", "collector", "outbox", "dump", "--data-dir", str(data_dir)],
        capture_output=True, text=True, check=True,
    ).stdout
    counts = Counter(json.loads(line)["eid"] for line in dump.splitlines())
    return {
        "rounds": rounds,
        "acknowledged": len(acknowledged),
        "found": sum(1 for eid in acknowledged if counts[eid] >= 1),
        "lost": sum(1 for eid in acknowledged if counts[eid] == 0),
        "duplicated": sum(1 for n in counts.values() if n > 1),
        "stored": len(counts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.crashloop", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    stop_like_ctrl_c()
    try:
        with tempfile.TemporaryDirectory(prefix="crashloop-") as tmp:
            report = crashloop(args.rounds, Path(tmp))
    except BaseException as exc:
        # (inside trio's nursery the stop comes wrapped in an exception group)
        stopped = exc.split((KeyboardInterrupt, Interrupted))[0] if isinstance(exc, BaseExceptionGroup) else exc
        if not isinstance(stopped, (KeyboardInterrupt, Interrupted, BaseExceptionGroup)):
            raise
        signal_name = next((str(e) for e in _leaves(stopped) if isinstance(e, Interrupted)), "SIGINT")
        print(f"crashloop: interrupted ({signal_name}): its collector and data directory are gone", file=sys.stderr)
        sys.exit(130)
    print(json.dumps(report))
    sys.exit(0 if report["lost"] == 0 and report["duplicated"] == 0 else 1)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


if __name__ == "__main__":
    main()
