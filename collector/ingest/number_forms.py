"""Numbers as versions before 2026-11-25 held them, for idempotency across the upgrade.

Those versions decoded the constrained number fields (a percent, a 0-1 ratio,
a size or a duration) as floats, so `"width": 1280` was hashed and stored as
`1280.0`. Now a number keeps the form it was sent in. An event retried across
the upgrade must still be a duplicate of the record the previous version
wrote, so admission, on finding a record whose hash differs, asks for the
hashes the previous version would have given (computed only then: a retry
across an upgrade is rare, the conversion is not free). Pure functions.
"""

from __future__ import annotations

from typing import Any

import msgspec

from collector.ingest.content_hash import unkeyed_event_hashes
from collector.ingest.schema import (
    AnyEvent,
    Automation,
    Click,
    ConsentTransition,
    Custom,
    Device,
    Element,
    Form,
    Identify,
    Pageview,
    Performance,
    Scroll,
    Size,
)

# The fields those versions typed as float (schema.Percent, Unit and NonNegative
# then), and the nested objects that hold some. Frozen as they were: a field
# added since never reached an old record.
_FLOAT_FIELDS: dict[type, tuple[str, ...]] = {
    Size: ("width", "height"),
    Automation: ("score",),
    Device: ("fingerprintConfidence", "pixelRatio"),
    Performance: ("loadTime", "domContentLoaded", "firstContentfulPaint"),
    Element: ("normX", "normY", "viewportWidth", "viewportHeight", "docWidth", "docHeight"),
    Scroll: ("depth", "timeOnPage"),
    Form: ("completion_rate",),
}
_ENVELOPE_OBJECTS = ("device",)
_NESTED: dict[type, tuple[str, ...]] = {
    Device: ("viewport", "screen", "automation"),
    Pageview: (*_ENVELOPE_OBJECTS, "performance"),
    Click: (*_ENVELOPE_OBJECTS, "element"),
    Scroll: _ENVELOPE_OBJECTS,
    Form: _ENVELOPE_OBJECTS,
    Custom: _ENVELOPE_OBJECTS,
    Identify: _ENVELOPE_OBJECTS,
    ConsentTransition: _ENVELOPE_OBJECTS,
}


def _as_floats(value: Any) -> Any:
    changes: dict[str, Any] = {}
    for name in _FLOAT_FIELDS.get(type(value), ()):
        number = getattr(value, name)
        if type(number) is int:
            changes[name] = float(number)
    for name in _NESTED.get(type(value), ()):
        inner = getattr(value, name)
        if inner is not None and (converted := _as_floats(inner)) is not inner:
            changes[name] = converted
    return msgspec.structs.replace(value, **changes) if changes else value


def as_previous_numbers(event: AnyEvent) -> AnyEvent:
    """`event` with whole numbers in the formerly float fields as floats; itself when it has none."""
    converted: AnyEvent = _as_floats(event)
    return converted


def hashes_before_int_numbers(event: AnyEvent) -> tuple[bytes, ...]:
    """What versions before 2026-11-25 hashed `event` to: the unkeyed hashes of it with
    floats, both the hash and the one before it (the last of those versions sorted a
    form's or identify's map keys, the one before hashed them in the order sent)."""
    previous = as_previous_numbers(event)
    if previous is event:
        return ()
    return unkeyed_event_hashes(previous)


def earlier_event_hashes(event: AnyEvent, with_float_forms: bool) -> tuple[bytes, ...]:
    """The unkeyed hashes versions before the keyed hash stored for `event` (as written),
    and with_float_forms those of the versions before 2026-11-25 too (numbers as floats).
    Worked out only when admission finds a record of theirs: a retry across an upgrade is
    rare, and ordinary requests do not pay for it."""
    hashes = unkeyed_event_hashes(event)
    return hashes + hashes_before_int_numbers(event) if with_float_forms else hashes
