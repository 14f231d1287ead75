"""Retention: bounded sweeps that keep the data directory from growing without end.

Outbox entries go once they are older than the retention period AND every
registered consumer's cursor has passed them (a consumer without a cursor
yet holds everything). Idempotency records go once their window has ended,
so a retry inside the window is always recognised. Each sweep is one write
job handed to the group-commit writer and touches at most `batch` rows of
each kind; the idempotency scan resumes where the previous one stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import trio

from storage import idempotency, outbox
from storage.writer import GroupCommitWriter, WriteContext

RETAINED_FROM = b"outbox_retained_from"
IDEM_SWEEP_POS = b"idem_sweep_pos"


class SweepResult(msgspec.Struct, frozen=True):
    outbox_removed: int
    idempotency_removed: int
    more: bool  # a batch limit was hit: sweep again soon


class RetentionSweep:
    def __init__(
        self,
        *,
        outbox_retention_ms: int,
        idempotency_window_ms: int,
        consumers: Sequence[str] = (),
        batch: int = 5000,
    ) -> None:
        self.outbox_retention_ms = outbox_retention_ms
        self.idempotency_window_ms = idempotency_window_ms
        self.consumers = consumers
        self.batch = batch

    def _outbox_floor(self, ctx: WriteContext) -> int:
        """The highest sequence every consumer has passed (no consumers: no limit)."""
        floor = None
        for name in self.consumers:
            raw = ctx.txn.get(name.encode(), db=ctx.dbs.cursors)
            position = int.from_bytes(raw, "big") if raw else 0
            floor = position if floor is None else min(floor, position)
        return 2**63 if floor is None else floor

    def run(self, ctx: WriteContext) -> SweepResult:
        txn, dbs, now = ctx.txn, ctx.dbs, ctx.now_ms
        floor = self._outbox_floor(ctx)
        removed_outbox = 0
        cursor = txn.cursor(db=dbs.outbox)
        more = False
        last_removed = 0
        if cursor.first():
            while True:
                seq = int.from_bytes(cursor.key(), "big")
                record = outbox.decode(cursor.value())
                if seq > floor or now - record.committed_ms < self.outbox_retention_ms:
                    break
                if removed_outbox >= self.batch:
                    more = True
                    break
                last_removed = seq
                removed_outbox += 1
                # delete() moves to the next row; past the last one the cursor is unset
                if not cursor.delete() or not cursor.key():
                    break
        if last_removed:
            txn.put(RETAINED_FROM, (last_removed + 1).to_bytes(8, "big"), db=dbs.meta)

        removed_idem = 0
        scanned = 0
        position = txn.get(IDEM_SWEEP_POS, db=dbs.meta) or b""
        cursor = txn.cursor(db=dbs.idempotency)
        found = cursor.set_range(position) if position else cursor.first()
        while found and scanned < self.batch:
            scanned += 1
            remembered = idempotency.decode(cursor.value())
            if not idempotency.live(remembered, now, self.idempotency_window_ms):
                removed_idem += 1
                found = cursor.delete() and bool(cursor.key())
            else:
                found = cursor.next()
        if found:
            txn.put(IDEM_SWEEP_POS, cursor.key(), db=dbs.meta)
            more = True
        else:
            txn.delete(IDEM_SWEEP_POS, db=dbs.meta)
        return SweepResult(removed_outbox, removed_idem, more)


async def run_retention(
    writer: GroupCommitWriter,
    sweep: RetentionSweep,
    *,
    interval_s: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sweep every `interval_s`, and again at once while a sweep hit its batch limit."""
    task_status.started()
    while True:
        result: SweepResult = await writer.submit(sweep)
        if not result.more:
            await trio.sleep(interval_s)
        else:
            await trio.sleep(0.05)  # let request traffic through between batches
