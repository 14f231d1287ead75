"""The visitor projection's catch-up task: tail the outbox into visitor records.

In the steady state every group folds its own events before it commits
(`storage.visitors.FoldAtCommit`, in every worker) and this task finds
nothing to do. It catches up what that skipped (after a restart or an
upgrade, or a group whose appends did not continue the cursor) by handing
`FoldVisitors` jobs to the group-commit writer, so the records and
the cursor commit together. After a fold that hit its batch limit it goes
again at once; once caught up it checks every `idle_s` whether the outbox
has grown (a read, no write transaction while there is nothing to fold). A
fold the writer cannot take (busy, disk full) is tried again later: the
projection lags, it never takes the server down. Exactly one process runs
it (worker 0 under `serve --workers`).
"""

from __future__ import annotations

import logging

import msgspec
import trio

from storage.errors import StorageError, WriterBusy
from storage.visitors import FoldResult, FoldVisitors, fold_position, log_rebuilt
from storage.writer import GroupCommitWriter

log = logging.getLogger("collector.projection")


class ProjectionStatistics(msgspec.Struct, frozen=True):
    cursor: int
    lag: int  # committed outbox entries not folded yet
    folded: int
    failures: int
    passes: int  # fold jobs committed (each is one writer job)
    rebuilt: int = 0  # visitor records that did not decode, started afresh by these jobs


class VisitorProjection:
    def __init__(self, writer: GroupCommitWriter, *, batch: int = 2048, idle_s: float = 0.25) -> None:
        self.writer = writer
        self.batch = batch
        self.idle_s = idle_s
        self._folded = 0
        self._failures = 0
        self._passes = 0
        self._rebuilt = 0

    def statistics(self) -> ProjectionStatistics:
        cursor, head = fold_position(self.writer.storage)
        return ProjectionStatistics(
            cursor, max(0, head - cursor), self._folded, self._failures, self._passes, self._rebuilt
        )

    def lag(self) -> int:
        """Committed outbox entries not folded yet (by either way: see storage.visitors)."""
        cursor, head = fold_position(self.writer.storage)
        return max(0, head - cursor)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if self.lag() == 0:
                await trio.sleep(self.idle_s)
                continue
            try:
                result: FoldResult = await self.writer.submit(FoldVisitors(self.batch))
            except (WriterBusy, StorageError) as exc:
                self._failures += 1
                log.warning("visitor projection fold not committed, retrying: %s", exc)
                await trio.sleep(max(self.idle_s, 1.0))
                continue
            self._folded += result.folded
            self._passes += 1
            if result.rebuilt:
                self._rebuilt += len(result.rebuilt)
                log_rebuilt(result.rebuilt)
            if not result.more:
                await trio.sleep(self.idle_s)
