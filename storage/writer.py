"""The one writer: group commit of many requests' work in one durable transaction.

Requests never open write transactions. They hand a `WriteJob` to the writer
and wait. The writer thread takes every waiting job (up to `max_group`),
runs them in order inside one LMDB write transaction, commits with one fsync,
and only then wakes each request with its own result. A job decides before it
writes (reads first, then puts), so a job that refuses (raises `JobRefused`)
has written nothing and its neighbours in the group are unaffected.

Why a dedicated thread: an LMDB write transaction belongs to the thread that
began it, and the fsync must not stall the event loop. The event loop learns
of a commit through `TrioToken.run_sync_soon`, the cheapest way back into trio.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import lmdb
import msgspec
import trio

from storage.env import Storage
from storage.errors import StorageError, WriterBusy, map_at_cap, storage_error
from storage.outbox import NEXT_SEQ, Appended
from storage.throttled_log import ThrottledLog

log = logging.getLogger("collector.writer")
_commit_failed = ThrottledLog(log, logging.ERROR)  # a full disk fails every commit until it clears


class JobRefused(Exception):
    """Raised by a job, before any write, to refuse its own work; carries the reason."""

    def __init__(self, reason: object) -> None:
        super().__init__(reason)
        self.reason = reason


class WriteContext:
    """What a job may use inside the group's transaction."""

    __slots__ = ("txn", "storage", "dbs", "next_seq", "now_ms", "appended", "stored_elsewhere")

    def __init__(
        self, txn: lmdb.Transaction, storage: Storage, next_seq: int, now_ms: int, *, feeding: bool = False
    ) -> None:
        self.txn = txn
        self.storage = storage
        self.dbs = storage.dbs
        self.next_seq = next_seq
        self.now_ms = now_ms
        # This group's outbox appends, for the writer's in-transaction consumer
        # (None: there is none, so jobs need not collect them).
        self.appended: list[Appended] | None = [] if feeding else None
        # Set by a job that stored something new outside the outbox (a replay chunk,
        # the readiness probe): such a commit, too, proves the directory writable again.
        self.stored_elsewhere = False

    def allocate_seqs(self, count: int) -> int:
        """Reserve `count` outbox sequence numbers; returns the first."""
        first = self.next_seq
        self.next_seq += count
        return first


class WriteJob(Protocol):
    def run(self, ctx: WriteContext) -> Any:
        """Read, decide, then write. Raise JobRefused before writing to refuse."""


def _solo(ticket: _Ticket) -> bool:
    # A job with `solo = True` commits in a transaction of its own: one whose
    # failure (a probe of free room) must not fail its neighbours' admissions.
    return getattr(ticket.job, "solo", False)


# Runs inside the group's transaction, after its jobs; may return what to run
# once that transaction has committed (for example counting what it did).
AtCommit = Callable[[WriteContext], Callable[[], None] | None]


class _AtCommitFailed(Exception):
    """LMDB refused what the in-transaction consumer wrote (the transaction must be aborted)."""


class WriterStatistics(msgspec.Struct, frozen=True):
    queued: int
    max_queue: int
    transactions: int
    jobs_committed: int
    jobs_refused: int
    jobs_failed: int
    busy_refusals: int
    last_group_size: int
    map_growths: int
    map_adoptions: int


KEPT_FOR_RETENTION = " (the last pages are kept for retention)"


class _ReserveReached(Exception):
    """The group's jobs would leave a map at its cap short of its reserve."""

    def __init__(self, tickets: list[_Ticket]) -> None:
        super().__init__()
        self.tickets = tickets


def _spends_reserve(ticket: _Ticket) -> bool:
    return bool(getattr(ticket.job, "spends_reserve", False))


class _Ticket:
    __slots__ = ("job", "done", "result", "error")

    def __init__(self, job: WriteJob) -> None:
        self.job = job
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _read_next_seq(txn: lmdb.Transaction, storage: Storage) -> int:
    raw = txn.get(NEXT_SEQ, db=storage.dbs.meta)
    return int.from_bytes(raw, "big") if raw else 1


class GroupCommitWriter:
    """Owns the writer thread. Start with `await nursery.start(writer.run)`."""

    def __init__(
        self,
        storage: Storage,
        *,
        max_queue: int = 2048,
        max_group: int = 256,
        clock_ms: Callable[[], int] | None = None,
        txn_clock: Callable[[lmdb.Transaction], int] | None = None,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        self.storage = storage
        self.max_queue = max_queue
        self.max_group = max_group
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        # The time of a write transaction, read inside it (storage/age_clock.SharedClock:
        # every process of a data directory the same): clock_ms when None.
        self.txn_clock = txn_clock
        self._on_commit = on_commit
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._token: trio.lowlevel.TrioToken | None = None
        # Runs at the end of every group that appended to the outbox, inside its
        # transaction, with the group's appends in ctx.appended (the visitor
        # projection folds them there). Set before the writer starts. It must
        # decide before it writes: a Python exception is logged and the group
        # commits without it; an LMDB error aborts, and the group is redone
        # without it. Either way the admissions never fail because of it.
        self.at_commit: AtCommit | None = None
        self.healthy = True  # False from a failed commit until the next one that stores something
        self._proved_writable = False
        self._stats = dict.fromkeys(
            (
                "transactions",
                "jobs_committed",
                "jobs_refused",
                "jobs_failed",
                "busy_refusals",
                "last_group_size",
                "map_growths",
                "map_adoptions",
            ),
            0,
        )

    # -- trio side ----------------------------------------------------------

    async def submit(self, job: WriteJob) -> Any:
        """Run `job` in the next group commit and return its result once durable.

        Raises WriterBusy at once when the queue is full, the job's JobRefused
        when it refused, StorageError when the commit could not be made.
        """
        if len(self._queue) >= self.max_queue or self._stopping:
            self._stats["busy_refusals"] += 1
            raise WriterBusy("the writer queue is full")
        ticket = _Ticket(job)
        with self._cond:
            self._queue.append(ticket)
            self._cond.notify()
        # If this task is cancelled while waiting, the job still commits; a
        # client retry with the same ids is then answered as a duplicate.
        await ticket.done.wait()
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer thread until cancelled; drains the queue before returning."""
        self._token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._thread_main, name="collector-writer", daemon=True)
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(queued=len(self._queue), max_queue=self.max_queue, **self._stats)

    # -- writer thread --------------------------------------------------------

    def _thread_main(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue and self._stopping:
                    return
                group = [self._queue.popleft()]
                if not _solo(group[0]):
                    self._take_more(group)
            self._commit_group(group)

    def _take_more(self, group: list[_Ticket]) -> None:
        """Add queued jobs to `group` up to max_group, stopping before a solo job (hold the lock)."""
        queue = self._queue
        while queue and len(group) < self.max_group and not _solo(queue[0]):
            group.append(queue.popleft())

    def _commit_group(self, group: list[_Ticket]) -> None:
        pending = list(group)
        at_commit = self.at_commit
        while pending:
            started = time.perf_counter()
            try:
                outcome = self._try_transaction(pending, at_commit)
            except _AtCommitFailed as failed:
                # LMDB refused the consumer's writes: the transaction is aborted;
                # redo the group without the consumer (its catch-up has it).
                log.error("in-transaction consumer failed; the group is redone without it: %s", failed)
                at_commit = None
                continue
            except lmdb.MapResizedError:
                # another process sharing the environment grew the map
                self._adopt_map_size()
                continue
            except lmdb.MapFullError:
                if self._grow():
                    continue
                self._fail(pending, map_at_cap(self.storage.max_map_size))
                return
            except lmdb.Error as exc:
                error = storage_error(exc, str(self.storage.path))
                message = str(error)
                _commit_failed("commit failed: %s", message, cause=message)
                self._fail(pending, error)
                return
            except _ReserveReached as reached:
                # aborted: those jobs fail, the rest (jobs that make room) are redone
                self.healthy = False
                for ticket in reached.tickets:
                    pending.remove(ticket)
                    ticket.result = None
                    ticket.error = map_at_cap(self.storage.max_map_size, KEPT_FOR_RETENTION)
                self._deliver(reached.tickets)
                continue
            if isinstance(outcome, _Ticket):
                # One job crashed mid-write: the whole transaction was aborted.
                # Fail that job alone and redo the rest of the group without it.
                pending.remove(outcome)
                self._deliver([outcome])
                continue
            if self._proved_writable:
                self.healthy = True
            self._stats["transactions"] += 1
            self._stats["last_group_size"] = len(pending)
            if self._on_commit is not None:
                self._on_commit(len(pending), time.perf_counter() - started)
            self._deliver(pending)
            return

    def _try_transaction(self, pending: list[_Ticket], at_commit: AtCommit | None) -> _Ticket | None:
        # While a write transaction is open (or being begun) no thread of this
        # process may resize the map; the guard is released before _grow and
        # _adopt_map_size run, so they never wait on it from here.
        with self.storage.write_guard():
            return self._run_group(pending, at_commit)

    def _run_group(self, pending: list[_Ticket], at_commit: AtCommit | None) -> _Ticket | None:
        txn = self.storage.env.begin(write=True)
        try:
            # Beginning may have waited for LMDB's writer lock (another worker
            # process committing): the jobs queued meanwhile join this group
            # instead of waiting for a transaction of their own.
            self._top_up(pending)
            now_ms = self.txn_clock(txn) if self.txn_clock is not None else self.clock_ms()
            ctx = WriteContext(
                txn, self.storage, _read_next_seq(txn, self.storage), now_ms, feeding=at_commit is not None
            )
            first_seq = ctx.next_seq
            kept_out = self._kept_out_of_reserve(txn, pending)
            for ticket in pending:
                ticket.result = ticket.error = None
                if ticket in kept_out:
                    ticket.error = map_at_cap(self.storage.max_map_size, KEPT_FOR_RETENTION)
                    continue
                try:
                    ticket.result = ticket.job.run(ctx)
                except JobRefused as refused:
                    ticket.error = refused
                except lmdb.MapFullError:
                    raise
                except Exception as exc:
                    log.exception("write job failed")
                    # (what failed is in the log above: a client is told only that it did)
                    ticket.error = StorageError(f"write failed: {exc}", for_client="the write failed")
                    txn.abort()
                    return ticket
            committed: Callable[[], None] | None = None
            if at_commit is not None and ctx.appended:
                try:
                    committed = at_commit(ctx)
                except (lmdb.MapFullError, lmdb.MapResizedError):
                    raise  # grow or adopt the map, then redo the group as for any job
                except lmdb.Error as exc:
                    raise _AtCommitFailed(str(exc)) from exc
                except Exception:
                    # It decides before it writes, so it wrote nothing.
                    log.exception("in-transaction consumer failed; the group commits without it")
            # Only a commit that stored something proves the directory writable
            # again: one of duplicates only, or of deletions, writes no new page.
            self._proved_writable = ctx.next_seq != first_seq or ctx.stored_elsewhere
            if ctx.next_seq != first_seq:
                txn.put(NEXT_SEQ, ctx.next_seq.to_bytes(8, "big"), db=self.storage.dbs.meta)
            # Checked again once the jobs have written: one group (a 1 MB replay chunk,
            # hundreds of batches) could take the map from above its reserve to below
            # it, and then even the sweep could not delete (helper-84).
            spent = [t for t in pending if t.error is None and not _spends_reserve(t)]
            if spent and self.storage.short_of_reserve(txn):
                raise _ReserveReached(spent)
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        # Checked after the commit (its writes and fsyncs take a while): one into
        # a data file removed or replaced meanwhile is lost at the next start, so
        # it is not acknowledged (503; the clients' retries are idempotent).
        gone = self.storage.files_intact()
        if gone is not None:
            raise lmdb.Error(gone)
        if committed is not None:
            committed()
        return None

    def _kept_out_of_reserve(self, txn: lmdb.Transaction, pending: list[_Ticket]) -> set[_Ticket]:
        """The jobs that may not take the map's last free pages.

        LMDB copies every page it changes, so even a deletion needs free pages: a
        map at its cap filled to the last page could not let its retention sweep
        remove anything, and stayed full (helpers 77 and 82). At the cap, the last
        pages are kept for the jobs that make room (`spends_reserve`).
        """
        if all(_spends_reserve(ticket) for ticket in pending) or not self.storage.short_of_reserve(txn):
            return set()
        self.healthy = False
        return {ticket for ticket in pending if not _spends_reserve(ticket)}

    def _top_up(self, pending: list[_Ticket]) -> None:
        if self._queue and len(pending) < self.max_group and not _solo(pending[0]):
            with self._cond:
                self._take_more(pending)

    def _grow(self) -> bool:
        # set_mapsize needs no open transaction in this process: run it on the
        # trio thread, whose read transactions never span a checkpoint.
        if self._token is None:
            grown = self.storage.grow()
        else:
            try:
                grown = bool(trio.from_thread.run_sync(self.storage.grow, trio_token=self._token))
            except trio.RunFinishedError:
                grown = self.storage.grow()
        if grown:  # a map already at its cap is not a growth, however often a commit tries
            self._stats["map_growths"] += 1
        return grown

    def _adopt_map_size(self) -> None:
        # like _grow: set_mapsize runs on the trio thread, between its reads
        self._stats["map_adoptions"] += 1
        if self._token is None:
            self.storage.adopt_map_size()
            return
        try:
            trio.from_thread.run_sync(self.storage.adopt_map_size, trio_token=self._token)
        except trio.RunFinishedError:
            self.storage.adopt_map_size()

    def _fail(self, tickets: list[_Ticket], error: BaseException) -> None:
        self.healthy = False
        for ticket in tickets:
            ticket.result = None
            ticket.error = error
        self._deliver(tickets)

    def _deliver(self, tickets: list[_Ticket]) -> None:
        for ticket in tickets:
            if ticket.error is None:
                self._stats["jobs_committed"] += 1
            elif isinstance(ticket.error, JobRefused):
                self._stats["jobs_refused"] += 1
            else:
                self._stats["jobs_failed"] += 1

        def wake() -> None:
            for ticket in tickets:
                ticket.done.set()

        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(wake)


def run_job_now(storage: Storage, job: WriteJob, *, now_ms: int | None = None) -> Any:
    """Run one job in its own durable transaction, outside any event loop (CLI tools)."""
    while True:
        try:
            txn = storage.env.begin(write=True)
        except lmdb.MapResizedError:
            storage.adopt_map_size()
            continue
        try:
            ctx = WriteContext(
                txn, storage, _read_next_seq(txn, storage), now_ms or int(time.time() * 1000)
            )
            first_seq = ctx.next_seq
            result = job.run(ctx)
            if ctx.next_seq != first_seq:
                txn.put(NEXT_SEQ, ctx.next_seq.to_bytes(8, "big"), db=storage.dbs.meta)
            txn.commit()
            return result
        except lmdb.MapFullError:
            txn.abort()
            if not storage.grow():
                raise map_at_cap(storage.max_map_size) from None
        except lmdb.MapResizedError:
            txn.abort()
            storage.adopt_map_size()
        except BaseException:
            txn.abort()
            raise
