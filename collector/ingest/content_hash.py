"""An event's idempotency content hash, shared by the pipeline and the older number forms. Pure.

The hash is keyed (collector.ingest.sealing.content_digest): it covers the
event as sent, sealed and withheld values included. Versions before 2026-11-26
stored an unkeyed xxh3_128 of the same bytes; a retry of an event such a
version stored is matched against those (`unkeyed_hashes`), which admission
compares only with records of that form.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import xxhash

from collector.ingest.schema import AnyEvent, Form, Identify

_encoder = msgspec.json.Encoder()
_sorted_keys_encoder = msgspec.json.Encoder(order="deterministic")


def hashed_forms(event: AnyEvent) -> tuple[bytes, bytes]:
    """(the event's JSON as sent, the form its hash covers).

    The hash covers the event as the client sent it, except key order inside
    its free-form maps (form values, identity), which is not content: those
    are hashed with their keys sorted.
    """
    client_json = _encoder.encode(event)
    if isinstance(event, Form | Identify):
        return client_json, _sorted_keys_encoder.encode(event)
    return client_json, client_json


def event_hashes(event: AnyEvent, digest: Callable[[bytes], bytes]) -> tuple[bytes, bytes]:
    """(the event's JSON as sent, its keyed content hash). The unkeyed hashes earlier versions
    stored are worked out only when a record of theirs is found (number_forms.earlier_event_hashes)."""
    client_json, hashed = hashed_forms(event)
    return client_json, digest(hashed)


def unkeyed_hashes(client_json: bytes, hashed: bytes) -> tuple[bytes, ...]:
    """What versions before the keyed hash stored for this content: xxh3_128 of its sorted
    form, and of the order sent when that differs (the versions before sorting)."""
    if hashed == client_json:
        return (xxhash.xxh3_128_digest(hashed),)
    return xxhash.xxh3_128_digest(hashed), xxhash.xxh3_128_digest(client_json)


def unkeyed_event_hashes(event: AnyEvent) -> tuple[bytes, ...]:
    return unkeyed_hashes(*hashed_forms(event))
