"""Who is calling: key lookup, server signature presence, suspension, scopes, domains.

Everything here runs before any storage write and before the body is read
(the server signature itself is verified once the body is in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import msgspec

from collector.access.domains import bind_site, gate
from collector.access.keycache import KeyCache
from collector.access.scopes import require_scope
from collector.access.tenants import KeyRecord, KeyType, Site
from collector.errors import ServiceError


class Caller(msgspec.Struct, frozen=True):
    record: KeyRecord
    site: Site
    key_from_header: bool


def resolve_key(
    cache: KeyCache, header_key: str | None, query_key: str | None
) -> tuple[KeyRecord, bool]:
    """The live key record and whether it came from the X-API-Key header (spec 5.1)."""
    header_key = (header_key or "").strip()
    key = header_key or (query_key or "").strip()  # a blank key is no key, from either place
    if not key:
        raise ServiceError(
            "missing_api_key", "send the API key in the X-API-Key header or the key parameter"
        )
    record = cache.lookup(key)
    if record is None:
        raise ServiceError("invalid_api_key", "the API key is unknown or revoked")
    return record, bool(header_key)


def admit_writer(
    cache: KeyCache,
    *,
    header_key: str | None,
    query_key: str | None,
    origin: str | None,
    referer: str | None,
    signature_headers: tuple[str | None, str | None],
    scope: str = "events:write",
    website_only: str | None = None,
) -> Caller:
    """Gate a browser-facing write (POST /v1/events, /v1/consent, /v1/replay) up to the body."""
    record, from_header = admit_key(
        cache,
        header_key=header_key,
        query_key=query_key,
        signature_headers=signature_headers,
        scope=scope,
        website_only=website_only,
    )
    with _refusing(record):
        site = bind_site(record, gate(record, origin, referer))
    return Caller(record, site, from_header)


@contextlib.contextmanager
def _refusing(record: KeyRecord) -> Iterator[None]:
    """Name the caller's key on a refusal after authentication (its response gets rate headers)."""
    try:
        yield
    except ServiceError as error:
        error.key_record = record
        raise


def admit_reader(
    cache: KeyCache, *, header_key: str | None, query_key: str | None, origin: str | None, referer: str | None
) -> Caller:
    """Gate a browser-facing read (GET /v1/signals/:visitorId): key, suspension, domains, site.

    No server signature (spec 5.2 signs event writes) and no scope (5.3 names
    none for the snapshot). A server key is taken from the header only: spec
    5.1 keeps keys out of URLs, and only browsers and apps need the parameter.
    """
    record, from_header = resolve_key(cache, header_key, query_key)
    if record.key_type is KeyType.SERVER and not from_header:
        raise ServiceError(
            "missing_api_key", "a server key is accepted only in the X-API-Key header, never in the URL"
        )
    with _refusing(record):
        if record.is_suspended:
            raise ServiceError("account_suspended", "this account is suspended")
        site = bind_site(record, gate(record, origin, referer))
    return Caller(record, site, from_header)


def admit_key(
    cache: KeyCache,
    *,
    header_key: str | None,
    query_key: str | None,
    signature_headers: tuple[str | None, str | None],
    scope: str = "events:write",
    website_only: str | None = None,
) -> tuple[KeyRecord, bool]:
    """The caller's key, checked for signature headers, suspension and scope (no domain gate).

    POST /v1/edge/pageview stops here: an edge worker is not a browser and
    sends no Origin (spec 5.5 rule 1 gates browser-facing writes only), so its
    site is bound from the page URL once the body is read (rule 5).
    `website_only` names a surface only website keys may write (for example
    "session replay"): any other key type is refused first, with 403
    key_type_not_allowed.
    """
    record, from_header = resolve_key(cache, header_key, query_key)
    with _refusing(record):
        _check_key(record, from_header, signature_headers, scope, website_only)
    return record, from_header


def _check_key(
    record: KeyRecord,
    from_header: bool,
    signature_headers: tuple[str | None, str | None],
    scope: str,
    website_only: str | None,
) -> None:
    if website_only and record.key_type is not KeyType.BROWSER:
        raise ServiceError(
            "key_type_not_allowed",
            f"{website_only} accepts website keys only, not a {record.key_type} key",
            keyType=record.key_type.value,
        )
    if record.key_type is KeyType.SERVER:
        timestamp, signature = signature_headers
        # Spec 5.2: a server key is accepted only in X-API-Key, with both signature headers.
        if not from_header or not timestamp or not signature:
            raise ServiceError(
                "server_signature_required",
                "server-key event writes need X-API-Key, X-CS-Timestamp and X-CS-Signature",
                )
    if record.is_suspended:
        raise ServiceError("account_suspended", "this account is suspended")
    require_scope(record, scope, error_code="insufficient_permission")
