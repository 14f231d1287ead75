"""POST /v1/replay: session-replay chunks, as a thin raw-ASGI handler.

request -> website-key gate (domain, site scope) -> `ingest` rate bucket ->
body (same caps and gzip rule as /v1/events) -> pure `prepare_replay` ->
`StoreChunk` through the group-commit writer -> 202 once the chunk is on
disk. Chunks draw on no monthly unit, so no usage headers are sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from collector.access.gate import admit_replay_writer
from collector.errors import RawErrorBody, ServiceError, render_error
from collector.http.access_log import log_request
from collector.http.asgi import ClientGone, Receive, Request, Scope, Send, read_body, send_response
from collector.http.headers import cors_headers, preflight_headers
from collector.http.ingest import GZIP_BODY_LIMIT, RAW_BODY_LIMIT, Seen, preflight_gate
from collector.ingest import decompress_body
from collector.ingest.replay import prepare_replay
from collector.limits.buckets import rate_headers, refusal
from collector.limits.rates import bucket_id, scope_rate
from collector.services import Services
from storage.errors import StorageError, WriterBusy
from storage.replay import ChunkConflict, StoreChunk, StoredChunk
from storage.writer import JobRefused

log = logging.getLogger("collector.replay")

ROUTE = "/v1/replay"
SCOPE = "ingest"  # the same request bucket as POST /v1/events
_encoder = msgspec.json.Encoder()


def make_replay_handler(services: Services) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    access_log = services.settings.access_log

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request = Request(scope)
        origin = request.headers.get("origin")
        headers = [("X-Request-ID", request.request_id), *cors_headers(origin)]
        seen = Seen()
        error_code: str | None = None
        # The same refusal mapping as the /v1/events handler.
        try:
            if request.method == "OPTIONS":
                preflight_gate(services, request)
                await send_response(
                    send,
                    204,
                    b"",
                    [("X-Request-ID", request.request_id), *preflight_headers(origin)],
                )
                services.metrics.count_request(ROUTE, 204)
                return
            if request.method != "POST":
                raise ServiceError("method_not_allowed", f"{ROUTE} accepts POST only")
            status, body = await _replay(services, request, receive, headers, seen)
        except ServiceError as error:
            status, body, error_code = error.status, render_error(error), error.code
            headers.extend(error.response_headers().items())
        except RawErrorBody as raw:
            status, body, error_code = raw.status, _encoder.encode(raw.body), "content_type"
        except ClientGone:
            services.metrics.count_request(ROUTE, 499)
            return
        except (WriterBusy, StorageError) as exc:
            unavailable = ServiceError(
                "storage_unavailable",
                f"the chunk was not stored ({exc}); retry it unchanged with the same seq",
            )
            status, body, error_code = (
                unavailable.status,
                render_error(unavailable),
                unavailable.code,
            )
            headers.extend(unavailable.response_headers().items())
        except Exception:
            log.exception("unexpected error on %s", ROUTE)
            internal = ServiceError("internal_error", "the request failed unexpectedly; retry it")
            status, body, error_code = 500, render_error(internal), internal.code
        services.metrics.count_request(ROUTE, status)
        await send_response(send, status, body, headers)
        if access_log:
            log_request(request, ROUTE, status, error_code, seen.client_id, started)

    return handle


async def _replay(
    services: Services,
    request: Request,
    receive: Receive,
    headers: list[tuple[str, str]],
    seen: Seen,
) -> tuple[int, bytes]:
    hdr = request.headers
    caller = admit_replay_writer(
        services.keys,
        header_key=hdr.get("x-api-key"),
        query_key=request.query.get("key"),
        origin=hdr.get("origin"),
        referer=hdr.get("referer"),
    )
    record, site = caller.record, caller.site
    seen.client_id = record.clientId
    decision = services.limiter.check(
        bucket_id(record.clientId, record.key_type.value, SCOPE),
        scope_rate(record, SCOPE, record.site_plan(site)),
        services.clock(),
    )
    headers.extend(rate_headers(decision, SCOPE))
    if not decision.allowed:
        raise refusal(decision, SCOPE)

    gzip = "gzip" in hdr.get("content-encoding", "").lower()
    raw = await read_body(request, receive, GZIP_BODY_LIMIT if gzip else RAW_BODY_LIMIT)
    body = decompress_body(raw, hdr.get("content-encoding"), hdr.get("content-type"))
    chunk = prepare_replay(body)
    job = StoreChunk(
        client_id=record.clientId,
        site_id=site.siteId,
        session_id=chunk.session_id,
        seq=chunk.seq,
        content_hash=chunk.content_hash,
        visitor_id=chunk.visitor_id,
        client_timestamp=chunk.client_timestamp,
        events=chunk.events,
    )
    try:
        stored: StoredChunk = await services.writer.submit(job)
    except JobRefused as refused:
        if isinstance(refused.reason, ChunkConflict):
            raise ServiceError(
                "idempotency_conflict",
                f"chunk {chunk.seq} of session {chunk.session_id!r} was already stored"
                " with different content",
                sessionId=chunk.session_id,
                seq=chunk.seq,
            ) from None
        raise
    body_out = {
        "success": True,
        "accepted": 0 if stored.duplicate else 1,
        "duplicate": stored.duplicate,
        "sessionId": chunk.session_id,
        "seq": chunk.seq,
        "receiptId": stored.receipt_id,
        "timestamp": services.now_ms(),
    }
    return 202, _encoder.encode(body_out)
