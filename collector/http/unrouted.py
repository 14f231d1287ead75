"""Answers no route gave: a connection refused at a cap, the HTTP parser's refusal.

Every request a client sends is counted in `collector_requests_total` and gets
an access line, whoever answers it; these answers are written before any route
sees a request, so they are recorded here, under a route name of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.http.access_log import log_request
from collector.http.asgi import Request
from collector.metrics import Metrics


def stand_in_request(method: str, path: str, request_id: str) -> Request:
    """A Request for what of a request head was read (its access line needs one)."""
    return Request(
        {"method": method or "-", "path": path or "-", "headers": [(b"x-request-id", request_id.encode("latin-1"))]}
    )


@dataclass(frozen=True)
class UnroutedAnswers:
    metrics: Metrics | None
    access_log: bool

    def record(self, request: Request, route: str, status: int, error_code: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.count_request(route, status)
        if self.access_log:
            log_request(request, route, status, error_code, None, started)


UNRECORDED = UnroutedAnswers(None, access_log=False)  # (a server built without metrics, in tests)
