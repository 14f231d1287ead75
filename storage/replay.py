"""Session-replay chunks: one record per (clientId, siteId, sessionId, seq).

Key: `clientId \\0 siteId \\0 sessionId \\0 seq` with seq as 8 bytes big-endian,
so one session's chunks sit together and read back in sequence order (a
session id too long for that is digested: storage/bounded_keys.py). The
value is a msgpack `ReplayRecord`; its first fields are the small ones, so
retention and `check` decode a `ReplayHead` without copying the chunk.

A chunk is stored once: the same (key, content hash) again is a duplicate
that returns the first receipt; another content under the same key is a
conflict. Chunks draw on no usage counter and never enter the outbox.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import msgspec

from storage.bounded_keys import bounded_key
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, mapped_lmdb_errors, readable_rows
from storage.writer import JobRefused, WriteContext

log = logging.getLogger("collector.replay")

SWEEP_POS = b"replay_sweep_pos"


class ReplayRecord(msgspec.Struct, array_like=True, frozen=True):
    received_ms: int
    receipt_id: str
    content_hash: bytes
    visitor_id: str
    client_timestamp: int | float | None
    events: bytes  # the chunk's records as one JSON array


class ReplayHead(msgspec.Struct, array_like=True, frozen=True):
    """The leading fields of a ReplayRecord (msgspec skips the rest)."""

    received_ms: int
    receipt_id: str
    content_hash: bytes


class StoredChunk(msgspec.Struct, frozen=True):
    receipt_id: str | None  # None: a new chunk the job was told not to store
    duplicate: bool


class ChunkConflict(msgspec.Struct, frozen=True):
    """The (session, seq) already holds different content (409 idempotency_conflict)."""

    session_id: str
    seq: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplayRecord)
_head_decoder = msgspec.msgpack.Decoder(ReplayHead)


def chunk_key(client_id: str, site_id: str, session_id: str, seq: int) -> bytes:
    return _session_part(client_id, site_id, session_id) + b"\x00" + seq.to_bytes(8, "big")


def _session_part(client_id: str, site_id: str, session_id: str) -> bytes:
    # A session id too long for LMDB's key size is digested (storage/bounded_keys.py).
    return bounded_key(f"{client_id}\x00{site_id}\x00", session_id, reserve=9)


def split_key(key: bytes) -> tuple[str, str, str, int] | None:
    """(clientId, siteId, sessionId, seq) of a chunk key; None when malformed."""
    if len(key) < 12 or key[-9:-8] != b"\x00":
        return None
    parts = key[:-9].decode(errors="replace").split("\x00")
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2], int.from_bytes(key[-8:], "big")


def encode(record: ReplayRecord) -> bytes:
    return _encoder.encode(record)


def decode(raw: bytes | memoryview) -> ReplayRecord:
    return _decoder.decode(raw)


def decode_head(raw: bytes | memoryview) -> ReplayHead:
    return _head_decoder.decode(raw)


class StoreChunk:
    """A WriteJob storing one chunk, or recognising it as a duplicate; refuses a conflict."""

    __slots__ = (
        "key",
        "session_id",
        "seq",
        "content_hash",
        "visitor_id",
        "client_timestamp",
        "events",
        "store",
    )

    def __init__(
        self,
        *,
        client_id: str,
        site_id: str,
        session_id: str,
        seq: int,
        content_hash: bytes,
        visitor_id: str,
        client_timestamp: int | float | None,
        events: bytes,
        store: bool = True,
    ) -> None:
        """`store` False: recognise a stored duplicate or conflict only (a chunk its
        consent keeps out), storing nothing new."""
        self.key = chunk_key(client_id, site_id, session_id, seq)
        self.store = store
        self.session_id = session_id
        self.seq = seq
        self.content_hash = content_hash
        self.visitor_id = visitor_id
        self.client_timestamp = client_timestamp
        self.events = events

    def run(self, ctx: WriteContext) -> StoredChunk:
        db = ctx.dbs.replay
        raw = ctx.txn.get(self.key, db=db)
        if raw is not None:
            try:
                head = decode_head(raw)
            except UNREADABLE_RECORD as exc:
                # Damaged on disk: stored afresh (a 503 would come back on every retry
                # of this chunk); `collector check` lists such records.
                if self.store:
                    log.error("replay chunk %s/%d did not decode (%s); storing it afresh", self.session_id, self.seq, exc)
            else:
                if head.content_hash != self.content_hash:
                    raise JobRefused(ChunkConflict(self.session_id, self.seq))
                return StoredChunk(head.receipt_id, True)
        if not self.store:
            return StoredChunk(None, False)
        receipt = f"rply_{ctx.storage.node_id}{os.urandom(6).hex()}"
        record = ReplayRecord(
            ctx.now_ms,
            receipt,
            self.content_hash,
            self.visitor_id,
            self.client_timestamp,
            self.events,
        )
        ctx.txn.put(self.key, encode(record), db=db)
        ctx.stored_elsewhere = True
        return StoredChunk(receipt, False)


ChunkId = tuple[str, str, str, int]  # clientId, siteId, sessionId, seq


def iter_session(
    storage: Storage,
    session_id: str,
    client_id: str | None = None,
    chunk: int = 64,
    *,
    on_unreadable: Callable[[ChunkId, Exception], None] | None = None,
) -> Iterator[tuple[ChunkId, ReplayRecord]]:
    """Every chunk of `session_id` (of one client, or of all), in key order.

    Reads `chunk` records per snapshot, so a slow reader never holds a read
    transaction open. With a client the scan covers that client's chunks only;
    without one it walks the whole replay database (an operator tool). A
    chunk that does not decode goes to `on_unreadable` and is skipped; without
    it the error is raised.
    """
    prefix = f"{client_id}\x00".encode() if client_id is not None else b""
    after: bytes | None = None
    while True:
        rows: list[tuple[ChunkId, ReplayRecord | Exception]] = []
        with mapped_lmdb_errors(), storage.read() as txn:
            cursor = txn.cursor(db=storage.dbs.replay)
            positioned = cursor.set_range(after or prefix) if (after or prefix) else cursor.first()
            if positioned and after is not None and cursor.key() == after:
                positioned = cursor.next()
            while positioned and len(rows) < chunk:
                key = bytes(cursor.key())
                if not key.startswith(prefix):
                    positioned = False
                    break
                after = key
                parts = split_key(key)
                if parts is not None and key[:-9] == _session_part(parts[0], parts[1], session_id):
                    try:
                        record: ReplayRecord | Exception = decode(cursor.value())
                    except UNREADABLE_RECORD as exc:
                        record = exc
                    rows.append(((parts[0], parts[1], session_id, parts[3]), record))
                positioned = cursor.next()
        yield from readable_rows(rows, on_unreadable)  # reported outside the read transaction
        if not positioned:
            return
