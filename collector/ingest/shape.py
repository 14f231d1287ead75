"""A body is one event or `{"events": [...]}`; one that reads both ways, or holds two arrays, is refused.

Spec 4.1 allows exactly two shapes. Decoders settle the others silently:
msgspec keeps the last of repeated keys, so `{"events": [a], "events": [b]}`
stored b alone (also with the key spelt `"\u0065vents"`), and an event
that also carried an `events` array was read as the one event with its
array ignored. Either way a 202 said nothing of the
events left out (helper-62). Both are refused instead, before anything is
stored, as the client's framing error they are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from collector.errors import ServiceError

# An "events" key may be written with escapes for its letters (`"\u0065vents"`).
# No encoder escapes ASCII letters, so ordinary bodies, non-ASCII escapes
# included, never pay for the exact check on this account.
_SPELT_WITH_ESCAPES = re.compile(rb"\\u00(?:65|76|6[eE]|74|73)")


def refuse_ambiguous_shape(body: bytes, decoded: object, *, single: bool) -> None:
    """validation_error for a body whose events a decoder would drop without a word.

    `decoded`: the body's generic decoding when one was made (None on the key
    probe's path, where a single event holds no key but its schema's fields).
    """
    if single:
        if isinstance(decoded, dict) and "events" in decoded:
            raise ServiceError(
                "validation_error",
                'the body is one event ("type") and a batch ("events") at once: send one of the two shapes',
            )
    elif _may_repeat_events(body) and "events" in _repeated_top_level_keys(body):
        raise ServiceError("validation_error", 'the body has more than one "events" array: send them as one')


def _may_repeat_events(body: bytes) -> bool:
    """Whether the raw bytes leave room for a second "events" key (the exact check is slower)."""
    # (the backslash test is a memchr: most bodies hold no escape at all)
    return body.count(b'"events"') > 1 or (b"\\" in body and _SPELT_WITH_ESCAPES.search(body) is not None)


def _repeated_top_level_keys(body: bytes) -> set[str]:
    """Keys of the outermost object given more than once (only called when the raw bytes suggest it)."""
    outermost: list[str] = []

    def remember(pairs: list[tuple[str, Any]]) -> None:
        outermost[:] = [key for key, _ in pairs]  # the outermost object is closed (and seen) last

    try:
        json.loads(body, object_pairs_hook=remember)
    except ValueError:
        return set()  # the real decoder accepted it; what json alone refuses is not this check's
    except RecursionError:
        # msgspec reads a few levels deeper than json: a repeat there would go unseen.
        raise ServiceError("validation_error", "the body is nested too deeply to be read as one batch") from None
    seen: set[str] = set()
    repeated: set[str] = set()
    for key in outermost:
        (repeated if key in seen else seen).add(key)
    return repeated
