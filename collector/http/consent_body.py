"""POST /v1/consent: the consent body and its translation into a `_consent_transition` event.

A consent-management callback on the page (or a backend) records a
visitor's decision:

    {"visitorId": "v1", "sessionId": "s1",
     "consent": {"analytics": true, "identityResolution": false, "thirdPartySharing": false},
     "timestamp": 1763800000000, "_eid": "optional"}

`visitorId` and `consent.analytics` are required; `sessionId` defaults to
"consent" and `timestamp` to the time of receipt (`consent.timestamp` to
`timestamp`). Unknown fields are refused, inside `consent` too. Without `_eid` the id is
`consent:<visitorId>:<timestamp>:<siteId>:<tag>` (its BLAKE2b-128 hex digest
after `consent:` when that is over the spec's 128 characters), the tag 16 hex
digits of the request's content identity: a retry of the same timestamped
decision is a duplicate, another decision at the same timestamp is a new one
(the fold gives a tie in time to the later arrival), and the same decision
sent to another property of the tenant is that property's own (idempotency ids
are tenant-wide, consent records per property). A request without `timestamp`
but with an `Idempotency-Key` header takes the header's id instead (an id the
client chose, header or `_eid`, is tenant-wide: sent to another property it is
other content, a 409), and one
with neither is a new decision each time it is sent (two identical requests
may be a visitor deciding twice): its tag is 16 random hex digits, so two
decisions received in the same millisecond never collide. The event runs through the same
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

from collector.errors import ServiceError
from collector.http.edge_body import content_identities, decode_translated
from collector.ingest.validate import CONSENT_FIELDS


class ConsentBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    visitorId: str
    consent: dict[str, Any]
    sessionId: str = "consent"
    timestamp: int | float | None = None
    eid: str | None = msgspec.field(default=None, name="_eid")


_decoder = msgspec.json.Decoder(ConsentBody)
# (`consent` stays a map rather than a Struct: its encoding is the content identity that retries are matched by.)
_encoder = msgspec.json.Encoder()


MAX_ID = 128  # spec 8.1
_SITE_TAG = b"site:"


def _generated_id(visitor_id: str, timestamp: float, site_id: str, distinct: str) -> str:
    eid = f"consent:{visitor_id}:{int(timestamp)}:{site_id}:{distinct}"
    if len(eid) <= MAX_ID:
        return eid
    return "consent:" + hashlib.blake2b(eid.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _content_tag(identity: bytes) -> str:
    """16 hex digits of the request's content identity.

    What tells a retry from another decision at the same timestamp: the
    visitor and time alone made a second, different decision a 409, and lost it.
    """
    return hashlib.blake2b(identity, digest_size=8).hexdigest()


_BODY_FIELDS = frozenset(field.encode_name for field in msgspec.structs.fields(ConsentBody))


def _name_every_unknown_field(body: bytes, error: ServiceError) -> None:
    """Raise a refusal naming each unknown top-level field, when `error` named the first only.

    (msgspec stops at the first: a body with two was told of one, fixed, then of the next.)
    """
    if "unknown field" not in error.message:
        return
    try:
        members = msgspec.json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return
    unknown = [name for name in members if name not in _BODY_FIELDS] if isinstance(members, dict) else []
    if unknown:
        raise _unknown_fields("$", unknown) from None


def refuse_unknown_choices(consent: dict[str, Any]) -> None:
    """ServiceError (400 validation_error) naming each field of `consent` that is not a choice.

    Dropped instead, a misspelt denial (`identity_resolution: false`) would be
    recorded as no denial at all.
    """
    unknown = [name for name in consent if name not in CONSENT_FIELDS]
    if unknown:
        raise _unknown_fields("$.consent", unknown)


def _unknown_fields(where: str, names: list[str]) -> ServiceError:
    """One refusal naming every unknown field under `where`, path first as the route's other messages."""
    details = [{"path": f"{where}.{name}", "message": f"Object contains unknown field `{name}`"} for name in names]
    first = details[0]
    more = f" (and {', '.join(f'`{name}`' for name in names[1:])})" if len(names) > 1 else ""
    return ServiceError(
        "validation_error", f"invalid consent body: {first['path']}: {first['message']}{more}", details=details
    )


def consent_to_event(
    body: bytes, *, now_ms: int, site_id: str, idempotency_key: str | None = None
) -> tuple[bytes, bytes, bytes | None]:
    """The `_consent_transition` event body, its content identity and the previous version's
    identity when it differs (see edge_to_event).

    Raises ServiceError on a bad body.
    """
    try:
        request = decode_translated(_decoder, body, "consent body")
    except ServiceError as error:
        _name_every_unknown_field(body, error)
        raise
    refuse_unknown_choices(request.consent)
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
    identity, legacy_identity = content_identities(request)
    if request.eid is not None:  # an empty one is refused by validation, as on /v1/events
        event["_eid"] = request.eid
    elif request.timestamp is not None:
        event["_eid"] = _generated_id(request.visitorId, timestamp, site_id, _content_tag(identity))
        return _encoder.encode(event), identity, legacy_identity
    elif not (idempotency_key and idempotency_key.strip(" \t")):
        event["_eid"] = _generated_id(request.visitorId, timestamp, site_id, os.urandom(8).hex())
        return _encoder.encode(event), identity, legacy_identity
    # The client's id (its _eid, or its Idempotency-Key) is tenant-wide, and a consent
    # record is one property's: the same id sent to another property is other content
    # (409), not a duplicate that left that property's record unwritten (helper-88).
    # No legacy identity: versions before this one hashed the request alone, so their
    # record would match the same id sent to any property (helper-91). A retry of a
    # decision one of them stored is a 409 instead; the decision is recorded already.
    return _encoder.encode(event), _SITE_TAG + site_id.encode() + b"\x00" + identity, None
