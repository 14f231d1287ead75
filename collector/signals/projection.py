"""The visitor projection's task: tail the outbox into visitor records.

It hands `FoldVisitors` jobs to the group-commit writer, so the records and
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
from storage.feed import CommitFeed
from storage.outbox import get_cursor, last_seq
from storage.visitors import CURSOR, FoldResult, FoldVisitors
from storage.writer import GroupCommitWriter

log = logging.getLogger("collector.projection")


class ProjectionStatistics(msgspec.Struct, frozen=True):
    cursor: int
    folded: int
    failures: int
    passes: int  # fold jobs committed (each is one writer job)
    fed_passes: int  # of those, passes that took the commit feed instead of reading the outbox


class VisitorProjection:
    def __init__(self, writer: GroupCommitWriter, *, batch: int = 2048, idle_s: float = 0.25) -> None:
        self.writer = writer
        if writer.feed is None:
            writer.feed = CommitFeed()  # admissions hand their facts over once committed
        self.feed = writer.feed
        self.batch = batch
        self.idle_s = idle_s
        self._cursor = get_cursor(writer.storage, CURSOR)
        self._folded = 0
        self._failures = 0
        self._passes = 0
        self._fed_passes = 0

    def statistics(self) -> ProjectionStatistics:
        return ProjectionStatistics(
            self._cursor, self._folded, self._failures, self._passes, self._fed_passes
        )

    def lag(self) -> int:
        """Committed outbox entries the projection has not folded yet."""
        return max(0, last_seq(self.writer.storage) - self._cursor)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if self.lag() == 0:
                await trio.sleep(self.idle_s)
                continue
            try:
                result: FoldResult = await self.writer.submit(FoldVisitors(self.batch, self.feed))
            except (WriterBusy, StorageError) as exc:
                self._failures += 1
                log.warning("visitor projection fold not committed, retrying: %s", exc)
                await trio.sleep(max(self.idle_s, 1.0))
                continue
            self._cursor, self._folded = result.cursor, self._folded + result.folded
            self._passes += 1
            self._fed_passes += result.fed
            if not result.more:
                await trio.sleep(self.idle_s)
