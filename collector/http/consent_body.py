"""POST /v1/consent: the consent body and its translation into a `_consent_transition` event.

A consent-management callback on the page (or a backend) records a
visitor's decision:

    {"visitorId": "v1", "sessionId": "s1",
     "consent": {"analytics": true, "identityResolution": false, "thirdPartySharing": false},
     "timestamp": 1763800000000, "_eid": "optional"}

`visitorId` and `consent.analytics` are required; `sessionId` defaults to
"consent" and `timestamp` to the time of receipt (`consent.timestamp` to
`timestamp`). Without `_eid` the id is `consent:<visitorId>:<timestamp>:<siteId>`
(its BLAKE2b-128 hex digest after `consent:` when that is over the spec's 128
characters), so a retry of the same timestamped decision is a duplicate, while
the same decision sent to another property of the tenant is that property's
own (idempotency ids are tenant-wide, consent records per property). A request
without `timestamp` but with an `Idempotency-Key` header takes the header's id
instead, and one with neither is a new decision each time it is sent (two
identical requests may be a visitor deciding twice): its id ends in 16 random
hex digits, so two decisions received in the same millisecond never collide. The event runs through the same
gate, site scope, validation and admission as POST /v1/events; admission also
records it as the visitor's latest consent (a newer decision is never
replaced by an older one). It never carries page content and counts toward no
allowance.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import msgspec

from collector.http.edge_body import content_identities, decode_translated


class ConsentBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    visitorId: str
    consent: dict[str, Any]
    sessionId: str = "consent"
    timestamp: int | float | None = None
    eid: str | None = msgspec.field(default=None, name="_eid")


_decoder = msgspec.json.Decoder(ConsentBody)
_encoder = msgspec.json.Encoder()


MAX_ID = 128  # spec 8.1


def _generated_id(visitor_id: str, timestamp: float, site_id: str, *, unique: bool) -> str:
    eid = f"consent:{visitor_id}:{int(timestamp)}:{site_id}"
    if unique:
        eid += ":" + os.urandom(8).hex()
    if len(eid) <= MAX_ID:
        return eid
    return "consent:" + hashlib.blake2b(eid.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def consent_to_event(
    body: bytes, *, now_ms: int, site_id: str, idempotency_key: str | None = None
) -> tuple[bytes, bytes, bytes | None]:
    """The `_consent_transition` event body, its content identity and the previous version's
    identity when it differs (see edge_to_event).

    Raises ServiceError on a bad body.
    """
    request = decode_translated(_decoder, body, "consent body")
    timestamp = request.timestamp if request.timestamp is not None else now_ms
    consent = dict(request.consent)
    consent.setdefault("timestamp", timestamp)
    event: dict[str, Any] = {
        "type": "_consent_transition",
        "visitorId": request.visitorId,
        "sessionId": request.sessionId,
        "timestamp": timestamp,
        "consent": consent,
    }
    if request.eid:
        event["_eid"] = request.eid
    elif request.timestamp is not None:
        event["_eid"] = _generated_id(request.visitorId, timestamp, site_id, unique=False)
    elif not (idempotency_key and idempotency_key.strip()):
        event["_eid"] = _generated_id(request.visitorId, timestamp, site_id, unique=True)
    return (_encoder.encode(event), *content_identities(request))
