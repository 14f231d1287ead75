"""One structured JSON line per request; never a key, signature, email or form value.

The lines have the shape `collector.logs.JsonFormatter` gives every other log
line, but skip the logging machinery (a LogRecord, a handler lock and a write
plus flush per request cost about as much as a small request's own work):
they are encoded directly and written to stderr in batches, at most
`MAX_LINES` lines or `MAX_DELAY_S` seconds late. `flush()` runs on shutdown
and from a periodic task, so an idle server never holds lines back for long.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec
import trio

from collector.access.hostnames import utf8_header
from collector.errors import ServiceError
from collector.http.asgi import Receive, Request, Send, send_refusal
from collector.ingest.payment import text_has_card
from collector.log_sink import stderr_sink
from collector.logs import process_fields

if TYPE_CHECKING:
    from collector.services import Services

access = logging.getLogger("collector.access")

MAX_LINES = 64
MAX_DELAY_S = 0.25

_encoder = msgspec.json.Encoder()
_pending: list[bytes] = []
_first_pending_at = 0.0
_ts_second = -1
_ts_prefix = ""


def _timestamp(now: float) -> str:
    """`2026-11-23T11:40:00.123Z`, as the JsonFormatter writes it; the second part cached."""
    global _ts_second, _ts_prefix
    second = int(now)
    if second != _ts_second:
        _ts_second = second
        _ts_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_ts_prefix}.{int((now - second) * 1000):03d}Z"


def log_request(
    request: Request,
    route: str,
    status: int,
    error_code: str | None,
    client_id: str | None,
    started: float,
) -> None:
    global _first_pending_at
    if not access.isEnabledFor(logging.INFO):
        return
    perf_now = time.perf_counter()
    line = _encoder.encode(
        {
            "ts": _timestamp(time.time()),
            "level": "info",
            "logger": "collector.access",
            "msg": "request",
            **process_fields(),
            "method": _loggable_method(request.method),
            "route": route,
            "status": status,
            "error": error_code,
            "clientId": client_id,
            "latencyMs": round((perf_now - started) * 1000, 3),
            # A client-chosen id is written to disk here: never a card number (spec 4.1 rule 5).
            "requestId": _loggable_id(request.request_id),
        }
    )
    if not _pending:
        _first_pending_at = perf_now
    _pending.append(line)
    if len(_pending) >= MAX_LINES or perf_now - _first_pending_at >= MAX_DELAY_S:
        flush()


def record_request(
    services: Services,
    request: Request,
    route: str,
    status: int,
    error_code: str | None,
    client_id: str | None,
    started: float,
) -> None:
    """Count the request in collector_requests_total and write its access line (when on)."""
    services.metrics.count_request(route, status)
    if services.settings.access_log:
        log_request(request, route, status, error_code, client_id, started)


async def refuse_and_record(
    services: Services,
    request: Request,
    receive: Receive,
    send: Send,
    error: ServiceError,
    headers: list[tuple[str, str]],
    route: str,
    started: float,
) -> None:
    """send_refusal, counted and logged as what its client got: the parser's answer, or
    none, when its body broke or it left first (helper-104), and the refusal otherwise,
    also when it was cut off while sent."""
    status, code = error.status, error.code
    try:
        if (left := await send_refusal(request, receive, send, error, headers)) is not None:
            status, code = left.answered
    finally:
        record_request(services, request, route, status, code, None, started)


# (with DEL and the Unicode line breaks, which readers splitting lines as str.splitlines does cut at)
_C1_CONTROLS = {code: "\ufffd" for code in (0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)}


def _loggable_method(method: str) -> str:
    """The method as a log line may hold it: at most 32 characters, without C1 controls
    (h11 takes a method of any length, and HTTP/2 any characters: helper-113's
    6,000-character method made a 6 KiB line, torn under --workers)."""
    return method if len(method) <= 16 and method.isalpha() else method[:32].translate(_C1_CONTROLS)


def _loggable_id(request_id: str) -> str:
    """The client's X-Request-ID as a log line may hold it.

    Read as the UTF-8 it was sent in (the header arrives as Latin-1 text: "é"
    was logged as "Ã©"); C1 controls, which JSON leaves raw and some terminals
    obey (U+009B starts an escape sequence), become U+FFFD; a card number is
    never written (spec 4.1 rule 5).
    """
    text = utf8_header(request_id)
    if text_has_card(text):
        return "[holds a payment card number]"
    return text.translate(_C1_CONTROLS)


def flush() -> None:
    """Write every pending line to stderr now."""
    if not _pending:
        return
    data = b"\n".join(_pending) + b"\n"
    _pending.clear()
    stderr_sink().write(data)  # never blocks: see collector/log_sink.py


async def flush_periodically(interval_s: float = MAX_DELAY_S) -> None:
    """Run in the serving nursery: pending lines never wait for the next request."""
    try:
        while True:
            await trio.sleep(interval_s)
            flush()
    finally:
        flush()
