"""Visitors' latest consent: (clientId, siteId, visitorId) -> the newest recorded state.

Written inside the admitting transaction of a `_consent_transition` event
(from POST /v1/consent or /v1/events); a state older than the one stored
never replaces it, so a late retry cannot undo a newer decision. Field by
field: `identityResolution` and `thirdPartySharing` each keep the value of the
newest decision that stated them, with that decision's time, so a decision
that leaves one out keeps the one decided before (an omission is not a
grant), and a late decision still wins a field whose stored value is older.
Ties in time go to the later arrival.
"""

from __future__ import annotations

import msgspec

from storage.bounded_keys import bounded_key
from storage.errors import UNREADABLE_RECORD


class RecordedConsent(msgspec.Struct, array_like=True, frozen=True):
    at_ms: int  # the newest decision's time (its `analytics` and `eid`)
    analytics: bool
    identity_resolution: bool | None
    third_party_sharing: bool | None
    eid: str
    # When each optional choice was stated (-1: at at_ms). Records written before
    # these fields existed hold one decision's choices, except those written by
    # the commits c2b7836..c5ebe6d^ (a first merge, never in a release), where an
    # inherited choice counts as of at_ms and can look newer than it was.
    identity_at_ms: int = -1
    sharing_at_ms: int = -1

    def identity_time(self) -> int:
        return self.at_ms if self.identity_at_ms < 0 else self.identity_at_ms

    def sharing_time(self) -> int:
        return self.at_ms if self.sharing_at_ms < 0 else self.sharing_at_ms


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RecordedConsent)


def consent_key(client_id: str, site_id: str, visitor_id: str) -> bytes:
    return bounded_key(f"{client_id}\x00{site_id}\x00", visitor_id)


# What a record that does not decode counts as: a decision denying everything,
# dated when it is read, less this much (decisions of the last seconds, still
# between receipt and commit, count as newer). So no identity value is stored
# on a guess, an old decision arriving late (an offline queue, a retry) cannot
# turn the damage into a grant, and a new decision replaces it field by field.
# `collector check` reports the record.
UNREADABLE_SLACK_MS = 10_000
# How far ahead of the writer's clock a decision may be dated by a client (spec 2.2 lets a
# timestamp stand up to five minutes off; collector.ingest.consent.SKEW_MS), plus slack.
FAST_CLOCK_MS = 5 * 60 * 1000 + UNREADABLE_SLACK_MS


def unreadable(now_ms: int) -> RecordedConsent:
    at = max(0, now_ms - UNREADABLE_SLACK_MS)
    return RecordedConsent(at, False, False, False, "", at, at)


def encode(state: RecordedConsent) -> bytes:
    return _encoder.encode(state)


def decode(raw: bytes | memoryview, *, now_ms: int) -> RecordedConsent:
    """The stored record; unreadable(now_ms) for bytes that are not one.

    A time further ahead of `now_ms` than a client's clock may be (FAST_CLOCK_MS,
    spec 2.2's five minutes) was stamped while the server's clock ran fast: it is read
    as FAST_CLOCK_MS before now, or the record would win over every decision until
    the real time caught up with it, a later denial included (helper-108: a grant
    received during a day-fast spell let identifies through after the visitor denied
    identity resolution). So decisions dated in the last five minutes (an SDK's
    batching delay) win over it, a queue older than that does not (helper-112: at 10 s
    a batched denial 20 s old lost). Times within it are a client's and stand (helper-111).
    """
    try:
        record = _decoder.decode(raw)
    except UNREADABLE_RECORD:
        return unreadable(now_ms)
    ahead = now_ms + FAST_CLOCK_MS
    if max(record.at_ms, record.identity_at_ms, record.sharing_at_ms) <= ahead:
        return record
    past = max(0, now_ms - FAST_CLOCK_MS)
    return msgspec.structs.replace(
        record,
        at_ms=record.at_ms if record.at_ms <= ahead else past,
        identity_at_ms=record.identity_at_ms if record.identity_at_ms <= ahead else past,
        sharing_at_ms=record.sharing_at_ms if record.sharing_at_ms <= ahead else past,
    )


def decode_strict(raw: bytes | memoryview) -> RecordedConsent:
    """The stored record; raises for bytes that are not one (for `collector check`)."""
    return _decoder.decode(raw)


def later_choice(
    stored: bool | None, stored_at: int, candidate: bool | None, candidate_at: int
) -> tuple[bool | None, int]:
    """The choice stated most recently, with its time; the candidate arrived later and wins a tie."""
    if candidate is None or (stored is not None and stored_at > candidate_at):
        return stored, stored_at
    return candidate, candidate_at


def merged(
    candidate: RecordedConsent, stored_raw: bytes | memoryview | None, *, now_ms: int
) -> RecordedConsent | None:
    """The record once `candidate` (a single decision) is applied; None when it stays as stored."""
    if stored_raw is None:
        return candidate
    stored = decode(stored_raw, now_ms=now_ms)
    newer = candidate if candidate.at_ms >= stored.at_ms else stored
    identity, identity_at = later_choice(
        stored.identity_resolution, stored.identity_time(), candidate.identity_resolution, candidate.identity_time()
    )
    sharing, sharing_at = later_choice(
        stored.third_party_sharing, stored.sharing_time(), candidate.third_party_sharing, candidate.at_ms
    )
    result = RecordedConsent(newer.at_ms, newer.analytics, identity, sharing, newer.eid, identity_at, sharing_at)
    return None if result == stored else result
