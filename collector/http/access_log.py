"""One structured JSON line per request; never a key, signature, email or form value."""

from __future__ import annotations

import logging
import time

from collector.http.asgi import Request

access = logging.getLogger("collector.access")


def log_request(
    request: Request,
    route: str,
    status: int,
    error_code: str | None,
    client_id: str | None,
    started: float,
) -> None:
    if not access.isEnabledFor(logging.INFO):
        return
    access.info(
        "request",
        extra={
            "fields": {
                "method": request.method,
                "route": route,
                "status": status,
                "error": error_code,
                "clientId": client_id,
                "latencyMs": round((time.perf_counter() - started) * 1000, 3),
                "requestId": request.request_id,
            }
        },
    )
