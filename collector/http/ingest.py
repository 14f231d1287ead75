"""POST /v1/events, /v1/edge/pageview and /v1/consent as one thin raw-ASGI handler.

request -> gate (no storage) -> rate bucket -> body -> pure pipeline ->
group-commit admission -> 202. Every refusal is a ServiceError rendered by
one function; nothing is stored unless the admission commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial

import msgspec

from collector.access.domains import bind_page_site, forwarded_site
from collector.access.gate import admit_key, admit_writer
from collector.access.hostnames import is_utf8_header, utf8_header
from collector.access.signature import verify_server_signature
from collector.access.tenants import KeyType, Site
from collector.errors import ServiceError
from collector.http.asgi import Receive, Request
from collector.http.consent_body import consent_to_event
from collector.http.edge_body import edge_to_event, in_edge_terms, relayed_address
from collector.http.headers import (
    billing_block,
    refusal_body,
    refusal_headers,
    usage_headers,
)
from collector.http.off_loop import run_pure
from collector.http.write_route import (
    Handler,
    Seen,
    inflated_body,
    make_write_handler,
    read_capped_body,
    spend_request_token,
)
from collector.ingest import prepare_batch, refuse_payment_data
from collector.ingest.bots import request_evidence
from collector.ingest.model import (
    AcceptedEvent,
    DroppedEvent,
    IngestContext,
    MeterKind,
    PreparedBatch,
)
from collector.ingest.number_forms import earlier_event_hashes
from collector.limits.rates import ingest_scope
from collector.limits.usage import (
    COVERAGE_UNIT,
    PAGEVIEW_UNIT,
    UNITS,
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
from storage.consent import RecordedConsent, consent_key
from storage.errors import StorageError
from storage.idempotency import public_ledger_key
from storage.outbox import event_time
from storage.throttled_log import ThrottledLog
from storage.writer import JobRefused

EDGE_ROUTE = "/v1/edge/pageview"
# Every write of the account is refused alike until the counter is repaired: one line
# a minute, naming it (`collector check` lists it too).
_metering_unavailable = ThrottledLog(logging.getLogger("collector.ingest"), logging.ERROR)
_UNIT_OF = {MeterKind.PAGEVIEW: PAGEVIEW_UNIT, MeterKind.COVERAGE: COVERAGE_UNIT, MeterKind.NONE: None}
_encoder = msgspec.json.Encoder()


def make_ingest_handler(services: Services, *, edge: bool, consent: bool = False) -> Handler:
    route = "/v1/consent" if consent else EDGE_ROUTE if edge else "/v1/events"
    return make_write_handler(
        services,
        route,
        partial(_ingest, route=route),
        retry_hint="retry the complete batch with the same ids",
    )


async def _ingest(
    services: Services,
    request: Request,
    receive: Receive,
    headers: list[tuple[str, str]],
    seen: Seen,
    *,
    route: str,
) -> tuple[int, bytes]:
    hdr = request.headers
    header_key, query_key = hdr.get("x-api-key"), request.query.get("key")
    # Its characters as sent (headers arrive decoded as Latin-1): the 512 limit counts
    # characters, and the signature covers the key's own bytes.
    raw_idempotency_key = hdr.get("idempotency-key")
    idempotency_key = utf8_header(raw_idempotency_key) if raw_idempotency_key is not None else None
    signature_headers = (hdr.get("x-cs-timestamp"), hdr.get("x-cs-signature"))
    site: Site | None = None
    if route == EDGE_ROUTE:
        record, _ = admit_key(
            services.keys, header_key=header_key, query_key=query_key, signature_headers=signature_headers
        )
        # An edge worker sends no Origin or Referer: its site is bound from the
        # page URL below. A request that carries either came from (or on behalf
        # of) a browser page, and a public website key in ?key= would otherwise
        # let any site write here: the browser's domain gate applies (spec 5.5).
        site = forwarded_site(record, hdr.get("origin"), hdr.get("referer"))
    else:
        caller = admit_writer(
            services.keys,
            header_key=header_key,
            query_key=query_key,
            origin=hdr.get("origin"),
            referer=hdr.get("referer"),
            signature_headers=signature_headers,
        )
        record, site = caller.record, caller.site
    seen.client_id = record.clientId
    key_type = record.key_type
    spend_request_token(services, record, site, ingest_scope(record), headers)
    raw = await read_capped_body(request, receive)
    now_ms = services.now_ms()
    # A key that is not UTF-8 is refused, after the signature: spec 5.2 signs its exact bytes.
    signed_key: str | bytes | None = idempotency_key
    utf8_key = raw_idempotency_key is None or is_utf8_header(raw_idempotency_key)
    if raw_idempotency_key is not None and not utf8_key:
        signed_key = raw_idempotency_key.encode("latin-1")
    if key_type is KeyType.SERVER:
        verify_server_signature(
            api_key=record.key,
            timestamp=hdr.get("x-cs-timestamp"),
            signature=hdr.get("x-cs-signature"),
            idempotency_key=signed_key,
            body=raw,
            now_s=now_ms / 1000,
            path=route,  # or "/v1/events", as spec 5.2 spells it
        )
    if not utf8_key:
        # As text it would read as Latin-1: the same id as a UTF-8 key of other bytes.
        raise ServiceError("invalid_idempotency_key", "Idempotency-Key must be UTF-8 text")
    body = await inflated_body(request, raw)
    content_identity: bytes | None = None
    legacy_identity: bytes | None = None
    visitor_ip = services.proxies.client_address(request.client_ip, hdr.get("x-forwarded-for"))
    evidence_headers: Mapping[str, str] = hdr
    if route != "/v1/events":
        # The translations keep only known fields: scan the request as sent first.
        await run_pure(len(body), refuse_payment_data, body)
        if route == EDGE_ROUTE:
            body, page_url, content_identity, legacy_identity, sent_ip = edge_to_event(
                body,
                # (a header arrives read as Latin-1: a UTF-8 one is stored as its characters)
                user_agent=utf8_header(agent) if (agent := hdr.get("user-agent")) is not None else None,
                now_ms=now_ms,
                website_key=key_type == KeyType.BROWSER,
            )
            # An edge worker the operator trusts (its address in trusted_proxies, as
            # for a load balancer's X-Forwarded-For) relays its visitors: its own
            # address and, without Origin or Referer (a browser sends one), its
            # headers are not theirs, and the clientIp it sends stands for theirs.
            # Anyone else could claim any address, and is judged as on /v1/events.
            if visitor_ip is not None and services.proxies.trusted(visitor_ip):
                visitor_ip = relayed_address(sent_ip)
                if not (hdr.get("origin") or hdr.get("referer")):
                    evidence_headers = {}
            if site is None:
                site = bind_page_site(record, page_url)
        else:
            assert site is not None  # the gate binds a consent request's property
            body, content_identity, legacy_identity = consent_to_event(
                body, now_ms=now_ms, site_id=site.siteId, idempotency_key=idempotency_key
            )
    assert site is not None  # bound by the gate, or from the edge page above
    context = IngestContext(
        client_id=record.clientId,
        site_id=site.siteId,
        key_type=key_type.value,
        production=services.settings.production,
        now_ms=now_ms,
        idempotency_key=idempotency_key,
        content_identity=content_identity,
        legacy_identity=legacy_identity,
        strict_consent=site.strictConsent,
        sealer=services.sealer,
        bots=services.bots,
        bot_evidence=request_evidence(evidence_headers, visitor_ip, services.bots),
    )
    try:
        prepared = await run_pure(len(body), prepare_batch, body, context)
    except ServiceError as error:
        raise in_edge_terms(error) if route == EDGE_ROUTE else error from None
    policy = policy_for(record)
    period = billing_period(now_ms)
    if prepared.accepted:
        result = await _admit(services, record.clientId, site.siteId, key_type.value, policy, period, prepared)
        if result.denied:
            prepared, result = _without_denied(prepared, result)
        usage = result.usage
    else:
        result = AdmissionResult([], [], None)
        usage = _current_usage(services, policy, period)
    headers.extend(usage_headers(policy, usage))
    duplicates = sum(result.duplicate)
    accepted = len(prepared.accepted) - duplicates
    receipts = result.receipt_ids
    ledger_keys = [public_ledger_key(record.clientId, ev.eid) for ev in prepared.accepted]
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
        "receiptIds": receipts,
        "ledgerKeys": ledger_keys,
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
        candidates=_candidates(client_id, site_id, prepared.accepted),
        budget=budget,
        units=UNITS,
        included=(
            {PAGEVIEW_UNIT: policy.pageview_included, COVERAGE_UNIT: policy.coverage_included}
            if policy.overage
            else None
        ),
    )
    try:
        result: AdmissionResult = await services.writer.submit(job)
    except JobRefused as refused:
        reason = refused.reason
        if isinstance(reason, Conflict):
            raise ServiceError(
                "idempotency_conflict",
                f"event id {reason.eid!r} was already used "
                + ("for another of this tenant's sites" if reason.other_site else "with different content"),
                eid=reason.eid,
                index=prepared.accepted[reason.index].index,
            ) from None
        if isinstance(reason, MeteringUnavailable):
            _metering_unavailable("usage counter %s is unreadable, refusing its writes", reason.key, cause=reason.key)
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


def _candidates(client_id: str, site_id: str, accepted: list[AcceptedEvent]) -> list[Candidate]:
    candidates = [_candidate(client_id, site_id, ev) for ev in accepted]
    # An identify is checked against its visitor's consent record inside the
    # write transaction, so a denial committed by any request before it counts
    # (one earlier in the same group commit too), weighed by time against this
    # request's own latest identity choice for that visitor before the event.
    stated: dict[str, tuple[int, bool]] = {}
    choices: set[str] = set()
    for position, ev in enumerate(accepted):
        state = ev.consent_state
        if state is not None and state.identityResolution is not None:
            if ev.eid in choices:
                continue  # an in-batch repeat is the same decision, not a newer one
            choices.add(ev.eid)
            at = state.identity_at_ms if state.identity_at_ms >= 0 else state.at_ms
            stated[state.visitor_id] = (at, state.identityResolution)
        elif ev.event_type == "identify" and ev.visitor_id is not None:
            candidates[position] = msgspec.structs.replace(
                candidates[position],
                identity_consent_key=consent_key(client_id, site_id, ev.visitor_id),
                identity_stated=stated.get(ev.visitor_id),
            )
    return candidates


def _without_denied(prepared: PreparedBatch, result: AdmissionResult) -> tuple[PreparedBatch, AdmissionResult]:
    """The identifies admission dropped because the visitor's consent denies identity resolution."""
    denied = set(result.denied)
    kept = [position for position in range(len(prepared.accepted)) if position not in denied]
    dropped = [
        DroppedEvent(ev.index, ev.eid, "identity_consent_denied")
        for position, ev in enumerate(prepared.accepted) if position in denied
    ]
    prepared = msgspec.structs.replace(
        prepared,
        accepted=[prepared.accepted[p] for p in kept],
        dropped=sorted([*prepared.dropped, *dropped], key=lambda ev: ev.index),
    )
    result = msgspec.structs.replace(
        result,
        receipt_ids=[result.receipt_ids[p] for p in kept],
        duplicate=[result.duplicate[p] for p in kept],
        denied=[],
    )
    return prepared, result


def _candidate(client_id: str, site_id: str, ev: AcceptedEvent) -> Candidate:
    state = ev.consent_state
    # The facts outbox consumers read instead of parsing the event.
    facts = (ev.visitor_id, ev.event_type, ev.is_bot, ev.bot_category or "", event_time(ev.event_ms))
    if state is None:
        return Candidate(
            ev.eid, ev.content_hash, ev.stored, _UNIT_OF[ev.meter], *facts,
            older_hashes=_older_hashes(ev), page=ev.page,
        )
    return Candidate(
        ev.eid,
        ev.content_hash,
        ev.stored,
        _UNIT_OF[ev.meter],
        *facts,
        consent_key=consent_key(client_id, site_id, state.visitor_id),
        consent_state=RecordedConsent(
            state.at_ms, state.analytics, state.identityResolution, state.thirdPartySharing, state.eid,
            identity_at_ms=state.identity_at_ms,
        ),
        older_hashes=_older_hashes(ev),
    )


def _older_hashes(ev: AcceptedEvent) -> Callable[[bool], tuple[bytes, ...]] | None:
    """What admission asks for when it finds a record of an earlier version: an event's
    unkeyed hashes, worked out then; a translated route's, worked out already (its
    request's numbers were never floats)."""
    if ev.hashed_event is not None:
        return partial(earlier_event_hashes, ev.hashed_event)
    earlier = ev.earlier_hashes
    return (lambda with_float_forms: earlier) if earlier else None


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
    if prepared.dropped:
        errors.extend(
            {"index": ev.index, "eid": ev.eid, "error": "dropped", "reason": ev.reason}
            for ev in prepared.dropped
        )
        errors.sort(key=lambda error: error["index"])  # type: ignore[arg-type,return-value]
    return errors
