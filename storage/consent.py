"""Visitors' latest consent: (clientId, siteId, visitorId) -> the newest recorded state.

Written inside the admitting transaction of a `_consent_transition` event
(from POST /v1/consent or /v1/events); a state older than the one stored
never replaces it, so a late retry cannot undo a newer decision.
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


def newer(candidate: RecordedConsent, stored_raw: bytes | memoryview | None) -> bool:
    return stored_raw is None or candidate.at_ms >= decode(stored_raw).at_ms


def read_consent(storage: Storage, client_id: str, site_id: str, visitor_id: str) -> RecordedConsent | None:
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(consent_key(client_id, site_id, visitor_id), db=storage.dbs.consent)
    return decode(raw) if raw is not None else None
