"""The writer's clock: the wall clock, except that it does not follow a sudden step forward at once.

Every age the writer judges is wall-clock milliseconds against a record's own
stamp: the outbox and replay retention, the idempotency window (a retry after
it is a new event). One minute of a clock set days ahead (a bad NTP answer,
a VM restored from a snapshot, a machine booting without a real-time clock
that then corrects itself) made the retention sweep remove a week of stored
events and their idempotency records, and their retries were then stored and
billed again (helper-108).

So the wall clock is believed while it keeps pace with the monotonic clock
(within SLACK_MS) or steps back (ages only shrink then: nothing is removed
early). When it runs ahead of the time that has really passed, the writer
goes on from the last reading it believed, at real speed, until the wall
clock has stayed ahead for TRUST_AFTER_S: a correction that holds (a clock
that was slow and was put right) is then believed. A forward step therefore
removes nothing for TRUST_AFTER_S, and what a step that lasts less than that
would have expired is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("collector.storage")

SLACK_MS = 5_000  # ordinary NTP slewing and scheduling delays stay well inside this
TRUST_AFTER_S = 600.0


class AgeClock:
    """Callable: milliseconds for stamping and judging ages, from `wall_ms` checked by `steady_s`."""

    def __init__(self, wall_ms: Callable[[], int], steady_s: Callable[[], float] = time.monotonic) -> None:
        self._wall_ms = wall_ms
        self._steady_s = steady_s
        self._believed: tuple[int, float] | None = None  # (wall ms, steady s) of the last reading believed
        self._ahead_since: float | None = None  # steady s when the wall clock was first found ahead
        self._lock = threading.Lock()  # (the writer thread reads it; so may a test or a command)

    def __call__(self) -> int:
        wall, steady = self._wall_ms(), self._steady_s()
        with self._lock:
            if self._believed is None:
                self._believed = (wall, steady)
                return wall
            expected = self._believed[0] + int((steady - self._believed[1]) * 1000)
            if wall <= expected + SLACK_MS:
                self._ahead_since = None
                self._believed = (wall, steady)
                return wall
            if self._ahead_since is None:
                self._ahead_since = steady
                log.warning(
                    "the wall clock jumped %.0f s ahead of the time that passed: ages (retention, the"
                    " idempotency window) go on at real speed for %.0f s before it is believed",
                    (wall - expected) / 1000, TRUST_AFTER_S,
                )
            if steady - self._ahead_since >= TRUST_AFTER_S:
                log.warning("the wall clock stayed ahead for %.0f s: it is believed from now on", TRUST_AFTER_S)
                self._ahead_since = None
                self._believed = (wall, steady)
                return wall
            return expected
