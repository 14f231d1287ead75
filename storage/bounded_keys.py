"""LMDB keys that end in a client-supplied string, kept within LMDB's key size.

LMDB refuses keys over 511 bytes (MDB_BAD_VALSIZE). The spec bounds event,
visitor and session ids by characters (128), and the Idempotency-Key header
by 512 characters, so a valid id can need up to four times that in UTF-8.
Such a key keeps its readable prefix and replaces the id with 0xFF and the
hex of a 16-byte BLAKE2b digest of it: 0xFF never occurs in UTF-8, so a
digested key can never equal a literal one; hex holds no 0x00, so keys still
split on their separators; and the prefix keeps keys of one tenant (and site)
together for range scans. Readers that need the id itself never parse
it back out of such a key; they compare whole keys.
"""

from __future__ import annotations

import hashlib

MAX_KEY_BYTES = 511  # lmdb.Environment.max_key_size() of the default build
_DIGESTED = b"\xff"


def bounded_key(prefix: str, tail: str, *, reserve: int = 0) -> bytes:
    """`prefix + tail` in UTF-8, or `prefix`, 0xFF and a digest of `tail` when that is too long.

    `reserve`: bytes the caller appends after the returned key.
    """
    key = (prefix + tail).encode()
    if len(key) + reserve <= MAX_KEY_BYTES:
        return key
    return prefix.encode() + _DIGESTED + hashlib.blake2b(tail.encode(), digest_size=16).hexdigest().encode()
