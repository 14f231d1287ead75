"""Two processes on one LMDB environment (`serve --workers N`): a map grown by one is adopted by the other."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import trio

from storage import audit, counters, keys
from storage.env import Storage
from storage.field_key_ids import record_key_ids, recorded_key_ids
from storage.stream_secret import stream_token_secret
from storage.writer import GroupCommitWriter, WriteContext, run_job_now

MB = 1024 * 1024

GROW_ELSEWHERE = """
import sys
from storage.env import Storage
from storage.writer import run_job_now

class Fill:
    def run(self, ctx):
        for n in range(48):
            ctx.txn.put(b"fill-%d-%s" % (n, sys.argv[2].encode()), b"x" * 65536, db=ctx.dbs.meta)

storage = Storage(sys.argv[1], map_size=1024 * 1024)
run_job_now(storage, Fill())
print(storage.env.info()["map_size"])
storage.close()
"""


class Put:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def run(self, ctx: WriteContext) -> bytes:
        ctx.txn.put(self.key, b"v" * 100_000, db=ctx.dbs.meta)
        return self.key


def grow_in_another_process(path: Path, tag: str) -> int:
    root = Path(__file__).parents[2]
    result = subprocess.run(
        [sys.executable, "-c", GROW_ELSEWHERE, str(path), tag],
        capture_output=True, text=True, check=True, cwd=root, timeout=60,
    )
    return int(result.stdout)


async def test_writer_and_reads_adopt_a_map_another_process_grew(tmp_path: Path) -> None:
    storage = Storage(tmp_path, map_size=MB)
    try:
        writer = GroupCommitWriter(storage)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            assert await writer.submit(Put(b"before")) == b"before"
            grown = await trio.to_thread.run_sync(grow_in_another_process, tmp_path, "a")
            assert grown >= 4 * MB and storage.env.info()["map_size"] < grown
            # this process's mapping is too small for the data now: MapResizedError, adopted
            assert await writer.submit(Put(b"after")) == b"after"
            assert writer.statistics().map_adoptions >= 1
            assert storage.env.info()["map_size"] >= grown
            # and a second growth by the other process while this one keeps going
            grown = await trio.to_thread.run_sync(grow_in_another_process, tmp_path, "b")
            with storage.read() as txn:  # reads adopt too
                assert txn.get(b"fill-47-b", db=storage.dbs.meta) is not None
            assert await writer.submit(Put(b"again")) == b"again"
            nursery.cancel_scope.cancel()
        with storage.read() as txn:
            assert all(txn.get(k, db=storage.dbs.meta) for k in (b"before", b"after", b"again"))
    finally:
        storage.close()


def test_one_off_jobs_adopt_too(tmp_path: Path) -> None:
    storage = Storage(tmp_path, map_size=MB)
    try:
        run_job_now(storage, Put(b"first"))
        grow_in_another_process(tmp_path, "c")
        assert run_job_now(storage, Put(b"second")) == b"second"
    finally:
        storage.close()


def test_operator_writes_adopt_a_map_serve_grew(tmp_path: Path) -> None:
    # helper-95: `collector reveal` (its audit entry), the field key record, the stream
    # secret and the overage mark failed with MDB_MAP_RESIZED while `serve` grew the map.
    storage = Storage(tmp_path, map_size=MB)
    try:
        writes = [
            lambda: audit.append_entry(storage, at_ms=1, who="op", action="reveal", receipt_id="r", fields=["x"],
                                       reason="t"),
            lambda: record_key_ids(storage, ["k1"]),
            lambda: stream_token_secret(storage),
            lambda: counters.mark_overage_counting(storage, "2026-11"),
            lambda: keys.put_keys(storage, [("cs_live_k", b"{}")]),
        ]
        for n, write in enumerate(writes):
            grow_in_another_process(tmp_path, f"w{n}")
            write()  # (MDB_MAP_RESIZED: a StorageError)
        assert [entry.seq for entry in audit.iter_entries(storage)] == [1]
        assert recorded_key_ids(storage) == ["k1"] and len(stream_token_secret(storage)) == 32
    finally:
        storage.close()


class Hold:
    """A job that keeps its write transaction open until told to finish."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def run(self, ctx: WriteContext) -> None:
        ctx.txn.put(b"held", b"1", db=ctx.dbs.meta)
        self.inside.set()
        self.release.wait(10)


async def test_read_adopting_a_grown_map_waits_for_an_open_write_transaction(tmp_path: Path) -> None:
    # Found under `bench --workers 2`: a worker's read met MapResizedError while
    # its own writer thread had a transaction open, and set_mapsize refused
    # ("Cannot set_mapsize while a write transaction is active"): a 503.
    storage = Storage(tmp_path, map_size=MB)
    try:
        writer = GroupCommitWriter(storage)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            hold = Hold()
            nursery.start_soon(writer.submit, hold)
            await trio.to_thread.run_sync(hold.inside.wait)
            # Another worker process's growth (it needs no lock the held txn owns:
            # its commit waits for LMDB's writer lock, so let it commit first).
            hold.release.set()
            await trio.sleep(0.05)
            hold = Hold()
            grown = await trio.to_thread.run_sync(grow_in_another_process, tmp_path, "d")
            nursery.start_soon(writer.submit, hold)
            await trio.to_thread.run_sync(hold.inside.wait)
            # The writer's transaction is open now; a resize must wait for it.
            threading.Timer(0.2, hold.release.set).start()
            storage.adopt_map_size()  # before the fix: StorageError at once
            assert hold.release.is_set()
            assert storage.env.info()["map_size"] >= grown
            nursery.cancel_scope.cancel()
    finally:
        storage.close()
