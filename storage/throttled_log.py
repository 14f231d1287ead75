"""A log line that repeats at most once a minute, saying how many it stood for.

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
        self._last: float | None = None
        self._unlogged = 0
        self._lock = threading.Lock()  # the writer thread and the event loop both log

    def __call__(self, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < EVERY_S:
                self._unlogged += 1
                return
            unlogged, self._unlogged, self._last = self._unlogged, 0, now
        suffix = f" ({unlogged} more like it since the last such line)" if unlogged else ""
        self._logger.log(self._level, message + suffix, *args)
