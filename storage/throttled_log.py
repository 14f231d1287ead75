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


class ThrottledLog:
    def __init__(self, logger: logging.Logger, level: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._level = level
        self._clock = clock
        self._last: dict[str, float] = {}  # per cause: when it was last written
        self._unlogged: dict[str, int] = {}
        self._lock = threading.Lock()  # the writer thread and the event loop both log

    def __call__(self, message: str, *args: object, cause: str = "") -> None:
        """Log, unless the same `cause` was written less than a minute ago.

        Throttled per cause: a burst of one (a full writer queue) does not hide
        another (a data file removed) for a minute.
        """
        now = self._clock()
        with self._lock:
            last = self._last.get(cause)
            if last is not None and now - last < EVERY_S:
                self._unlogged[cause] = self._unlogged.get(cause, 0) + 1
                return
            if len(self._last) > 64:  # causes are few; never let them grow without end
                self._last.clear()
                self._unlogged.clear()
            unlogged, self._unlogged[cause], self._last[cause] = self._unlogged.get(cause, 0), 0, now
        suffix = f" ({unlogged} more like it since the last such line)" if unlogged else ""
        self._logger.log(self._level, message + suffix, *args)
