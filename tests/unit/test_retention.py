"""Retention sweeps over a real LMDB: outbox age and consumer cursors, idempotency windows."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from storage import idempotency, outbox, replay
from storage.check import check
from storage.env import Storage
from storage.errors import StorageError, StorageFull
from storage.retention import (
    IDEM_SWEEP_POS,
    RETAINED_FROM,
    RetentionSweep,
    SweepResult,
    run_retention,
)
from storage.writer import WriteJob, run_job_now
from tests.unit.test_check import NOV, add_key, admit

DAY = 86_400_000
WEEK = 7 * DAY


def idem_keys(storage: Storage) -> list[bytes]:
    with storage.read() as txn:
        return [bytes(k) for k, _ in txn.cursor(db=storage.dbs.idempotency)]


def outbox_eids(storage: Storage) -> list[str]:
    return [r.eid for _, r in outbox.iter_outbox(storage)]


def meta(storage: Storage, key: bytes) -> bytes | None:
    with storage.read() as txn:
        value = txn.get(key, db=storage.dbs.meta)
    return bytes(value) if value is not None else None


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    opened = Storage(tmp_path)
    add_key(opened, "acme")
    return opened


def test_outbox_goes_after_retention_idempotency_after_its_window(storage: Storage) -> None:
    admit(storage, ["old1", "old2"], now_ms=NOV)
    admit(storage, ["new1"], now_ms=NOV + 4 * DAY)
    sweep = RetentionSweep(3 * DAY, WEEK)
    result = run_job_now(storage, sweep, now_ms=NOV + 3 * DAY)  # exactly the retention age
    assert (result.outbox_removed, result.idempotency_removed) == (2, 0)
    assert result.retained_from == 3 and not result.more
    assert outbox_eids(storage) == ["new1"]
    assert meta(storage, RETAINED_FROM) == (3).to_bytes(8, "big")
    assert len(idem_keys(storage)) == 3  # ids are remembered for their whole window
    assert check(storage).problems == []
    # one millisecond before the window ends, a retry is still recognised
    just_inside = run_job_now(storage, sweep, now_ms=NOV + WEEK - 1)
    assert just_inside.idempotency_removed == 0
    assert admit(storage, ["old1"], now_ms=NOV + WEEK - 1).duplicate == [True]
    at_end = run_job_now(storage, sweep, now_ms=NOV + WEEK)
    assert at_end.idempotency_removed == 2 and len(idem_keys(storage)) == 1
    assert admit(storage, ["new1"], now_ms=NOV + WEEK + 1).duplicate == [True]
    assert check(storage).problems == []


def test_consumer_cursors_hold_the_outbox(storage: Storage) -> None:
    admit(storage, ["a", "b", "c"], now_ms=NOV)
    with storage.env.begin(write=True) as txn:
        txn.put(b"signals", (1).to_bytes(8, "big"), db=storage.dbs.cursors)
    sweep = RetentionSweep(1, WEEK, ["signals", "live"])
    # "live" has no cursor yet: it holds everything
    assert run_job_now(storage, sweep, now_ms=NOV + 9 * DAY).outbox_removed == 0
    with storage.env.begin(write=True) as txn:
        txn.put(b"live", (3).to_bytes(8, "big"), db=storage.dbs.cursors)
    result = run_job_now(storage, sweep, now_ms=NOV + 9 * DAY)
    assert result.outbox_removed == 1 and result.retained_from == 2  # "signals" passed only seq 1
    assert outbox_eids(storage) == ["b", "c"]
    # with no consumer registered, age alone decides
    assert run_job_now(storage, RetentionSweep(1, WEEK), now_ms=NOV + 9 * DAY).outbox_removed == 2
    assert check(storage).problems == []


def test_outbox_batches_resume_and_mark_the_low_water(storage: Storage) -> None:
    admit(storage, [f"e{i:02}" for i in range(10)], now_ms=NOV)
    sweep = RetentionSweep(DAY, 30 * DAY, batch=4)
    results = [run_job_now(storage, sweep, now_ms=NOV + 2 * DAY) for _ in range(3)]
    assert [r.outbox_removed for r in results] == [4, 4, 2]
    assert [r.retained_from for r in results] == [5, 9, 11]
    assert [r.more for r in results] == [True, True, False]
    assert outbox_eids(storage) == [] and check(storage).problems == []
    assert run_job_now(storage, sweep, now_ms=NOV + 2 * DAY).retained_from == 11  # never moves back


def test_idempotency_scan_resumes_and_wraps_around(storage: Storage) -> None:
    # keys sort as a0..a2 (recent) before z0..z5 (expired)
    admit(storage, ["z0", "z1", "z2", "z3", "z4", "z5"], now_ms=NOV)
    admit(storage, ["a0", "a1", "a2"], now_ms=NOV + 10 * DAY)
    sweep = RetentionSweep(365 * DAY, WEEK, batch=3)
    now = NOV + 11 * DAY
    first = run_job_now(storage, sweep, now_ms=now)
    # the first three keys are live: nothing removed, but the scan moved on
    assert (first.idempotency_scanned, first.idempotency_removed, first.more) == (3, 0, True)
    assert meta(storage, IDEM_SWEEP_POS) == idempotency.ledger_key("acme", "z0")
    second = run_job_now(storage, sweep, now_ms=now)
    assert (second.idempotency_removed, second.more) == (3, True)
    third = run_job_now(storage, sweep, now_ms=now)
    assert (third.idempotency_removed, third.more) == (3, False)
    assert meta(storage, IDEM_SWEEP_POS) is None  # reached the end: the next pass starts over
    assert [k.split(b"\0")[1] for k in idem_keys(storage)] == [b"a0", b"a1", b"a2"]
    later = run_job_now(storage, sweep, now_ms=NOV + 17 * DAY)
    assert (later.idempotency_scanned, later.idempotency_removed) == (3, 3)


def test_an_unreadable_outbox_record_is_kept_and_the_sweep_goes_on(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    admit(storage, ["a", "b", "c"], now_ms=NOV)
    with storage.env.begin(write=True) as txn:
        txn.put(outbox.seq_key(2), b"\xc1", db=storage.dbs.outbox)
    sweep = RetentionSweep(1, WEEK)
    result = run_job_now(storage, sweep, now_ms=NOV + DAY)
    assert result.outbox_removed == 2 and result.retained_from == 4
    with storage.read() as txn:
        assert txn.get(outbox.seq_key(2), db=storage.dbs.outbox) == b"\xc1"
    assert "retention keeps 1 outbox records that do not decode, the first at seq 2" in caplog.text
    caplog.clear()
    run_job_now(storage, sweep, now_ms=NOV + DAY)
    assert "do not decode" not in caplog.text  # logged once, not at every interval
    assert check(storage).problems == ["outbox seq 2 does not decode: MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)"]


def test_records_whose_strings_are_not_utf8_are_stepped_over_by_every_sweep(storage: Storage) -> None:
    # msgspec raises UnicodeDecodeError for these, not DecodeError: one such
    # record used to fail the whole job at every interval, and nothing was removed.
    admit(storage, ["a", "b", "c"], now_ms=NOV)
    chunks = [replay.chunk_key("acme", "web", "s1", n) for n in range(3)]
    with storage.env.begin(write=True) as txn:
        row = txn.get(outbox.seq_key(2), db=storage.dbs.outbox)
        txn.put(outbox.seq_key(2), row.replace(b"acme", b"\xffcme", 1), db=storage.dbs.outbox)
        ledger = idempotency.ledger_key("acme", "b")
        txn.put(ledger, txn.get(ledger, db=storage.dbs.idempotency).replace(b"rcpt_", b"\xffcpt_"),
                db=storage.dbs.idempotency)
        for key in chunks:
            chunk = replay.ReplayRecord(NOV, "rply_x", b"h" * 16, "v1", None, b"[]")
            txn.put(key, replay.encode(chunk), db=storage.dbs.replay)
        txn.put(chunks[1], replay.encode(chunk).replace(b"rply_x", b"\xffply_x"), db=storage.dbs.replay)
    sweep = RetentionSweep(DAY, WEEK, replay_retention_ms=DAY)
    result = run_job_now(storage, sweep, now_ms=NOV + 30 * DAY)
    assert (result.outbox_removed, result.idempotency_removed, result.replay_removed) == (2, 2, 2)
    with storage.read() as txn:
        assert [bytes(k) for k, _ in txn.cursor(db=storage.dbs.outbox)] == [outbox.seq_key(2)]
        assert [bytes(k) for k, _ in txn.cursor(db=storage.dbs.replay)] == [chunks[1]]
    assert idem_keys(storage) == [ledger]


class FakeWriter:
    """Runs each submitted job at once in its own transaction, at a wall time that follows trio's clock."""

    def __init__(
        self, storage: Storage, fail_at: frozenset[int] = frozenset(), largest_sweep: int | None = None
    ) -> None:
        self.storage = storage
        self.fail_at = fail_at
        self.largest_sweep = largest_sweep  # a full map: a sweep of larger batches cannot commit
        self.calls: list[float] = []
        self.batches: list[int] = []

    async def submit(self, job: WriteJob) -> Any:
        await trio.lowlevel.checkpoint()
        self.calls.append(trio.current_time())
        if isinstance(job, RetentionSweep):
            self.batches.append(job.batch)
            if self.largest_sweep is not None and job.batch > self.largest_sweep:
                raise StorageFull("the data directory is full")
        if len(self.calls) in self.fail_at:
            raise StorageError("commit failed: Input/output error")
        return run_job_now(
            self.storage, job, now_ms=NOV + 2 * DAY + int(trio.current_time() * 1000)
        )


async def test_loop_repeats_while_batches_fill_then_waits(
    storage: Storage, autojump_clock: Any
) -> None:
    admit(storage, [f"e{i}" for i in range(11)], now_ms=NOV)
    writer = FakeWriter(storage)
    sweep = RetentionSweep(DAY, 30 * DAY, batch=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_retention, interval_s=60), writer, sweep)
        await trio.sleep(150)
        nursery.cancel_scope.cancel()
    # a pass over the outbox (5, 5, 1) and the ledger (5, 5, 1) at once, then one
    # ledger pass per interval: its keys are ids, not times, so each pass reads it all
    assert writer.calls == pytest.approx([0, 0.05, 0.1, 60.1, 60.15, 60.2, 120.2, 120.25, 120.3])
    stats = sweep.statistics()
    assert (stats.sweeps, stats.failures, stats.outbox_removed, stats.retained_from) == (
        9,
        0,
        11,
        12,
    )
    assert outbox_eids(storage) == []


async def test_loop_survives_a_failed_sweep(storage: Storage, autojump_clock: Any) -> None:
    admit(storage, ["a"], now_ms=NOV)
    writer = FakeWriter(storage, fail_at=frozenset({1}))
    sweep = RetentionSweep(DAY, 30 * DAY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run_retention, interval_s=60), writer, sweep)
        await trio.sleep(61)
        nursery.cancel_scope.cancel()
    assert writer.calls == [0, 60]
    stats = sweep.statistics()
    assert (stats.sweeps, stats.failures, stats.outbox_removed) == (1, 1, 1)


async def test_on_a_full_map_smaller_sweeps_make_the_room(storage: Storage, autojump_clock: Any) -> None:
    # helper-77: a sweep of 5,000 deletions could lack the pages one of 50 finds (deleting
    # copies the pages it changes); it failed every interval and the node stayed full.
    admit(storage, [f"e{i}" for i in range(120)], now_ms=NOV)
    writer = FakeWriter(storage, largest_sweep=50)
    sweep = RetentionSweep(DAY, 30 * DAY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run_retention, interval_s=60), writer, sweep)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert outbox_eids(storage) == []
    assert writer.batches[:4] == [5000, 500, 50, 500]  # smaller at once, then back up step by step
    assert max(writer.calls) < 5


def test_sweep_result_is_a_struct() -> None:
    assert SweepResult(0, 0, 0, 0, False).more is False
    with pytest.raises(ValueError, match="batch"):
        RetentionSweep(1, 1, batch=0)
