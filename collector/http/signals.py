"""GET /v1/signals/:visitorId: the visitor snapshot (spec 2.6, 4.2).

Shares the write routes' shell (preflight, refusals, metrics, access log) and
gates: key, suspension, domain gate and site scope, the `signals-read` rate
bucket. Each full read spends Signals Coverage units through the group-commit
writer before it reads the visitor, so a read that answers `full` is billed
durably; when the units are not available, or metering fails, the answer is
the degraded placeholder with HTTP 200 (spec 3), never a 5xx.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, unquote

import msgspec

from collector.access.gate import admit_reader
from collector.access.tenants import Plan
from collector.errors import ServiceError
from collector.http.asgi import Receive, Request
from collector.http.write_route import Handler, Seen, make_write_handler, spend_request_token
from collector.limits.usage import (
    COVERAGE_UNIT,
    CoverageMode,
    UsagePolicy,
    billing_period,
    coverage_read_allowed,
    policy_for,
)
from collector.services import Services
from collector.signals.snapshot import degraded, snapshot
from storage import counters
from storage.errors import StorageError, WriterBusy
from storage.throttled_log import ThrottledLog
from storage.visitors import read_visitor

log = logging.getLogger("collector.signals")
# Every read degrades alike while the writer is backed up or a counter is damaged:
# one line a minute per cause, with the count it stood for (helper-66).
_metering_unavailable = ThrottledLog(log, logging.WARNING)

ROUTE = "/v1/signals/:visitorId"
PREFIX = "/v1/signals/"
PREFIX_BYTES = PREFIX.encode()
MAX_ID = 128  # spec 8.1: visitorId and sessionId
_encoder = msgspec.json.Encoder()


def make_signals_handler(services: Services) -> Handler:
    return make_write_handler(
        services, ROUTE, _read_snapshot, retry_hint="retry the read", method="GET", route_check=_visitor_segment
    )


def _visitor_segment(request: Request) -> bytes:
    """The raw visitorId path segment (still percent-encoded), after routing checks.

    A path with more segments is another route: the stream sub-route is
    WebSocket-only (426), anything else does not exist (404).
    """
    raw: bytes = (request.scope.get("raw_path") or request.path.encode()).split(b"?", 1)[0]
    # The router matched the decoded path: "/v1/signals%2Fx" is not this route.
    segments = raw[len(PREFIX_BYTES) :].split(b"/") if raw.startswith(PREFIX_BYTES) else []
    if len(segments) == 2 and segments[1] == b"stream":
        raise ServiceError(
            "upgrade_required", "GET /v1/signals/:visitorId/stream is a WebSocket route, and this version does not serve it yet"
            " (a WebSocket handshake gets 404 not_found)",
            headers={"Upgrade": "websocket"},  # RFC 9110 15.5.22
        )
    # POST /v1/signals/batch is spec 4.2's direct identity API, which is not built.
    unbuilt = request.method == "POST" and segments == [b"batch"]
    if len(segments) != 1 or not segments[0] or unbuilt:
        raise ServiceError("not_found", f"no route for {request.method} {request.path}")
    return segments[0]


def _decoded_visitor(segment: bytes) -> str:
    try:
        return unquote(segment.decode("ascii"), errors="strict")
    except UnicodeDecodeError:
        raise ServiceError("validation_error", "visitorId must be percent-encoded UTF-8") from None


def _strict_query(request: Request) -> dict[str, str]:
    """The query string's parameters, refusing one that is not percent-encoded UTF-8 (as a visitorId)."""
    raw: bytes = request.scope.get("query_string", b"")
    try:
        return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise ServiceError(
            "validation_error", "the query string must be percent-encoded UTF-8 (sessionId is read from it)"
        ) from None


def _checked_id(name: str, value: str) -> str:
    if not 1 <= len(value) <= MAX_ID:
        raise ServiceError("validation_error", f"{name} must be 1 to {MAX_ID} characters, got {len(value)}")
    return value


async def _read_snapshot(
    services: Services, request: Request, receive: Receive, headers: list[tuple[str, str]], seen: Seen
) -> tuple[int, bytes]:
    segment = _visitor_segment(request)
    hdr, query = request.headers, request.query
    caller = admit_reader(
        services.keys,
        header_key=hdr.get("x-api-key"),
        query_key=query.get("key"),
        origin=hdr.get("origin"),
        referer=hdr.get("referer"),
    )
    record, site = caller.record, caller.site
    seen.client_id = record.clientId
    spend_request_token(services, record, site, "signals-read", headers)
    visitor_id = _checked_id("visitorId", _decoded_visitor(segment))
    session_id = query.get("sessionId")
    if session_id is not None:
        if "\ufffd" in session_id:  # (the query is read leniently: %ff became U+FFFD)
            session_id = _strict_query(request).get("sessionId", "")
        _checked_id("sessionId", session_id)
    elif record.site_plan(site) is Plan.FREE:
        raise ServiceError(
            "session_id_required", "on the free plan a signals read needs the visitor's sessionId parameter"
        )
    now_ms = services.now_ms()
    policy = policy_for(record)
    period = billing_period(now_ms)
    # Spec 4.2: one unit with a sessionId; without it one per rate partition.
    units = 1 if session_id is not None else services.limiter.partitions
    mode, used = await _spend_coverage(services, policy, period, units)
    headers.extend(
        [
            ("Cache-Control", "no-store"),
            ("X-Service-Signals-Coverage-Period", period),
            ("X-Service-Signals-Coverage-Limit", str(policy.coverage_included)),
            ("X-Service-Signals-Coverage-Ceiling", str(policy.coverage_ceiling)),
            ("X-Service-Signals-Coverage-Mode", mode.value),
        ]
    )
    if used is not None:  # unknown when metering failed: left out rather than guessed
        headers.append(("X-Service-Signals-Coverage-Used", str(used)))
    services.metrics.count_labelled("collector_signals_reads", mode.value)
    if mode is CoverageMode.DEGRADED:
        return 200, _encoder.encode(
            degraded(visitor_id=visitor_id, site_id=site.siteId, session_id=session_id, now_ms=now_ms)
        )
    try:
        view = read_visitor(services.storage, record.clientId, site.siteId, visitor_id)
    except StorageError as exc:  # a record that does not decode reads as none: see read_visitor
        # The units are spent and the read failed: say so plainly; a retry is billed again.
        raise ServiceError(
            "storage_unavailable", f"the visitor record could not be read ({exc.for_client}); retry"
        ) from None
    return 200, _encoder.encode(
        snapshot(view, visitor_id=visitor_id, site_id=site.siteId, session_id=session_id, now_ms=now_ms)
    )


async def _spend_coverage(
    services: Services, policy: UsagePolicy, period: str, units: int
) -> tuple[CoverageMode, int | None]:
    """(mode, counter after the read): full when the units were spent and committed."""
    key = counters.counter_key(policy.account, period, COVERAGE_UNIT)
    try:
        spend = await services.writer.submit(
            counters.SpendUnits(
                key, units, lambda used, more: coverage_read_allowed(policy, used, more),
                overage=(
                    (counters.overage_key(policy.account, period, COVERAGE_UNIT), policy.coverage_included, period)
                    if policy.overage
                    else None
                ),
            )
        )
    except (WriterBusy, StorageError) as exc:
        _metering_unavailable("coverage metering unavailable, answering degraded: %s", exc, cause=str(exc))
        return CoverageMode.DEGRADED, None
    if spend.unreadable is not None:
        name = counters.counter_name(spend.unreadable)
        _metering_unavailable("usage counter %s is unreadable, answering degraded", name, cause=name)
        return CoverageMode.DEGRADED, None
    return (CoverageMode.FULL if spend.spent else CoverageMode.DEGRADED), spend.used
