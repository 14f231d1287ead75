"""Field encryption at rest: form `values`, `identify.rawEmail` and `rawPhone`.

Each value is sealed on its own with AES-256-GCM (the `cryptography`
package) under the active field key, before the event reaches storage:

    enc:v1:<key id>:<base64url(12-byte nonce || ciphertext || 16-byte tag)>

The associated data binds a ciphertext to its place, `clientId \\0 eventId \\0
field path`, so a sealed value copied into another event or field does not
open. The key id travels with every value, so keys rotate without rewriting
stored events: new values use the active key, old ones name the key they need.
Opening happens only in the audited reveal (`collector reveal`).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from collector.ingest.schema import AnyEvent, Form, Identify

PREFIX = "enc:v1:"
NONCE_BYTES = 12


class SealError(ValueError):
    """A sealed value cannot be opened: unknown key id, wrong place, or tampered."""


def field_aad(client_id: str, event_id: str, path: str) -> bytes:
    return f"{client_id}\0{event_id}\0{path}".encode()


# Where sealed values sit in a stored event (dotted path; `values.*` is every form value).
SEALED_PATHS = ("values.*", "rawEmail", "rawPhone")


def is_sealed(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


class FieldSealer:
    """Seals with the active key; opens with whichever key a value names."""

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if active not in keys:
            raise ValueError(f"the active field key {active!r} is not among the keys")
        for key_id, key in keys.items():
            if len(key) != 32 or ":" in key_id:
                raise ValueError(f"field key {key_id!r} must be 32 bytes with no ':' in its id")
        self.active = active
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.content_digest = content_digest(keys[hash_key_id(keys)])

    @property
    def key_ids(self) -> list[str]:
        return list(self._ciphers)

    def seal(self, plaintext: str, aad: bytes) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.active].encrypt(nonce, plaintext.encode(), aad)
        return f"{PREFIX}{self.active}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, token: str, aad: bytes) -> str:
        if not is_sealed(token):
            raise SealError("not a sealed value")
        key_id, _, payload = token[len(PREFIX) :].partition(":")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise SealError(f"field key {key_id!r} is not available")
        try:
            raw = base64.urlsafe_b64decode(payload)
            return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad).decode()
        except (InvalidTag, ValueError) as exc:
            raise SealError("the sealed value does not open here (wrong place or tampered)") from exc


def rotation_number(key_id: str) -> int | None:
    """N of an id `kN` (ASCII digits), the form `keys rotate-field-key` gives; None for another id."""
    digits = key_id[1:]
    return int(digits) if key_id[:1] == "k" and digits.isascii() and digits.isdigit() else None


def hash_key_id(key_ids: Iterable[str]) -> str:
    """The key the idempotency hash is keyed from, one a rotation never changes: the first
    id in sort order not of the form `kN` (named by hand, as a systemd credential may be),
    else the `kN` of the lowest N. A rotation adds the next `kN` and every key stays in
    the file (helper-129: with "prod" alone, the first rotation added "k1", which ranked
    first, and every retry of what was stored before became a 409)."""
    ids = list(key_ids)
    named = sorted(kid for kid in ids if rotation_number(kid) is None)
    return named[0] if named else min(ids, key=lambda kid: rotation_number(kid) or 0)


def content_digest(key: bytes) -> Callable[[bytes], bytes]:
    """The idempotency content hash: 16 bytes of BLAKE2b keyed with a key derived from `key`.

    Keyed because the hash covers the event as sent, sealed, withheld and scrubbed
    values included: an unkeyed hash let anyone holding the data file (or a backup
    without the key file) confirm guesses of those values against it (helper-128
    recovered phone numbers, dates of birth and a withheld SSN that way).
    """
    derived = hashlib.blake2b(key, digest_size=32, person=b"collector-idem").digest()
    keyed = hashlib.blake2b(key=derived, digest_size=16)

    def digest(data: bytes) -> bytes:
        copy = keyed.copy()  # (a copy of the keyed state skips the key block: about 30% less)
        copy.update(data)
        return copy.digest()

    return digest


def seal_sensitive(event: AnyEvent, sealer: FieldSealer | None, client_id: str, eid: str) -> AnyEvent:
    """The event with form values and raw identity fields sealed.

    Without a sealer the values are withheld instead: plaintext never reaches
    storage.
    """
    if isinstance(event, Form) and event.values:
        if sealer is None:
            return msgspec.structs.replace(event, values={})
        values = {
            name: sealer.seal(value, field_aad(client_id, eid, f"values.{name}"))
            for name, value in event.values.items()
        }
        return msgspec.structs.replace(event, values=values)
    if isinstance(event, Identify) and (event.rawEmail is not None or event.rawPhone is not None):
        sealed: dict[str, str | None] = {}
        for field in ("rawEmail", "rawPhone"):
            value = getattr(event, field)
            if value is not None:
                sealed[field] = sealer.seal(value, field_aad(client_id, eid, field)) if sealer else None
        return msgspec.structs.replace(event, **sealed)
    return event
