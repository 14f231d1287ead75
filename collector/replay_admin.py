"""`collector replay dump`: one session's replay chunks, one JSON line each, in seq order."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from storage.env import Storage
from storage.replay import ChunkId, iter_session

_json = msgspec.json.Encoder()


def session_lines(
    storage: Storage,
    session_id: str,
    client_id: str | None = None,
    *,
    on_unreadable: Callable[[ChunkId, Exception], None] | None = None,
) -> Iterator[str]:
    """The chunks of `session_id` as JSON lines (ordered by client, site, then seq).

    Each line: clientId, siteId, sessionId, seq, visitorId, receivedAt,
    receiptId, timestamp (the client's, or null) and events (the stored records).
    """
    for (client, site, session, seq), record in iter_session(
        storage, session_id, client_id, on_unreadable=on_unreadable
    ):
        head = _json.encode(
            {
                "clientId": client,
                "siteId": site,
                "sessionId": session,
                "seq": seq,
                "visitorId": record.visitor_id,
                "receivedAt": record.received_ms,
                "receiptId": record.receipt_id,
                "timestamp": record.client_timestamp,
            }
        )
        # The records are stored as JSON already: splice them in rather than re-encode.
        yield f'{head[:-1].decode()},"events":{record.events.decode()}}}'
