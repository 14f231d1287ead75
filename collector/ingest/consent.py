"""Consent rules that decide whether an event may be stored at all (spec 2.2, 4.1 rule 9).

- A strict-consent property (`sites[].strictConsent`) drops every event whose
  `consent.analytics` is missing or false, before any billable or identity
  side effect. `_consent_transition` events are the consent record itself and
  are kept (they carry no page content and count toward no allowance).
- An identify event is dropped when identity-resolution consent is denied,
  either by the event's own `consent.identityResolution: false` or by the
  visitor's latest recorded consent (POST /v1/consent or an earlier
  `_consent_transition`): no identity value is stored. Either denial wins.
Pure functions; the recorded state is looked up by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from collector.ingest.schema import AnyEvent, ConsentTransition, Identify


class ConsentState(msgspec.Struct, frozen=True, omit_defaults=True):
    """A visitor's latest consent, as recorded from a `_consent_transition`."""

    visitor_id: str
    analytics: bool
    at_ms: int  # when the visitor decided (consent.timestamp, else the event's timestamp)
    eid: str
    identityResolution: bool | None = None
    thirdPartySharing: bool | None = None


def consent_drop_reason(event: AnyEvent, strict: bool) -> str | None:
    if not strict or isinstance(event, ConsentTransition):
        return None
    if event.consent is None:
        return "consent_missing"
    if not event.consent.analytics:
        return "consent_denied"
    return None


def identity_denied(event: AnyEvent, recorded_denial: Callable[[str], bool] | None) -> bool:
    """True for an identify event that must not be stored (identity consent denied)."""
    if not isinstance(event, Identify):
        return False
    if event.consent is not None and event.consent.identityResolution is False:
        return True
    return recorded_denial is not None and recorded_denial(event.visitorId)


def state_of(event: ConsentTransition, eid: str) -> ConsentState | None:
    consent = event.consent
    if consent is None:
        return None
    at = consent.timestamp if consent.timestamp is not None else event.timestamp
    return ConsentState(
        visitor_id=event.visitorId,
        analytics=consent.analytics,
        at_ms=int(at),
        eid=eid,
        identityResolution=consent.identityResolution,
        thirdPartySharing=consent.thirdPartySharing,
    )
