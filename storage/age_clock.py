"""The writer's clock: the wall clock, except that it does not follow a sudden step at once.

Every age the writer judges is wall-clock milliseconds against a record's own
stamp: the outbox and replay retention, the idempotency window (the sweep
removes a record past it, and a retry is then a new event). One minute of a
clock set days ahead (a bad NTP answer, a VM restored from a snapshot, a
machine booting without a real-time clock that then corrects itself) made the retention sweep remove a week of stored
events and their idempotency records, and their retries were then stored and
billed again (helper-108). Records stamped during a step back looked that much
older once it was corrected, and their retries were stored again (helper-112).

So the wall clock is believed while it keeps pace (within SLACK_MS) with the
time since boot (boot_seconds: monotonic, and counting a suspension). When it steps away from the time that has really passed,
ahead or back, the writer goes on at real speed from the last time it
believed, until the wall clock has stayed away for TRUST_AFTER_S: a correction
that holds (a clock that was wrong and was put right) is then believed. A step
that is undone within that time (the usual glitch) is never seen in a stamp.

A new process (a restarted worker, serve restarted by systemd) starts from the
anchor worker 0's writer publishes in `meta` (SharedClock: the time believed,
against the time since boot, which every process of one boot shares), so a restart during
a step does not believe it at once (helper-111). After a reboot the anchor says
nothing, and the wall clock is believed as the process finds it.

Receipt times, billing periods and signature windows stay on the wall clock:
when each process had a guard of its own, workers disagreeing about them split a
request's billing period by the worker that answered (helper-112). The writer's
time itself is one for every process: see SharedClock.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from storage.errors import StorageError
from storage.throttled_log import ThrottledLog

log = logging.getLogger("collector.storage")

SLACK_MS = 5_000  # ordinary NTP slewing and scheduling delays stay well inside this
REFERENCE_S = 60.0  # how old the reading a drift is measured against gets (NTP slews 0.03 s in it)
TRUST_AFTER_S = 600.0
ANCHOR_KEY = b"age_clock_anchor"  # in meta: see encode_anchor
_ANCHOR = struct.Struct(">qd")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

Reading = tuple[int, float]  # (wall ms, steady s)


class AgeClock:
    """Callable: milliseconds for stamping and judging ages, from `wall_ms` checked by `steady_s`."""

    def __init__(
        self, wall_ms: Callable[[], int], steady_s: Callable[[], float] | None = None, *, seed: Reading | None = None
    ) -> None:
        self._wall_ms = wall_ms
        self._steady_s = steady_s or boot_seconds
        self._believed: Reading | None = seed  # the last reading believed
        # A reading believed at least REFERENCE_S ago: a clock gaining a little each read (a
        # second apart, once watch() reads it) stays inside SLACK_MS of the last reading, and
        # 3 s a second for 45 s went unseen (helper-121). Against this it shows.
        self._reference: Reading | None = seed
        self._away_since: float | None = None  # steady s when the wall clock was found where it is
        self._away_by = 0  # ms it was found away by then (a new step starts the wait again)
        # (a wall clock that is stuck or runs wild steps again every few seconds)
        self._stepped = ThrottledLog(log, logging.WARNING, clock=self._steady_s)
        self._lock = threading.Lock()  # (the writer thread reads it; so may the sweep's anchor)

    def __call__(self) -> int:
        wall, steady = self._wall_ms(), self._steady_s()
        with self._lock:
            if self._believed is None or self._reference is None:
                self._believed = self._reference = (wall, steady)
                return wall
            expected = _projected(self._believed, steady)
            if self._keeps_pace(wall, steady):
                self._away_since = None
                self._believed = (wall, steady)
                if steady - self._reference[1] >= REFERENCE_S:
                    self._reference = self._believed
                return wall
            away_by = wall - expected
            # A second step while the first is waited out starts the wait again: the
            # 10 minutes are of the clock staying where it now is (helper-116: a day's
            # step, then a week's 599 s later, was believed a second after the second).
            if self._away_since is None or abs(away_by - self._away_by) > SLACK_MS:
                self._away_since, self._away_by = steady, away_by
                self._stepped(
                    "the wall clock stepped %+.0f s away from the time that passed: the writer's stamps and"
                    " ages (retention, the idempotency window) go on at real speed until it has stayed"
                    " there %.0f s",
                    away_by / 1000, TRUST_AFTER_S, cause="wall clock step",
                )
            if steady - self._away_since >= TRUST_AFTER_S:
                # (with its size: a later step's own warning may have been throttled, helper-121)
                log.warning("the wall clock stayed %+.0f s away from the time the writer kept for %.0f s:"
                            " it is believed from now on", away_by / 1000, TRUST_AFTER_S)
                self._away_since = None
                self._believed = self._reference = (wall, steady)
                return wall
            return expected

    def steady_s(self) -> float:
        return self._steady_s()

    def keeping_pace(self) -> bool:
        """Whether the wall clock keeps pace and no step is being waited out: a reading
        now would change nothing. (Looks only: the guard moves only when read.)"""
        wall, steady = self._wall_ms(), self._steady_s()
        with self._lock:
            return self._away_since is None and self._keeps_pace(wall, steady)

    def _keeps_pace(self, wall: int, steady: float) -> bool:
        """(Under the lock.) Within SLACK_MS of the last reading believed and of the reference."""
        if self._believed is None or self._reference is None:
            return False
        return (abs(wall - _projected(self._believed, steady)) <= SLACK_MS
                and abs(wall - _projected(self._reference, steady)) <= SLACK_MS)

    def anchor(self) -> Reading | None:
        """The time believed, as of now on the steady clock (None before a reading)."""
        with self._lock:
            if self._believed is None:
                return None
            steady = self._steady_s()
            return _projected(self._believed, steady), steady


PUBLISH_WHEN_OFF_MS = 1_000  # how far worker 0's time may get from what it last published


class SharedClock:
    """The writer's time for every process of one data directory: worker 0's guard
    decides, and the others stamp with what it publishes in `meta`, read inside their
    own write transaction.

    Each worker kept a guard of its own, so a worker restarted during a clock step
    went on distrusting it after worker 0 had believed it, and worker 0's sweep judged
    that worker's new records by its own time, days on: it removed them at once, and
    their retries were stored again (helper-121). LMDB serialises write transactions
    across processes, so a time published in one is the time of every later one, in
    every process; it is also the anchor a new process starts from.
    """

    def __init__(self, guard: AgeClock, boot: bytes, *, decides: bool) -> None:
        self._guard = guard
        self._boot = boot
        self.decides = decides

    def now_in(self, txn: Any, meta_db: Any) -> int:
        """Milliseconds for the write transaction `txn` (meta_db: where the anchor is).

        Worker 0's guard is read only here, inside a transaction (its watch() submits
        an empty one when the clock is off pace), so the transaction where it comes
        to believe a step is the one that publishes it: read in a watch outside any, the new time
        reached the others only at worker 0's next write, and what they stamped
        meanwhile its sweep then removed (helper-124). What is published is compared
        with what is stored, not remembered: a transaction that is aborted and
        redone publishes again.
        """
        if not self._boot:  # (no anchor without a boot id: each process on its own)
            return self._guard()
        stored = decode_anchor(txn.get(ANCHOR_KEY, db=meta_db), self._boot)
        if not self.decides:
            # (before worker 0's first commit, its own guard)
            return self._guard() if stored is None else _projected(stored, self._guard.steady_s())
        now = self._guard()
        reading = self._guard.anchor()
        if reading is not None and (
            stored is None or abs(reading[0] - _projected(stored, reading[1])) > PUBLISH_WHEN_OFF_MS
        ):
            txn.put(ANCHOR_KEY, encode_anchor(reading, self._boot), db=meta_db)
        return now


class _Tick:
    """A write transaction with nothing in it but the writer's time (SharedClock.now_in)."""

    def run(self, ctx: Any) -> None:
        return None


async def watch(guard: AgeClock, submit: Callable[[Any], Awaitable[Any]], every_s: float = 1.0) -> None:
    """Each second, requests or none, a write transaction that reads the guard, when the
    wall clock has stepped or a step is being waited out.

    A guard learns of a step when it is read. Read only at commits, an idle worker
    started its 10 minutes at its next one, minutes late (helper-116). Only when
    needed: a transaction always in flight held SIGTERM for as long as another
    process held LMDB's writer lock, and filled the commit metrics (helper-125).
    `submit`: the writer's. (A transaction that writes nothing is not synced.)
    """
    while True:
        if not guard.keeping_pace():
            with contextlib.suppress(StorageError):  # (a busy or full writer: the next second)
                await submit(_Tick())
        await trio.sleep(every_s)


def boot_seconds() -> float:
    """Seconds since boot, counting time suspended (CLOCK_BOOTTIME, Linux).

    The monotonic clock stops while a VM is suspended, so a resume would look
    like a step of the wall clock, and the writer would stamp the suspended time
    away for 10 minutes. Every process of one boot shares this clock, as the
    anchor needs.
    """
    return time.clock_gettime(_BOOT_CLOCK)


_BOOT_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def _projected(reading: Reading, steady: float) -> int:
    return reading[0] + int((steady - reading[1]) * 1000)


def encode_anchor(reading: Reading, boot_id: bytes) -> bytes:
    return _ANCHOR.pack(*reading) + boot_id


def decode_anchor(raw: bytes | memoryview | None, boot_id: bytes) -> Reading | None:
    """The recorded anchor when this boot recorded it (the time since boot restarts with a boot)."""
    if raw is None or not boot_id:
        return None
    raw = bytes(raw)
    if len(raw) != _ANCHOR.size + len(boot_id) or raw[_ANCHOR.size :] != boot_id:
        return None
    wall, steady = _ANCHOR.unpack(raw[: _ANCHOR.size])
    return int(wall), float(steady)


def boot_id() -> bytes:
    """This boot's id (Linux), or b"" where there is none: no anchor is kept then."""
    try:
        return BOOT_ID.read_bytes().strip()
    except OSError:
        return b""
