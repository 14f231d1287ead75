"""POST /v1/replay: session-replay chunks, as a thin raw-ASGI handler.

request -> website-key gate (domain, site scope) -> `ingest` rate bucket ->
body (same caps and gzip rule as /v1/events) -> pure `prepare_replay` ->
`StoreChunk` through the group-commit writer -> 202 once the chunk is on
disk. Chunks draw on no monthly unit, so no usage headers are sent.
"""

from __future__ import annotations

import msgspec

from collector.access.gate import admit_writer
from collector.errors import ServiceError
from collector.http.asgi import Receive, Request
from collector.http.off_loop import run_pure
from collector.http.write_route import (
    Handler,
    Seen,
    inflated_body,
    make_write_handler,
    read_capped_body,
    spend_request_token,
)
from collector.ingest.replay import prepare_replay
from collector.services import Services
from storage.errors import StorageError, WriterBusy
from storage.replay import ChunkConflict, StoreChunk, StoredChunk
from storage.writer import JobRefused

ROUTE = "/v1/replay"
SCOPE = "ingest"  # the same request bucket as POST /v1/events
_encoder = msgspec.json.Encoder()


def make_replay_handler(services: Services) -> Handler:
    return make_write_handler(
        services, ROUTE, _replay, retry_hint="retry the chunk unchanged with the same seq"
    )


async def _replay(
    services: Services,
    request: Request,
    receive: Receive,
    headers: list[tuple[str, str]],
    seen: Seen,
) -> tuple[int, bytes]:
    hdr = request.headers
    caller = admit_writer(
        services.keys,
        header_key=hdr.get("x-api-key"),
        query_key=request.query.get("key"),
        origin=hdr.get("origin"),
        referer=hdr.get("referer"),
        signature_headers=(None, None),  # server keys are refused before the signature matters
        website_only="session replay",  # recorded in the browser: 403 key_type_not_allowed otherwise
    )
    record, site = caller.record, caller.site
    seen.client_id = record.clientId
    spend_request_token(services, record, site, SCOPE, headers)
    raw = await read_capped_body(request, receive)
    body = await inflated_body(request, raw)
    chunk = await run_pure(len(body), prepare_replay, body)
    # A session is not recorded without its consent: such a chunk is acknowledged and
    # not stored, unless the same chunk was stored already (a duplicate, or a 409).
    dropped = chunk.consent_drop_reason(site.strictConsent)
    job = StoreChunk(
        client_id=record.clientId,
        site_id=site.siteId,
        session_id=chunk.session_id,
        seq=chunk.seq,
        content_hash=chunk.content_hash,
        visitor_id=chunk.visitor_id,
        client_timestamp=chunk.client_timestamp,
        events=chunk.events,
        store=dropped is None,
    )
    try:
        stored: StoredChunk = await services.writer.submit(job)
    except (WriterBusy, StorageError):
        if dropped is None:
            raise  # (503: retry the chunk)
        # Never to be stored: a 503 would have the recorder retry it for nothing.
        stored = StoredChunk(None, False)
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
    return 202, _answer(
        services, chunk.session_id, chunk.seq, duplicate=stored.duplicate, receipt_id=stored.receipt_id,
        dropped=dropped if stored.receipt_id is None else None,
    )


def _answer(
    services: Services, session_id: str, seq: int, *, duplicate: bool, receipt_id: str | None, dropped: str | None = None
) -> bytes:
    stored = receipt_id is not None and not duplicate
    answer: dict[str, object] = {"success": True, "accepted": 1 if stored else 0, "duplicate": duplicate}
    if dropped is not None:
        answer["dropped"] = dropped
    answer |= {"sessionId": session_id, "seq": seq, "receiptId": receipt_id, "timestamp": services.now_ms()}
    return _encoder.encode(answer)
