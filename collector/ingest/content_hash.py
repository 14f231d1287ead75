"""An event's idempotency content hash, shared by the pipeline and the older number forms. Pure."""

from __future__ import annotations

import msgspec
import xxhash

from collector.ingest.schema import AnyEvent, Form, Identify

_encoder = msgspec.json.Encoder()
_sorted_keys_encoder = msgspec.json.Encoder(order="deterministic")


def event_hashes(event: AnyEvent) -> tuple[bytes, bytes, bytes | None]:
    """(the event's JSON as sent, its content hash, the previous version's hash when it differs).

    The hash covers the event as the client sent it, except key order inside
    its free-form maps (form values, identity), which is not content: those
    are hashed with their keys sorted. Versions before that hashed them in the
    order sent, which is the previous version's hash a retry may still match.
    """
    client_json = _encoder.encode(event)
    if isinstance(event, Form | Identify) and (canonical := _sorted_keys_encoder.encode(event)) != client_json:
        return client_json, xxhash.xxh3_128_digest(canonical), xxhash.xxh3_128_digest(client_json)
    return client_json, xxhash.xxh3_128_digest(client_json), None
