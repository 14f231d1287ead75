"""Retention: bounded sweeps that keep the data directory from growing without end.

Outbox entries go once they are older than the retention period AND every
registered consumer's cursor has passed them (a consumer without a cursor
yet holds everything). The lowest seq still required is kept in meta under
`outbox_retained_from`, so `check` can tell removed rows from lost ones.

Idempotency records go only once their window has ended, so a retry inside
the window is always recognised. Their keys are (clientId, eid), not time,
so expired records are scattered: each sweep scans at most `batch` records
from where the previous one stopped (meta `idem_sweep_pos`), wrapping around.

Session-replay chunks go once older than the replay retention (received
time). Their keys are (client, site, session, seq), so they are swept like
idempotency records: at most `batch` scanned per sweep, resuming from meta
`replay_sweep_pos`. Chunks are large (up to 1 MB) and the writer's
transaction copies every value it reads, so a sweep also stops after reading
REPLAY_SWEEP_BYTES.

A record any sweep cannot read (damaged on disk) is never removed: its time
is unknown, and `check` reports it. The sweep steps over it and goes on.

Each sweep is one write job handed to the group-commit writer; it only reads
and deletes, so running it again in a retried group is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import trio

from storage import idempotency, outbox, replay
from storage.errors import UNREADABLE_RECORD, StorageError, StorageFull
from storage.writer import GroupCommitWriter, WriteContext

log = logging.getLogger("collector.retention")

RETAINED_FROM = b"outbox_retained_from"
IDEM_SWEEP_POS = b"idem_sweep_pos"
# When the last sweep ran. Written by every sweep so that each one commits: LMDB
# reuses the pages a transaction freed only once a later one has committed, and on
# a full map nothing else may commit until it does.
LAST_SWEEP = b"retention_last_sweep"
REPLAY_SWEEP_BYTES = 32 * 1024 * 1024
_NO_CONSUMERS = 2**64 - 1


class SweepResult(msgspec.Struct, frozen=True):
    outbox_removed: int
    idempotency_removed: int
    idempotency_scanned: int
    retained_from: int  # outbox seqs below this are gone (0: none removed yet)
    more: bool  # a batch limit was hit: sweep again soon
    replay_removed: int = 0
    replay_scanned: int = 0


class RetentionStatistics(msgspec.Struct, frozen=True):
    sweeps: int
    failures: int
    outbox_removed: int
    idempotency_removed: int
    retained_from: int
    replay_removed: int


class RetentionSweep:
    """A WriteJob removing expired outbox entries and idempotency records, `batch` at most each."""

    spends_reserve = True  # it makes room: the last pages of a full map are for it (storage.writer)

    def __init__(
        self,
        outbox_retention_ms: int,
        idempotency_window_ms: int,
        consumers: Sequence[str] = (),
        batch: int = 5000,
        replay_retention_ms: int | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.outbox_retention_ms = outbox_retention_ms
        self.idempotency_window_ms = idempotency_window_ms
        self.consumers = list(consumers)
        self.batch = batch
        self.replay_retention_ms = replay_retention_ms  # None: replay chunks are kept
        # Totals of committed sweeps, kept by run_retention (a job may run twice
        # when its group is retried, so run() itself counts nothing).
        self._stats = dict.fromkeys(
            ("sweeps", "failures", "outbox_removed", "idempotency_removed", "replay_removed"), 0
        )
        self._retained_from = 0
        self._kept_logged: list[int] = []  # the unreadable outbox seqs last logged

    def run(self, ctx: WriteContext) -> SweepResult:
        outbox_removed, outbox_more, retained_from = self._sweep_outbox(ctx)
        idem_removed, scanned, idem_more = self._sweep_idempotency(ctx)
        replay_removed, replay_scanned, replay_more = self._sweep_replay(ctx)
        ctx.txn.put(LAST_SWEEP, ctx.now_ms.to_bytes(8, "big"), db=ctx.dbs.meta)
        return SweepResult(
            outbox_removed,
            idem_removed,
            scanned,
            retained_from,
            outbox_more or idem_more or replay_more,
            replay_removed,
            replay_scanned,
        )

    def _consumer_floor(self, ctx: WriteContext) -> int:
        """The highest seq every registered consumer has passed."""
        floor = _NO_CONSUMERS
        for name in self.consumers:
            raw = ctx.txn.get(name.encode(), db=ctx.dbs.cursors)
            floor = min(floor, int.from_bytes(raw, "big") if raw else 0)
        return floor

    def _sweep_outbox(self, ctx: WriteContext) -> tuple[int, bool, int]:
        txn, dbs = ctx.txn, ctx.dbs
        raw = txn.get(RETAINED_FROM, db=dbs.meta)
        retained_from = int.from_bytes(raw, "big") if raw else 0
        floor = self._consumer_floor(ctx)
        cutoff = ctx.now_ms - self.outbox_retention_ms
        removed = 0
        more = False
        kept: list[int] = []  # seqs of records that do not decode
        cursor = txn.cursor(db=dbs.outbox)
        positioned = cursor.first()
        while positioned:
            seq = int.from_bytes(cursor.key(), "big")
            if seq > floor:
                break
            try:
                committed_ms = outbox.decode(cursor.value()).committed_ms
            except UNREADABLE_RECORD:
                # Never guess about a record we cannot read: keep it (`check` reports
                # it) and go on, or one damaged row would hold every later one forever.
                kept.append(seq)
                if len(kept) == self.batch:
                    break  # a store this damaged waits for its operator, not a busy loop
                positioned = cursor.next()
                continue
            if committed_ms > cutoff:
                break  # commit order is time order: everything after is younger
            if removed == self.batch:
                more = True
                break
            removed += 1
            retained_from = max(retained_from, seq + 1)
            # delete() moves to the next row; past the last one the cursor is unpositioned
            positioned = cursor.delete() and bool(cursor.key())
        if removed:
            txn.put(RETAINED_FROM, retained_from.to_bytes(8, "big"), db=dbs.meta)
        if kept != self._kept_logged:  # once, not at every interval
            self._kept_logged = kept
            if kept:
                log.warning(
                    "retention keeps %d outbox records that do not decode, the first at seq %d;"
                    " `collector check` lists them",
                    len(kept),
                    kept[0],
                )
        return removed, more, retained_from

    def _sweep_idempotency(self, ctx: WriteContext) -> tuple[int, int, bool]:
        txn, dbs = ctx.txn, ctx.dbs
        position = txn.get(IDEM_SWEEP_POS, db=dbs.meta)
        cursor = txn.cursor(db=dbs.idempotency)
        positioned = cursor.set_range(position) if position else cursor.first()
        removed = scanned = 0
        while positioned and scanned < self.batch:
            scanned += 1
            try:
                record = idempotency.decode(cursor.value())
            except UNREADABLE_RECORD:
                positioned = cursor.next()  # unreadable: leave it for `check` to report
                continue
            if idempotency.live(record, ctx.now_ms, self.idempotency_window_ms):
                positioned = cursor.next()
            else:
                removed += 1
                positioned = cursor.delete() and bool(cursor.key())
        if positioned:
            txn.put(IDEM_SWEEP_POS, cursor.key(), db=dbs.meta)  # the next key to look at
        elif position is not None:
            txn.delete(IDEM_SWEEP_POS, db=dbs.meta)  # reached the end: the next pass wraps
        return removed, scanned, positioned

    def _sweep_replay(self, ctx: WriteContext) -> tuple[int, int, bool]:
        if self.replay_retention_ms is None:
            return 0, 0, False
        txn, dbs = ctx.txn, ctx.dbs
        cutoff = ctx.now_ms - self.replay_retention_ms
        position = txn.get(replay.SWEEP_POS, db=dbs.meta)
        cursor = txn.cursor(db=dbs.replay)
        positioned = cursor.set_range(position) if position else cursor.first()
        removed = scanned = read = 0
        while positioned and scanned < self.batch and read < REPLAY_SWEEP_BYTES:
            scanned += 1
            value = cursor.value()
            read += len(value)
            try:
                received_ms = replay.decode_head(value).received_ms
            except UNREADABLE_RECORD:
                positioned = cursor.next()  # unreadable: leave it for `check` to report
                continue
            if received_ms > cutoff:
                positioned = cursor.next()
            else:
                removed += 1
                positioned = cursor.delete() and bool(cursor.key())
        if positioned:
            txn.put(replay.SWEEP_POS, cursor.key(), db=dbs.meta)
        elif position is not None:
            txn.delete(replay.SWEEP_POS, db=dbs.meta)
        return removed, scanned, positioned

    def count_outcome(self, result: SweepResult | None) -> None:
        """Add a committed sweep (None: a failed one) to the statistics."""
        if result is None:
            self._stats["failures"] += 1
            return
        self._stats["sweeps"] += 1
        self._stats["outbox_removed"] += result.outbox_removed
        self._stats["idempotency_removed"] += result.idempotency_removed
        self._stats["replay_removed"] += result.replay_removed
        self._retained_from = result.retained_from

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(retained_from=self._retained_from, **self._stats)


async def run_retention(
    writer: GroupCommitWriter,
    sweep: RetentionSweep,
    *,
    interval_s: float,
    pause_s: float = 0.05,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Submit `sweep` now and every `interval_s`; again after `pause_s` while it hits its batch limit.

    A sweep the writer cannot commit (busy, disk full) is logged and tried
    again next interval: retention never takes the server down.
    """
    task_status.started()
    full_batch = sweep.batch
    while True:
        try:
            result: SweepResult = await writer.submit(sweep)
        except StorageFull as exc:
            sweep.count_outcome(None)
            if sweep.batch > 1:
                # Deleting copies the pages it changes, so on a full map a big sweep
                # can lack the pages a small one finds: try smaller at once, for the
                # sweep is what makes room.
                sweep.batch = max(1, sweep.batch // 10)
                log.warning("retention sweep not committed (%s): trying again with batches of %d", exc, sweep.batch)
                await trio.sleep(pause_s)
                continue
            log.warning("retention sweep not committed, next try in %g s: %s", interval_s, exc)
            await trio.sleep(interval_s)
            continue
        except StorageError as exc:
            log.warning("retention sweep not committed, next try in %g s: %s", interval_s, exc)
            sweep.count_outcome(None)
            await trio.sleep(interval_s)
            continue
        sweep.batch = min(full_batch, sweep.batch * 10)  # back to full size step by step
        sweep.count_outcome(result)
        if result.outbox_removed or result.idempotency_removed or result.replay_removed:
            log.info(
                "retention removed %d outbox entries, %d idempotency records, %d replay chunks",
                result.outbox_removed,
                result.idempotency_removed,
                result.replay_removed,
            )
        # the short pause lets request traffic through between full batches
        await trio.sleep(pause_s if result.more else interval_s)
