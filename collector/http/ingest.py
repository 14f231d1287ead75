"""POST /v1/events, /v1/edge/pageview and /v1/consent as one thin raw-ASGI handler.

request -> gate (no storage) -> rate bucket -> body -> pure pipeline ->
group-commit admission -> 202. Every refusal is a ServiceError rendered by
one function; nothing is stored unless the admission commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from collector.access.domains import gate
from collector.access.gate import admit_writer
from collector.access.signature import verify_server_signature
from collector.access.tenants import KeyType
from collector.errors import RawErrorBody, ServiceError, render_error
from collector.http.access_log import log_request
from collector.http.asgi import ClientGone, Receive, Request, Scope, Send, read_body, send_response
from collector.http.consent_body import consent_to_event
from collector.http.edge_body import edge_to_event
from collector.http.headers import (
    billing_block,
    cors_headers,
    preflight_headers,
    refusal_body,
    refusal_headers,
    usage_headers,
)
from collector.ingest import decompress_body, prepare_batch, refuse_payment_data
from collector.ingest.bots import request_evidence
from collector.ingest.model import AcceptedEvent, IngestContext, MeterKind, PreparedBatch
from collector.limits.buckets import rate_headers, refusal
from collector.limits.rates import bucket_id, scope_rate
from collector.limits.usage import (
    COVERAGE_UNIT,
    PAGEVIEW_UNIT,
    UsagePolicy,
    UsageRefusal,
    UsageSnapshot,
    billing_period,
    current_snapshot,
    decide,
    policy_for,
)
from collector.services import Services
from storage import counters
from storage.admission import (
    Admission,
    AdmissionResult,
    Candidate,
    Conflict,
    MeteringUnavailable,
)
from storage.consent import RecordedConsent, consent_key, read_consent
from storage.errors import StorageError, WriterBusy
from storage.idempotency import public_ledger_key
from storage.writer import JobRefused

log = logging.getLogger("collector.ingest")

RAW_BODY_LIMIT = 10 * 1024 * 1024
GZIP_BODY_LIMIT = 1 * 1024 * 1024
UNITS = (PAGEVIEW_UNIT, COVERAGE_UNIT)
_UNIT_OF = {MeterKind.PAGEVIEW: PAGEVIEW_UNIT, MeterKind.COVERAGE: COVERAGE_UNIT, MeterKind.NONE: None}
_encoder = msgspec.json.Encoder()


def make_ingest_handler(
    services: Services, *, edge: bool, consent: bool = False
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    route = "/v1/consent" if consent else "/v1/edge/pageview" if edge else "/v1/events"
    access_log = services.settings.access_log

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request = Request(scope)
        origin = request.headers.get("origin")
        headers = [("X-Request-ID", request.request_id), *cors_headers(origin)]
        seen = Seen()
        error_code: str | None = None
        try:
            if request.method == "OPTIONS":
                preflight_gate(services, request)
                await send_response(
                    send, 204, b"", [("X-Request-ID", request.request_id), *preflight_headers(origin)]
                )
                services.metrics.count_request(route, 204)
                return
            if request.method != "POST":
                raise ServiceError("method_not_allowed", f"{route} accepts POST only")
            status, body = await _ingest(services, request, receive, headers, route, seen)
        except ServiceError as error:
            status, body, error_code = error.status, render_error(error), error.code
            headers.extend(error.response_headers().items())
        except RawErrorBody as raw:
            status, body, error_code = raw.status, _encoder.encode(raw.body), "content_type"
        except ClientGone:
            services.metrics.count_request(route, 499)
            return
        except (WriterBusy, StorageError) as exc:
            unavailable = ServiceError(
                "storage_unavailable",
                f"events were not stored ({exc}); retry the complete batch with the same ids",
            )
            status, body, error_code = unavailable.status, render_error(unavailable), unavailable.code
            headers.extend(unavailable.response_headers().items())
        except Exception:
            log.exception("unexpected error on %s", route)
            internal = ServiceError("internal_error", "the request failed unexpectedly; retry it")
            status, body, error_code = 500, render_error(internal), internal.code
        services.metrics.count_request(route, status)
        await send_response(send, status, body, headers)
        if access_log:
            log_request(request, route, status, error_code, seen.client_id, started)

    return handle


def preflight_gate(services: Services, request: Request) -> None:
    """A preflight carries no X-API-Key; when the URL names a key, apply its domain gate.

    Without a key the preflight is answered for any origin: the request that
    follows is gated by its key, and the collector never uses cookies.
    """
    query_key = request.query.get("key")
    if not query_key:
        return
    record = services.keys.lookup(query_key)
    if record is not None:
        gate(record, request.headers.get("origin"), request.headers.get("referer"))


class Seen:
    """What the handler learned about the caller, for the access log."""

    __slots__ = ("client_id",)

    def __init__(self) -> None:
        self.client_id: str | None = None


async def _ingest(
    services: Services,
    request: Request,
    receive: Receive,
    headers: list[tuple[str, str]],
    route: str,
    seen: Seen,
) -> tuple[int, bytes]:
    hdr = request.headers
    caller = admit_writer(
        services.keys,
        header_key=hdr.get("x-api-key"),
        query_key=request.query.get("key"),
        origin=hdr.get("origin"),
        referer=hdr.get("referer"),
        signature_headers=(hdr.get("x-cs-timestamp"), hdr.get("x-cs-signature")),
    )
    record, site = caller.record, caller.site
    seen.client_id = record.clientId
    key_type = record.key_type
    scope = "mobile:ingest" if key_type is KeyType.MOBILE else "ingest"
    decision = services.limiter.check(
        bucket_id(record.clientId, key_type.value, scope),
        scope_rate(record, scope, record.site_plan(site)),
        services.clock(),
    )
    headers.extend(rate_headers(decision, scope))
    if not decision.allowed:
        raise refusal(decision, scope)

    gzip = "gzip" in hdr.get("content-encoding", "").lower()
    raw = await read_body(request, receive, GZIP_BODY_LIMIT if gzip else RAW_BODY_LIMIT)
    now_ms = services.now_ms()
    if key_type is KeyType.SERVER:
        verify_server_signature(
            api_key=record.key,
            timestamp=hdr.get("x-cs-timestamp"),
            signature=hdr.get("x-cs-signature"),
            idempotency_key=hdr.get("idempotency-key"),
            body=raw,
            now_s=now_ms / 1000,
        )
    body = decompress_body(raw, hdr.get("content-encoding"), hdr.get("content-type"))
    if route != "/v1/events":
        # The translations keep only known fields: scan the request as sent first.
        refuse_payment_data(body)
        if route == "/v1/edge/pageview":
            body = edge_to_event(body, user_agent=hdr.get("user-agent"), now_ms=now_ms)
        else:
            body = consent_to_event(body, now_ms=now_ms)
    storage = services.storage
    client_id, site_id = record.clientId, site.siteId

    def identity_denial(visitor_id: str) -> bool:
        recorded = read_consent(storage, client_id, site_id, visitor_id)
        return recorded is not None and recorded.identity_resolution is False

    context = IngestContext(
        client_id=record.clientId,
        site_id=site.siteId,
        key_type=key_type.value,
        production=services.settings.production,
        now_ms=now_ms,
        idempotency_key=hdr.get("idempotency-key"),
        user_agent=hdr.get("user-agent"),
        strict_consent=site.strictConsent,
        client_ip=request.client_ip,
        request_headers=tuple(hdr.items()),
        sealer=services.sealer,
        identity_denial=identity_denial,
        bots=services.bots,
        bot_evidence=request_evidence(
            hdr, services.proxies.client_address(request.client_ip, hdr.get("x-forwarded-for")), services.bots
        ),
    )
    prepared = prepare_batch(body, context)
    policy = policy_for(record)
    period = billing_period(now_ms)
    if prepared.accepted:
        result = await _admit(services, record.clientId, site.siteId, key_type.value, policy, period, prepared)
        usage = result.usage
    else:
        result = AdmissionResult([], [], None)
        usage = _current_usage(services, policy, period)
    headers.extend(usage_headers(policy, usage))
    duplicates = sum(result.duplicate)
    accepted = len(prepared.accepted) - duplicates
    metrics = services.metrics
    metrics.count_events("accepted", accepted)
    metrics.count_events("duplicate", duplicates)
    metrics.count_events("rejected", len(prepared.rejected))
    metrics.count_events("dropped", len(prepared.dropped))
    for dropped in prepared.dropped:
        metrics.count_labelled("collector_events_dropped", dropped.reason)
    for ev, was_duplicate in zip(prepared.accepted, result.duplicate, strict=True):
        if ev.is_bot and not was_duplicate and ev.bot_category:
            metrics.count_labelled("collector_events_bot", ev.bot_category)
    body_out = {
        "success": True,
        "accepted": accepted,
        "duplicates": duplicates,
        "received": prepared.received,
        "dropped": len(prepared.dropped),
        "rejected": len(prepared.rejected),
        "errors": _event_errors(prepared),
        "billing": billing_block(policy, usage),
        "delivery": "durable_outbox",
        "receiptIds": result.receipt_ids,
        "ledgerKeys": [public_ledger_key(record.clientId, ev.eid) for ev in prepared.accepted],
        "timestamp": now_ms,
    }
    return 202, _encoder.encode(body_out)


async def _admit(
    services: Services,
    client_id: str,
    site_id: str,
    key_type: str,
    policy: UsagePolicy,
    period: str,
    prepared: PreparedBatch,
) -> AdmissionResult:
    def budget(used: dict[str, int], added: dict[str, int]) -> UsageSnapshot:
        verdict = decide(
            policy,
            period,
            used_pageviews=used[PAGEVIEW_UNIT],
            used_coverage=used[COVERAGE_UNIT],
            add_pageviews=added[PAGEVIEW_UNIT],
            add_coverage=added[COVERAGE_UNIT],
        )
        if isinstance(verdict, UsageRefusal):
            raise JobRefused(verdict)
        return verdict

    job = Admission(
        client_id=client_id,
        site_id=site_id,
        key_type=key_type,
        account=policy.account,
        period=period,
        candidates=[_candidate(client_id, site_id, ev) for ev in prepared.accepted],
        window_ms=int(services.settings.idempotency_window_hours * 3_600_000),
        budget=budget,
        units=UNITS,
    )
    try:
        result: AdmissionResult = await services.writer.submit(job)
    except JobRefused as refused:
        reason = refused.reason
        if isinstance(reason, Conflict):
            raise ServiceError(
                "idempotency_conflict",
                f"event id {reason.eid!r} was already used with different content",
                eid=reason.eid,
                index=prepared.accepted[reason.index].index,
            ) from None
        if isinstance(reason, MeteringUnavailable):
            raise ServiceError(
                "usage_metering_unavailable",
                "usage counters could not be read; nothing was accepted, retry the same ids",
            ) from None
        if isinstance(reason, UsageRefusal):
            raise ServiceError(
                reason.code,
                "the monthly budget does not allow this batch; nothing was accepted",
                headers=refusal_headers(reason),
                **refusal_body(reason),
            ) from None
        raise
    return result


def _candidate(client_id: str, site_id: str, ev: AcceptedEvent) -> Candidate:
    state = ev.consent_state
    if state is None:
        return Candidate(ev.eid, ev.content_hash, ev.stored, _UNIT_OF[ev.meter])
    return Candidate(
        ev.eid,
        ev.content_hash,
        ev.stored,
        _UNIT_OF[ev.meter],
        consent_key=consent_key(client_id, site_id, state.visitor_id),
        consent_state=RecordedConsent(
            state.at_ms, state.analytics, state.identityResolution, state.thirdPartySharing, state.eid
        ),
    )


def _current_usage(services: Services, policy: UsagePolicy, period: str) -> UsageSnapshot:
    try:
        pageviews = counters.read_counter(services.storage, policy.account, period, PAGEVIEW_UNIT)
        coverage = counters.read_counter(services.storage, policy.account, period, COVERAGE_UNIT)
    except StorageError:
        raise ServiceError(
            "usage_metering_unavailable", "usage counters could not be read; nothing was accepted"
        ) from None
    return current_snapshot(policy, period, pageviews=pageviews, coverage=coverage)


def _event_errors(prepared: PreparedBatch) -> list[dict[str, object]]:
    errors: list[dict[str, object]] = [
        {
            "index": ev.index,
            "eid": ev.eid,
            "error": ev.code,
            "issues": [{"path": i.path, "message": i.message} for i in ev.issues],
        }
        for ev in prepared.rejected
    ]
    errors.extend(
        {"index": ev.index, "eid": ev.eid, "error": "dropped", "reason": ev.reason}
        for ev in prepared.dropped
    )
    return errors
