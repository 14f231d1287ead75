"""Storage format migrations: MIGRATIONS[n] turns format n into format n + 1.

`Storage` runs the steps from the directory's format up to FORMAT_VERSION
inside the write transaction that opens it, writing the format marker after
each step, so a failed migration changes nothing. A step reads and writes
only through the transaction it is given and must be safe on any directory of
its source format. Add a step (and bump FORMAT_VERSION in env.py) whenever the
layout of a stored record or key changes; never edit a released step.

Format 0 is a data directory written before the marker existed: data in
`keys` or `outbox`, no `format` and no `node_id` in meta.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

import lmdb

if TYPE_CHECKING:
    from storage.env import Databases

Migration = Callable[[lmdb.Transaction, "Databases"], None]


def format_0_to_1(txn: lmdb.Transaction, dbs: Databases) -> None:
    """Give the node an id: receipts (rcpt_<node id><seq>) need one."""
    if txn.get(b"node_id", db=dbs.meta) is None:
        txn.put(b"node_id", secrets.token_hex(4).encode(), db=dbs.meta)


MIGRATIONS: dict[int, Migration] = {0: format_0_to_1}
