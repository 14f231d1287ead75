"""The secret that signs stream tokens, kept in the data directory's meta database.

Created on first use in one write transaction, so every worker process and
every `collector stream-token mint` sharing the directory signs and checks
with the same secret. It never leaves the directory except in a backup.
"""

from __future__ import annotations

import secrets

import lmdb

from storage.env import Storage
from storage.errors import mapped_lmdb_errors

_KEY = b"stream_token_secret"


def stream_token_secret(storage: Storage) -> bytes:
    with mapped_lmdb_errors(), storage.read() as txn:
        found = txn.get(_KEY, db=storage.dbs.meta)
    if found is not None:
        return bytes(found)

    def create(txn: lmdb.Transaction) -> bytes:
        found = txn.get(_KEY, db=storage.dbs.meta)  # another process may have won
        if found is not None:
            return bytes(found)
        secret = secrets.token_bytes(32)
        txn.put(_KEY, secret, db=storage.dbs.meta)
        return secret

    return storage.write_transaction(create)
