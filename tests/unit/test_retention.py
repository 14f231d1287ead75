"""Retention sweeps over a real LMDB: outbox age and consumer cursors, idempotency windows."""

from __future__ import annotations

from pathlib import Path

from storage import idempotency, outbox
from storage.env import Storage
from storage.retention import RetentionSweep
from storage.writer import run_job_now
from tests.unit.test_storage import admission

DAY = 86_400_000


def idem_count(storage: Storage) -> int:
    with storage.read() as txn:
        return sum(1 for _ in txn.cursor(db=storage.dbs.idempotency))


def test_outbox_and_idempotency_retention(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["old1", "old2"]), now_ms=1 * DAY)
    run_job_now(storage, admission(["new1"]), now_ms=5 * DAY)
    sweep = RetentionSweep(outbox_retention_ms=3 * DAY, idempotency_window_ms=7 * DAY)
    result = run_job_now(storage, sweep, now_ms=6 * DAY)
    assert (result.outbox_removed, result.idempotency_removed) == (2, 0)
    assert [r.eid for _, r in outbox.iter_outbox(storage)] == ["new1"]
    assert idem_count(storage) == 3  # ids are remembered for their whole window
    result = run_job_now(storage, sweep, now_ms=8 * DAY + 1)
    assert result.idempotency_removed == 2 and idem_count(storage) == 1
    # a retry of a still-remembered id remains a duplicate
    again = run_job_now(storage, admission(["new1"]), now_ms=8 * DAY + 2)
    assert again.duplicate == [True]


def test_consumer_cursor_holds_the_outbox(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a", "b", "c"]), now_ms=DAY)
    with storage.env.begin(write=True) as txn:
        txn.put(b"signals", (1).to_bytes(8, "big"), db=storage.dbs.cursors)
    sweep = RetentionSweep(outbox_retention_ms=1, idempotency_window_ms=7 * DAY, consumers=["signals", "live"])
    assert run_job_now(storage, sweep, now_ms=9 * DAY).outbox_removed == 0  # "live" has no cursor
    with storage.env.begin(write=True) as txn:
        txn.put(b"live", (3).to_bytes(8, "big"), db=storage.dbs.cursors)
    assert run_job_now(storage, sweep, now_ms=9 * DAY).outbox_removed == 1  # "signals" passed only seq 1


def test_sweeps_are_bounded_and_resume(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission([f"e{i}" for i in range(10)]), now_ms=DAY)
    sweep = RetentionSweep(outbox_retention_ms=DAY, idempotency_window_ms=DAY, batch=4)
    totals = [0, 0]
    for _ in range(5):
        result = run_job_now(storage, sweep, now_ms=3 * DAY)
        totals[0] += result.outbox_removed
        totals[1] += result.idempotency_removed
        if not result.more:
            break
    assert totals == [10, 10]
    assert idempotency.ledger_key("acme", "e0")  # keys are still well-formed after deletes
