"""The event wire format as msgspec Structs (spec 2.2, 2.3; operator contract wire details).

Type-specific fields sit at the top level of the event beside the envelope;
a click's `element` and a pageview's `performance` stay nested. Hard limits
that reject are `Meta` constraints; limits that truncate (page fields) are
applied after decoding. Unknown fields are ignored and not stored.
Stored Structs evolve only by appending fields with defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Id128 = Annotated[str, Meta(min_length=1, max_length=128)]
Number = int | float
# A number keeps the form it was sent in: 1280 is stored as 1280, 0.5 as 0.5. (A
# constraint needs a type of its own on each side of the union. Before 2026-11-25
# these were floats, and 1280 was stored as 1280.0: see ingest/number_forms.py.)
Percent = Annotated[int, Meta(ge=0, le=100)] | Annotated[float, Meta(ge=0, le=100)]
Unit = Annotated[int, Meta(ge=0, le=1)] | Annotated[float, Meta(ge=0, le=1)]
# A size or a duration: any number, as the spec has it ("number"): a negative one is
# a client's measuring fault (loadEventEnd read before the load event) and costs no
# pageview. A whole number written out past int64 is refused (msgspec bounds
# integer constraints to int64); 1e21 written so is a float and is kept.
Measure = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | float
FileSize = Annotated[int, Meta(ge=0, le=100 * 1024 * 1024)] | Annotated[float, Meta(ge=0, le=100 * 1024 * 1024)]
FieldCount = Annotated[int, Meta(ge=0, le=1000)] | Annotated[float, Meta(ge=0, le=1000)]
Platform = Literal["web", "ios", "android", "react-native", "server"]


class Size(msgspec.Struct, frozen=True):
    width: Measure
    height: Measure


class Automation(msgspec.Struct, frozen=True, omit_defaults=True):
    score: Percent | None = None
    signals: list[Annotated[str, Meta(max_length=128)]] | None = None
    webdriver: bool | None = None


class Device(msgspec.Struct, frozen=True, omit_defaults=True):
    userAgent: Annotated[str, Meta(max_length=512)] | None = None
    viewport: Size | None = None
    screen: Size | None = None
    clientPlatform: Platform | None = None
    fingerprint: Annotated[str, Meta(max_length=512)] | None = None
    fingerprintConfidence: Percent | None = None
    gpuVendor: Annotated[str, Meta(max_length=256)] | None = None
    gpuRenderer: Annotated[str, Meta(max_length=512)] | None = None
    connectionType: Annotated[str, Meta(max_length=64)] | None = None
    pixelRatio: Measure | None = None
    timezone: Annotated[str, Meta(max_length=64)] | None = None
    language: Annotated[str, Meta(max_length=64)] | None = None
    platform: Annotated[str, Meta(max_length=128)] | None = None
    automation: Automation | None = None


class Page(msgspec.Struct, frozen=True, omit_defaults=True):
    path: str
    title: str
    url: str | None = None
    referrer: str | None = None


class Consent(msgspec.Struct, frozen=True, omit_defaults=True):
    analytics: bool
    identityResolution: bool | None = None
    thirdPartySharing: bool | None = None
    timestamp: Number | None = None


class EventConsent(Consent, frozen=True, omit_defaults=True):
    """An event's consent object. It also reads the spellings of its fields that SDKs
    get wrong, only to refuse them (validate.check_event): dropped as unknown
    fields, an `identity_resolution: false` would store identity data its visitor
    refused. (Read here, they cost a request nothing when absent.)"""

    identity_resolution: bool | None = None
    identity_resolution_kebab: bool | None = msgspec.field(default=None, name="identity-resolution")
    identity_resolution_pascal: bool | None = msgspec.field(default=None, name="IdentityResolution")
    identity_resolution_lower: bool | None = msgspec.field(default=None, name="identityresolution")
    identity_resolution_upper: bool | None = msgspec.field(default=None, name="IDENTITY_RESOLUTION")
    identity_resolution_title: bool | None = msgspec.field(default=None, name="Identity_Resolution")
    identity_resolution_spaced: bool | None = msgspec.field(default=None, name="identity resolution")
    third_party_sharing: bool | None = None
    third_party_sharing_kebab: bool | None = msgspec.field(default=None, name="third-party-sharing")
    third_party_sharing_pascal: bool | None = msgspec.field(default=None, name="ThirdPartySharing")
    third_party_sharing_lower: bool | None = msgspec.field(default=None, name="thirdpartysharing")
    third_party_sharing_upper: bool | None = msgspec.field(default=None, name="THIRD_PARTY_SHARING")
    third_party_sharing_title: bool | None = msgspec.field(default=None, name="Third_Party_Sharing")
    third_party_sharing_spaced: bool | None = msgspec.field(default=None, name="third party sharing")


class Event(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag_field="type"):
    visitorId: Id128
    sessionId: Id128
    timestamp: Number
    eid: Id128 | None = msgspec.field(default=None, name="_eid")
    page: Page | None = None  # required except for _consent_transition (checked in validate)
    device: Device | None = None
    consent: EventConsent | None = None


class Performance(msgspec.Struct, frozen=True, omit_defaults=True):
    loadTime: Measure | None = None
    domContentLoaded: Measure | None = None
    firstContentfulPaint: Measure | None = None


class Pageview(Event, tag="pageview", frozen=True):
    performance: Performance | None = None


class Element(msgspec.Struct, frozen=True, omit_defaults=True):
    selector: Annotated[str, Meta(max_length=512)]
    text: Annotated[str, Meta(max_length=512)]
    x: Number
    y: Number
    pageX: Number | None = None
    pageY: Number | None = None
    normX: Unit | None = None
    normY: Unit | None = None
    viewportWidth: Measure | None = None
    viewportHeight: Measure | None = None
    docWidth: Measure | None = None
    docHeight: Measure | None = None


class Click(Event, tag="click", frozen=True):
    element: Element


class Scroll(Event, tag="scroll", frozen=True):
    depth: Percent
    timeOnPage: Measure


class FileMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    name: Annotated[str, Meta(max_length=256)]
    field: Annotated[str, Meta(max_length=256)] | None = None
    size: FileSize | None = None
    type: Annotated[str, Meta(max_length=128)] | None = None


# ($ also matches before a final newline, as Python's re reads it: validate.check_event
# refuses such a value, with a message a JavaScript author reads the right way.)
UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class Form(Event, tag="form", frozen=True):
    action: Literal["focus", "blur", "submit", "abandon"]
    formId: Annotated[str, Meta(min_length=1, max_length=256)]
    fieldCount: FieldCount
    form_selector: Annotated[str, Meta(max_length=512)] | None = None
    raw_fields: Annotated[str, Meta(max_length=4096)] | None = None
    detected_name: bool | None = None
    detected_email: bool | None = None
    detected_phone: bool | None = None
    completion_rate: Percent | None = None
    values: dict[Annotated[str, Meta(max_length=256)], Annotated[str, Meta(max_length=10_000)]] | None = None
    files: Annotated[list[FileMeta], Meta(max_length=25)] | None = None
    form_submission_id: Annotated[str, Meta(pattern=UUID_PATTERN)] | None = None
    submitted_at: Number | None = None


class Custom(Event, tag="custom", frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    category: Annotated[str, Meta(max_length=256)] | None = None
    action: Annotated[str, Meta(max_length=256)] | None = None
    label: Annotated[str, Meta(max_length=4096)] | None = None
    value: Number | None = None


class Identify(Event, tag="identify", frozen=True):
    hem: Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
    hemMd5: Annotated[str, Meta(pattern="^[0-9a-f]{32}$")] | None = None
    rawEmail: Annotated[str, Meta(max_length=320)] | None = None
    rawPhone: Annotated[str, Meta(max_length=64)] | None = None
    identity: dict[str, Any] | None = None


class ConsentPage(msgspec.Struct, frozen=True, omit_defaults=True):
    """A _consent_transition's page, which never carries content (spec 6.1; validate
    refuses a url, title or referrer, and a path alone is not stored): none of its fields
    is asked for. As a Page, one without a title was told to add the title it was then
    refused for (helper-135). Fields in Page's order, so a page an earlier version
    accepted (a path and an empty title) encodes, and hashes, as it did."""

    path: str | None = None
    title: str | None = None
    url: str | None = None
    referrer: str | None = None


class ConsentTransition(Event, tag="_consent_transition", frozen=True, kw_only=True):
    # (kw_only as Event: the field keeps its place, so the event encodes, and hashes, as before)
    page: ConsentPage | None = None  # type: ignore[assignment]


AnyEvent = Pageview | Click | Scroll | Form | Custom | Identify | ConsentTransition


class Batch(msgspec.Struct, frozen=True):
    events: list[msgspec.Raw]


class BotInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """The stored verdict: `bot.isBot`, `bot.category` and the evidence labels that fired."""

    isBot: bool
    category: str
    signals: tuple[str, ...] = ()


class Enrichment(msgspec.Struct, frozen=True, omit_defaults=True):
    """Server fields appended to every stored event."""

    eid: str
    clientId: str
    siteId: str
    receivedAt: int
    clientTimestamp: Number | None = None
    privacyWithheld: dict[str, str] | None = None  # form field -> privacy class (privacy floor)
    bot: BotInfo | None = None
