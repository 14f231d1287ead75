"""Consent rules that decide whether an event may be stored at all (spec 2.2, 4.1 rule 9).

- A strict-consent property (`sites[].strictConsent`) drops every event whose
  `consent.analytics` is missing or false, before any billable or identity
  side effect. `_consent_transition` events are the consent record itself and
  are kept (they carry no page content and count toward no allowance).
- An identify event is dropped when identity-resolution consent is denied,
  either by the event's own `consent.identityResolution: false` (here) or by
  the visitor's latest consent: the recorded one (POST /v1/consent or an
  earlier request's `_consent_transition`) weighed against the transitions
  earlier in the same request (at admission, storage.admission). No identity
  value is stored. Either denial wins.
- "Latest", field by field: each of `identityResolution` and
  `thirdPartySharing` comes from the newest decision that states it, so a
  decision that leaves one out (`{"analytics": false}`) does not erase an
  earlier denial. Ties in time go to the later arrival.
- A decision's time is `consent.timestamp`, else the event's timestamp; one
  more than the allowed skew ahead of the server clock (or absurd) is the time
  of receipt, so a fast client clock cannot pin the record against every later
  decision (spec 2.2: the server overrides a skewed timestamp). The identity
  choice of a decision more than the skew behind is dated at receipt when it
  is a denial (a slow clock must not lose a denial), at its time when it is a
  grant. A request's transitions are in the order the visitor made them: its
  latest identity choice replaces the earlier ones for the rest of the
  request, and earlier ones are stored dated no later than the last.
Pure functions; the recorded state is read at admission.
"""

from __future__ import annotations

import msgspec

from collector.ingest.schema import AnyEvent, ConsentTransition, Identify

SKEW_MS = 5 * 60 * 1000  # spec 2.2: a client timestamp further off than this is overridden


class ConsentState(msgspec.Struct, frozen=True, omit_defaults=True):
    """A visitor's latest consent, as recorded from a `_consent_transition`."""

    visitor_id: str
    analytics: bool
    at_ms: int  # when the visitor decided (consent.timestamp, else the event's timestamp)
    eid: str
    identityResolution: bool | None = None
    thirdPartySharing: bool | None = None
    identity_at_ms: int = -1  # when its identity choice counts as made (see identity_time); -1: at_ms


def consent_drop_reason(event: AnyEvent, strict: bool) -> str | None:
    if not strict or isinstance(event, ConsentTransition):
        return None
    if event.consent is None:
        return "consent_missing"
    if not event.consent.analytics:
        return "consent_denied"
    return None


def identity_declined(event: Identify) -> bool:
    """Whether the identify's own consent denies identity resolution.

    The visitor's recorded consent, and the request's own transitions before
    the event, are weighed at admission (storage.admission), inside the write
    transaction that reads the record.
    """
    return event.consent is not None and event.consent.identityResolution is False


def decision_time(event: ConsentTransition, now_ms: int) -> int:
    """When the visitor decided, as the record orders decisions (see the module notes)."""
    consent = event.consent
    at = consent.timestamp if consent is not None and consent.timestamp is not None else None
    if at is None:
        at = event.timestamp
    if not 0 <= at <= now_ms + SKEW_MS:  # also inf and 4,000-digit integers
        return now_ms if at > 0 else 0
    return int(at)


def identity_time(event: ConsentTransition, at_ms: int, now_ms: int) -> int:
    """When the decision's identity-resolution choice counts as made.

    Its decision time, except for a denial more than the skew behind the
    server clock: a slow clock or a queued decision, which the server cannot
    tell apart. Such a denial is dated at receipt, so it is not lost to a
    grant it followed (spec 2.2 overrides the timestamp); a grant keeps its
    time, so a queued one cannot undo a newer denial. Only this choice moves:
    the decision's analytics and sharing choices keep its time.
    """
    consent = event.consent
    if consent is not None and consent.identityResolution is False and at_ms < now_ms - SKEW_MS:
        return now_ms
    return at_ms


def state_of(event: ConsentTransition, eid: str, now_ms: int) -> ConsentState | None:
    """The decision as recorded (as the visitor's latest; see pipeline._order_identity_choices)."""
    consent = event.consent
    if consent is None:
        return None
    at_ms = decision_time(event, now_ms)
    identity_at = identity_time(event, at_ms, now_ms)
    return ConsentState(
        visitor_id=event.visitorId,
        analytics=consent.analytics,
        at_ms=at_ms,
        eid=eid,
        identityResolution=consent.identityResolution,
        thirdPartySharing=consent.thirdPartySharing,
        identity_at_ms=identity_at,
    )
