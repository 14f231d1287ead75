"""Graceful shutdown at the ASGI edge: requests in flight, and `Connection: close` while draining.

collector.app._serve_http drives it: on SIGTERM/SIGINT it starts draining
(every request from then on is answered with `Connection: close`, so a
keep-alive connection ends after its next response), stops accepting,
waits in `wait_idle` until no request has been in flight for a short quiet
spell, then sets `closing` and lets hypercorn close the idle keep-alive
connections. A request that still arrives after that raced hypercorn's close of
its connection: it is refused with 503 and commits nothing, since its
response may never reach the client.
"""

from __future__ import annotations

import time
from math import inf
from typing import Any

import trio

from collector.errors import ServiceError, render_error
from collector.http.asgi import Receive, Request, Scope, Send, closing_connection, send_response
from collector.http.headers import cors_headers
from collector.http.unrouted import UNRECORDED, UnroutedAnswers


class Drain:
    def __init__(self, app: Any, *, unrouted: UnroutedAnswers = UNRECORDED) -> None:
        self.app = app
        self.unrouted = unrouted
        self.draining = False
        self.closing = False
        self.in_flight = 0
        self.last_start = -inf

    def start_draining(self) -> None:
        self.draining = True
        self.last_start = trio.current_time()  # the quiet spell starts no earlier than the signal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan, websocket
            await self.app(scope, receive, send)
            return
        if self.draining:
            await self._while_draining(scope, receive, send)
            return
        # The hot path: only the count. A request in flight when the drain starts
        # answers without Connection: close; its client's next request on that
        # connection still arrives before the quiet spell ends, and is answered
        # (with Connection: close) as any other.
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _while_draining(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.closing:
            started = time.perf_counter()
            request = Request(scope)
            error = ServiceError("service_unavailable", "the collector is shutting down; retry")
            # CORS as on every answer: a browser's script can then read the 503 and its Retry-After.
            headers = [*error.response_headers().items(), ("Connection", "close"),
                       ("X-Request-ID", request.request_id), *cors_headers(request.headers.get("origin"))]
            await send_response(send, error.status, render_error(error), headers)
            # the refusal is one of the requests the operator counts
            self.unrouted.record(request, "shutdown", error.status, error.code, started)
            return
        self.in_flight += 1
        self.last_start = trio.current_time()
        try:
            await self.app(scope, receive, closing_connection(send))
        finally:
            self.in_flight -= 1

    async def wait_idle(self, quiet_s: float) -> None:
        """Until no request is in flight and none started for `quiet_s`."""
        # polled: a few wake-ups once per shutdown, nothing on the request path
        while self.in_flight or trio.current_time() - self.last_start < quiet_s:  # noqa: ASYNC110
            await trio.sleep(0.01)
