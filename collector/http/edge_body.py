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

import ipaddress
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

import msgspec

from collector.errors import ServiceError
from collector.ingest.surrogates import without_lone_surrogates
from collector.ingest.validate import TITLE_MAX, URL_MAX, USER_AGENT_MAX


class EdgePageview(msgspec.Struct, frozen=True):
    url: str
    visitorId: str
    sessionId: str
    eid: str | None = msgspec.field(default=None, name="_eid")
    title: str | None = None  # "" when absent or null, as referrer and userAgent may be null
    referrer: str | None = None
    timestamp: int | float | None = None
    userAgent: str | None = None
    consent: dict[str, Any] | None = None
    # The visitor's address as the edge saw it (CF-Connecting-IP and the like),
    # which the datacenter heuristic judges instead of the connection's (the edge
    # worker's). Never stored, and not content: see _EdgeContent. Any JSON value:
    # it is checked only when a trusted relay sent it (relayed_address).
    clientIp: Any = None


class _EdgeContent(msgspec.Struct, frozen=True):
    """What the idempotency hash covers: the request's content, in the layout the
    edge body had before `clientIp` (and a null `title`): a record stored by an
    earlier version still matches a retry of the same request."""

    url: str
    visitorId: str
    sessionId: str
    eid: str | None = msgspec.field(default=None, name="_eid")
    title: str = ""
    referrer: str | None = None
    timestamp: int | float | None = None
    userAgent: str | None = None
    consent: dict[str, Any] | None = None


class EdgeTranslation(NamedTuple):
    event: bytes  # the pageview event body
    page_url: str
    identity: bytes  # what the idempotency hash covers: the request as sent, canonically encoded
    legacy_identity: bytes | None  # the previous version's identity, when it differs
    client_ip: Any  # the visitor's address as the edge sent it (any JSON value; None when absent)


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
        path = where.rstrip("`") or "$"
        # "{path}: {message}", as every other validation message of these routes reads
        raise ServiceError(
            "validation_error", f"invalid {what}: {path}: {message}", details=[{"path": path, "message": message}]
        ) from None
    except msgspec.DecodeError:
        if (repaired := without_lone_surrogates(body)) is not body:  # (a string cut inside an emoji)
            return decode_translated(decoder, repaired, what)
        raise ServiceError("invalid_json", "body is not valid JSON") from None
    except UnicodeDecodeError:  # (msgspec raises it for bad UTF-8 inside a string)
        raise ServiceError("invalid_json", "body is not valid UTF-8") from None
    except RecursionError:
        raise ServiceError("invalid_json", "body is nested too deeply") from None


def edge_to_event(body: bytes, *, user_agent: str | None, now_ms: int, website_key: bool = True) -> EdgeTranslation:
    """The pageview event body for an edge request, and what else the route needs of it.

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
    try:
        path = urlsplit(edge.url).path or "/"
    except ValueError:  # ("http://[::1", a host that changes under NFKC): it was a 500
        raise _invalid("$.url", "url does not parse as a URL") from None
    page: dict[str, Any] = {"url": edge.url, "path": path, "title": edge.title or ""}
    if edge.referrer:
        page["referrer"] = edge.referrer
    device: dict[str, Any] = {"viewport": {"width": 0, "height": 0}}
    # The body's userAgent, else the request's header (a relay's own user agent when
    # it sends none); an all-space one is none. Left out when neither says anything.
    agent = edge.userAgent if edge.userAgent and not edge.userAgent.isspace() else user_agent
    if agent:
        if agent is user_agent and len(agent) > USER_AGENT_MAX:
            raise _invalid("User-Agent", f"the User-Agent header is over {USER_AGENT_MAX} characters (spec 2.2):"
                                         " send the visitor's user agent as userAgent")
        device["userAgent"] = agent
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
    content = _EdgeContent(
        edge.url, edge.visitorId, edge.sessionId, edge.eid, edge.title or "",
        edge.referrer, edge.timestamp, edge.userAgent, edge.consent,
    )  # fmt: skip
    # As on /v1/events, a resend that differs only past a truncation limit is the same content.
    truncated = _within_limits(content)
    identity, legacy = content_identities(truncated)
    if truncated is not content:  # the previous version's identity was of the request uncut
        legacy = _identity_encoder.encode(content)
    return EdgeTranslation(_encoder.encode(event), edge.url, identity, legacy, edge.clientIp)


def relayed_address(client_ip: Any) -> str | None:
    """A trusted relay's `clientIp`, checked: it stands for the visitor's address.

    Checked only for a relay the operator trusts: from anyone else it is ignored,
    and a malformed one ("", "unknown", a port, a list, an X-Forwarded-For chain)
    must not lose the pageview.
    """
    if client_ip is None:
        return None
    if not isinstance(client_ip, str) or not _is_address(client_ip):
        raise _invalid("$.clientIp", "not an IPv4 or IPv6 address (one address, as a string)")
    return client_ip


def _is_address(text: str) -> bool:
    if len(text) > 45:  # (the longest IPv6 text form; ipaddress needs no longer input)
        return False
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return getattr(address, "scope_id", None) is None  # ("fe80::1%eth0" names a local link)


def _within_limits(content: _EdgeContent) -> _EdgeContent:
    """The content with url, title and referrer cut as the pageview's are (spec 8.1)."""
    referrer = content.referrer
    if len(content.url) <= URL_MAX and len(content.title) <= TITLE_MAX and (
        referrer is None or len(referrer) <= URL_MAX
    ):
        return content
    return msgspec.structs.replace(
        content,
        url=content.url[:URL_MAX],
        title=content.title[:TITLE_MAX],
        referrer=referrer[:URL_MAX] if referrer is not None else None,
    )


def _invalid(path: str, message: str) -> ServiceError:
    return ServiceError(
        "validation_error", f"invalid edge pageview: {path}: {message}", details=[{"path": path, "message": message}]
    )


# Where the translated pageview's fields came from in the edge body, so that a
# validation error names a field the client sent (page.path is made from url).
_EDGE_FIELDS = (
    ("page.url", "url"), ("page.path", "url"), ("page.title", "title"),
    ("page.referrer", "referrer"), ("device.userAgent", "userAgent"),
)  # fmt: skip


def in_edge_terms(error: ServiceError) -> ServiceError:
    """A validation error of the translated pageview, its paths and messages in the edge body's fields."""
    sent = error.extra.get("details")
    if error.code != "validation_error" or not isinstance(sent, list):
        return error
    details: dict[str, str] = {}  # path -> message; the first one for a path (url stands for two)
    for detail in sent:
        details.setdefault(_edge_field(detail["path"]), _edge_field(detail["message"]))
    path, message = next(iter(details.items()))
    return ServiceError(
        "validation_error", f"invalid edge pageview: {path}: {message}",
        details=[{"path": p, "message": m} for p, m in details.items()],
    )


def _edge_field(text: str) -> str:
    for event_field, edge_field in _EDGE_FIELDS:
        text = text.replace(event_field, edge_field)
    return text


def content_identities(request: msgspec.Struct) -> tuple[bytes, bytes | None]:
    """A translated request's content identity, and the previous version's when it differs.

    The identity sorts the keys inside the request's free-form maps (`consent`);
    the previous version encoded them in the order sent.
    """
    identity, legacy = _identity_encoder.encode(request), _encoder.encode(request)
    return identity, (legacy if legacy != identity else None)
