"""POST /v1/replay bodies: one session-replay chunk, validated and hashed (pure).

    {"visitorId": "v1", "sessionId": "s1", "seq": 0, "timestamp": 1763800000000,
     "events": [{"type": 2, "timestamp": 1763800000000, "data": {...}}, ...]}

`events` holds 1 to MAX_RECORDS opaque recorder records (rrweb-style), each a
JSON object. `seq` numbers the chunks of one session from 0; (sessionId,
seq) is the chunk's identity, so `_eid` is accepted and ignored. The whole
request is scanned for payment data first, like POST /v1/events.

The records are stored re-encoded with sorted object keys, which makes the
stored bytes canonical: the content hash over visitorId and those bytes is
the same for a retry whatever its key order or whitespace. The client's
`timestamp` (its send time) and `consent` are not part of the content.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import xxhash

from collector.errors import ServiceError
from collector.ingest.pipeline import decode_json, readable_client_time, refuse_payment_data
from collector.ingest.schema import Consent

MAX_CHUNK_BYTES = 1024 * 1024  # the stored records of one chunk, after decoding
MAX_RECORDS = 10_000
MAX_SEQ = 2**53 - 1  # the largest integer a browser counts exactly

Identifier = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ReplayBody(msgspec.Struct, frozen=True):
    visitorId: Identifier
    sessionId: Identifier
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
    events: Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, max_length=MAX_RECORDS)]
    timestamp: int | float | None = None  # ms since epoch, the client's send time
    eid: Identifier | None = msgspec.field(default=None, name="_eid")
    consent: Consent | None = None  # as on an event: a strict-consent property needs analytics




class ReplayChunk(msgspec.Struct, frozen=True):
    visitor_id: str
    session_id: str
    seq: int
    client_timestamp: int | float | None
    events: bytes  # the records as one JSON array, object keys sorted
    content_hash: bytes
    consent: Consent | None = None

    def consent_drop_reason(self, strict: bool) -> str | None:
        """Why a strict-consent property must not record this chunk (spec 4.1 rule 9), or None."""
        if not strict:
            return None
        if self.consent is None:
            return "consent_missing"
        return None if self.consent.analytics else "consent_denied"


_canonical = msgspec.json.Encoder(order="sorted")


def prepare_replay(body: bytes) -> ReplayChunk:
    """Validate a replay body. Raises ServiceError: invalid_json, prohibited_payment_data,
    validation_error (with `details`) or payload_too_large (records over 1 MB)."""
    decoded = decode_json(body)
    refuse_payment_data(body, decoded)
    try:
        parsed = msgspec.convert(decoded, ReplayBody)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `")
        raise _invalid(where.rstrip("`") or "$", message) from None
    for name, value in (("visitorId", parsed.visitorId), ("sessionId", parsed.sessionId)):
        if "\x00" in value:
            raise _invalid(f"$.{name}", "must not contain NUL characters")
    events = _canonical.encode(parsed.events)
    if len(events) > MAX_CHUNK_BYTES:
        raise ServiceError(
            "payload_too_large",
            f"the chunk's records are {len(events)} bytes once decoded, over the"
            f" {MAX_CHUNK_BYTES} byte limit; send smaller chunks",
        )
    content_hash = xxhash.xxh3_128_digest(parsed.visitorId.encode() + b"\x00" + events)
    # The send time is informational (not content): a wild one is dropped, not refused.
    return ReplayChunk(
        parsed.visitorId,
        parsed.sessionId,
        parsed.seq,
        readable_client_time(parsed.timestamp),
        events,
        content_hash,
        parsed.consent,
    )


def _invalid(path: str, message: str) -> ServiceError:
    return ServiceError(
        "validation_error",
        f"the replay chunk is invalid: {path}: {message}",
        details=[{"path": path, "message": message}],
    )
