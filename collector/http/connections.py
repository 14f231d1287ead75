"""One connection's failure in the HTTP layer ends that connection, never the server.

trio.serve_listeners runs every connection in one handler nursery, so an
exception that escapes hypercorn's connection handler cancels every other
connection and stops the process. hypercorn 0.18 has such exceptions: on
HTTP/2 (cleartext, which it accepts unasked), a DATA frame for a stream it has
already answered and closed raises KeyError (protocol/h2.py, DataReceived), and
any client can send one. Errors inside the ASGI app never get here (hypercorn
answers them with a 500); what gets here is the protocol layer's own.

A client can raise these at will, so the log says so at most once a minute
(with the traceback, and how many were not logged); the metric counts them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger("collector.http")

LOG_EVERY_S = 60.0


class ConnectionGuard:
    def __init__(
        self,
        handler: Callable[[trio.SocketStream], Awaitable[Any]],
        count: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = handler
        self._count = count
        self._clock = clock
        self._last_logged: float | None = None
        self._unlogged = 0

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            await self._handler(stream)
        except Exception as exc:  # not BaseException: cancellation still ends the server
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        cause: BaseException = exc
        while isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:
            cause = cause.exceptions[0]  # hypercorn's task groups wrap what they raise
        self._count(type(cause).__name__)
        now = self._clock()
        if self._last_logged is not None and now - self._last_logged < LOG_EVERY_S:
            self._unlogged += 1
            return
        unlogged, self._unlogged, self._last_logged = self._unlogged, 0, now
        log.warning(
            "a connection ended on an error in the HTTP layer; the server goes on"
            " (%d more since the last such message)",
            unlogged,
            exc_info=exc,
        )
