"""POST /v1/edge/pageview: the edge body and its translation into a pageview event.

An edge worker (CDN function, reverse proxy) sees the page request, not the
browser, so its body is flat and small:

    {"_eid": "...", "visitorId": "...", "sessionId": "...", "url": "https://...",
     "title": "...", "referrer": "...", "timestamp": 1763800000000,
     "userAgent": "...", "consent": {"analytics": true}}

`url`, `visitorId` and `sessionId` are required; `title` defaults to "",
`timestamp` to the time of receipt, `userAgent` to the request's User-Agent.
The edge knows no viewport: the stored pageview carries 0 x 0. The result is
a normal pageview event body that runs through the same pipeline as
POST /v1/events (validation, idempotency, payment scan, metering).
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec

from collector.errors import ServiceError


class EdgePageview(msgspec.Struct, frozen=True):
    url: str
    visitorId: str
    sessionId: str
    eid: str | None = msgspec.field(default=None, name="_eid")
    title: str = ""
    referrer: str | None = None
    timestamp: int | float | None = None
    userAgent: str | None = None
    consent: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(EdgePageview)
_encoder = msgspec.json.Encoder()
# The content identity: object keys inside free-form maps (`consent`) sorted, so a
# retry that orders them differently is the same content, not a 409.
_identity_encoder = msgspec.json.Encoder(order="deterministic")


T = TypeVar("T")


def decode_translated(decoder: msgspec.json.Decoder[T], body: bytes, what: str) -> T:
    """Decode the body of a route that translates into an event; ServiceError when it is bad."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        # One event failing returns details (spec 4.1 rule 2), as for /v1/events.
        message, _, where = str(exc).partition(" - at `")
        raise ServiceError(
            "validation_error", f"invalid {what}: {exc}",
            details=[{"path": where.rstrip("`") or "$", "message": message}],
        ) from None
    except msgspec.DecodeError:
        raise ServiceError("invalid_json", "body is not valid JSON") from None
    except UnicodeDecodeError:  # (msgspec raises it for bad UTF-8 inside a string)
        raise ServiceError("invalid_json", "body is not valid UTF-8") from None
    except RecursionError:
        raise ServiceError("invalid_json", "body is nested too deeply") from None


def edge_to_event(
    body: bytes, *, user_agent: str | None, now_ms: int, website_key: bool = True
) -> tuple[bytes, str, bytes, bytes | None]:
    """The pageview event body for an edge request, its page URL, its content identity
    and the identity the previous version gave it (None when the same).

    A website key's pageview is a web pageview; a mobile or server key's
    declares no platform, so the key type stamps it (spec 2.4: react-native,
    server) and it is validated and classified as native (spec 5.5 rule 7).

    The identity (the request re-encoded canonically) is what the idempotency
    hash covers: the event itself holds defaults that differ on every retry
    (the time of receipt). The previous version did not sort the keys inside
    `consent`; a stored record with its identity still matches a retry.
    ServiceError on a bad body.
    """
    edge = decode_translated(_decoder, body, "edge pageview")
    page: dict[str, Any] = {"url": edge.url, "path": urlsplit(edge.url).path or "/", "title": edge.title}
    if edge.referrer:
        page["referrer"] = edge.referrer
    device: dict[str, Any] = {"userAgent": edge.userAgent or user_agent or "", "viewport": {"width": 0, "height": 0}}
    if website_key:
        device["clientPlatform"] = "web"
    event: dict[str, Any] = {
        "type": "pageview",
        "visitorId": edge.visitorId,
        "sessionId": edge.sessionId,
        "timestamp": edge.timestamp if edge.timestamp is not None else now_ms,
        "page": page,
        "device": device,
    }
    if edge.eid is not None:
        event["_eid"] = edge.eid
    if edge.consent is not None:
        event["consent"] = edge.consent
    return (_encoder.encode(event), edge.url, *content_identities(edge))


def content_identities(request: msgspec.Struct) -> tuple[bytes, bytes | None]:
    """A translated request's content identity, and the previous version's when it differs.

    The identity sorts the keys inside the request's free-form maps (`consent`);
    the previous version encoded them in the order sent.
    """
    identity, legacy = _identity_encoder.encode(request), _encoder.encode(request)
    return identity, (legacy if legacy != identity else None)
