"""Visitors' latest consent: (clientId, siteId, visitorId) -> the newest recorded state.

Written inside the admitting transaction of a `_consent_transition` event
(from POST /v1/consent or /v1/events); a state older than the one stored
never replaces it, so a late retry cannot undo a newer decision. Field by
field: a decision that leaves `identityResolution` or `thirdPartySharing`
out keeps the one decided before (an omission is not a grant), and an older
decision arriving late still fills in a field the newer one left out.
"""

from __future__ import annotations

import msgspec

from storage.bounded_keys import bounded_key
from storage.env import Storage
from storage.errors import mapped_lmdb_errors


class RecordedConsent(msgspec.Struct, array_like=True, frozen=True):
    at_ms: int
    analytics: bool
    identity_resolution: bool | None
    third_party_sharing: bool | None
    eid: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RecordedConsent)


def consent_key(client_id: str, site_id: str, visitor_id: str) -> bytes:
    return bounded_key(f"{client_id}\x00{site_id}\x00", visitor_id)


def encode(state: RecordedConsent) -> bytes:
    return _encoder.encode(state)


def decode(raw: bytes | memoryview) -> RecordedConsent:
    return _decoder.decode(raw)


def merged(candidate: RecordedConsent, stored_raw: bytes | memoryview | None) -> RecordedConsent | None:
    """The record once `candidate` is applied; None when it stays as stored."""
    if stored_raw is None:
        return candidate
    stored = decode(stored_raw)
    newer, older = (candidate, stored) if candidate.at_ms >= stored.at_ms else (stored, candidate)
    result = RecordedConsent(
        newer.at_ms,
        newer.analytics,
        newer.identity_resolution if newer.identity_resolution is not None else older.identity_resolution,
        newer.third_party_sharing if newer.third_party_sharing is not None else older.third_party_sharing,
        newer.eid,
    )
    return None if result == stored else result


def read_consent(storage: Storage, client_id: str, site_id: str, visitor_id: str) -> RecordedConsent | None:
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(consent_key(client_id, site_id, visitor_id), db=storage.dbs.consent)
    return decode(raw) if raw is not None else None
