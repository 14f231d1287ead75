"""What the pure ingest pipeline takes and what it decides.

`prepare_batch(body, ctx) -> PreparedBatch` (in `pipeline.py`) is a plain
function: no I/O, no clock, no trio. The HTTP layer builds the context, the
writer admits the accepted candidates in one transaction.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import msgspec

from collector.ingest.schema import AnyEvent

if TYPE_CHECKING:
    from collector.ingest.bots import BotClassifier, RequestEvidence
    from collector.ingest.consent import ConsentState
    from collector.ingest.sealing import FieldSealer


class MeterKind(enum.StrEnum):
    """Which monthly allowance an admitted event draws on (spec 6.2)."""

    PAGEVIEW = "pageview"  # a human pageview: the monthly pageview cap
    COVERAGE = "coverage"  # bot pageviews and every accepted non-pageview event
    NONE = "none"  # counts toward nothing (for example _consent_transition)


class IngestContext(msgspec.Struct, frozen=True, kw_only=True):
    client_id: str
    site_id: str
    key_type: str  # "browser" | "mobile" | "server"
    production: bool
    now_ms: int
    idempotency_key: str | None = None  # the header value, untrimmed
    # A translated single-event route (edge pageview, consent): the request as
    # the client sent it, canonically encoded. The idempotency hash covers it
    # instead of the event, which holds server defaults (the time of receipt).
    content_identity: bytes | None = None
    # The same request encoded as before object keys inside its free-form maps
    # were sorted, when that differs: a retry of a request first stored by the
    # previous version still matches (see AcceptedEvent.earlier_hashes).
    legacy_identity: bytes | None = None
    edge: bool = False  # body is a POST /v1/edge/pageview body, not an events body
    strict_consent: bool = False  # the bound property drops events without analytics consent
    sealer: FieldSealer | None = None  # seals form values and raw identity fields
    bots: BotClassifier | None = None  # None: every event is classified human
    bot_evidence: RequestEvidence | None = None  # computed once per request


class AcceptedEvent(msgspec.Struct, frozen=True):
    """An event that passed validation; admission still decides duplicate/conflict."""

    index: int
    eid: str
    event_type: str
    content_hash: bytes  # 16 bytes: the keyed hash of the client content, before enrichment
    stored: bytes  # JSON of the enriched event exactly as it goes to the outbox
    meter: MeterKind
    is_bot: bool = False
    bot_category: str | None = None
    consent_state: ConsentState | None = None  # set for _consent_transition events
    visitor_id: str = ""
    event_ms: int = 0  # the client's timestamp (a click's intervals; a page's, unless too far ahead: _projection_ms)
    # The unkeyed hashes versions before the keyed one stored for this content, for a
    # translated route (edge, consent); an event's are worked out from hashed_event
    # only when needed (number_forms.earlier_event_hashes).
    earlier_hashes: tuple[bytes, ...] = ()
    # The event as hashed (before enrichment): from it, the unkeyed hashes earlier
    # versions gave it are worked out, only when a record of theirs is found (see
    # ingest.number_forms).
    hashed_event: AnyEvent | None = None
    # A pageview's or scroll's (sessionId, page path, depth percent, timeOnPage
    # ms; 0, 0 for a pageview): the visitor projection derives each page's
    # scroll depth and time on page from them (spec 2.3).
    page: tuple[str, str, float, float] | None = None


class EventIssue(msgspec.Struct, frozen=True):
    path: str  # JSONPath-like, relative to the event: "$.page.url"
    message: str


class RejectedEvent(msgspec.Struct, frozen=True):
    index: int
    eid: str | None
    code: str  # "validation_error"
    issues: list[EventIssue]


class DroppedEvent(msgspec.Struct, frozen=True):
    index: int
    eid: str | None
    reason: str  # for example "consent_missing", "checkout_form"


class PreparedBatch(msgspec.Struct, frozen=True):
    received: int
    single: bool  # the body was one event object, not {"events": [...]}
    accepted: list[AcceptedEvent]
    rejected: list[RejectedEvent]
    dropped: list[DroppedEvent]
