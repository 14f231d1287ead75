"""A log line that repeats at most once a minute per cause, saying how many it stood for.

A storage failure fails every request until it clears (a full disk, a map at
its cap): one line per request was hundreds a second, written to the same full
disk. The first line of a burst is written at once; the rest are counted into
the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

EVERY_S = 60.0


class Throttle:
    """Per key, lets one event through a minute, counting those held back meanwhile."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, every_s: float = EVERY_S) -> None:
        self._clock = clock
        self._every_s = every_s
        self._last: dict[str, float] = {}  # per key: when one was last let through
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()  # the writer thread and the event loop both log

    def admit(self, key: str = "") -> int | None:
        """None to hold this one back; else how many were held back since the last let through."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            if len(self._last) > 256:  # keys are few; never let them grow without end
                self._last.clear()
                self._held.clear()
            self._last[key] = now
            return self._held.pop(key, 0)


class ThrottledLog:
    def __init__(self, logger: logging.Logger, level: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._level = level
        self._throttle = Throttle(clock)

    def __call__(self, message: str, *args: object, cause: str = "") -> None:
        """Log, unless the same `cause` was written less than a minute ago.

        Throttled per cause: a burst of one (a full writer queue) does not hide
        another (a data file removed) for a minute.
        """
        held = self._throttle.admit(cause)
        if held is None:
            return
        suffix = f" ({held} more like it since the last such line)" if held else ""
        self._logger.log(self._level, message + suffix, *args)
