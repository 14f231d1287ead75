"""The storage format marker and its migrations, on real LMDB directories of an older layout."""

from __future__ import annotations

import re
from pathlib import Path

import lmdb
import pytest

import storage.env as env_module
from storage import outbox
from storage.env import DB_NAMES, FORMAT_VERSION, Databases, Storage
from storage.errors import FormatError
from storage.migrations import MIGRATIONS, format_0_to_1
from tests.unit.test_check import NOV, admit

OLD_RECEIPT = "rcpt_" + "0" * 8 + f"{1:012x}"


def make_format_0(path: Path) -> None:
    """A directory as the collector wrote it before the marker: data, no `format`, no `node_id`."""
    env = lmdb.open(str(path), max_dbs=len(DB_NAMES) + 4)
    dbs = {name: env.open_db(name.encode()) for name in DB_NAMES}
    record = outbox.OutboxRecord(
        OLD_RECEIPT, "acme", "web", "old-1", NOV, "browser", b'{"type":"click"}'
    )
    with env.begin(write=True) as txn:
        txn.put(
            b"cs_live_acme_0000", b'{"key":"cs_live_acme_0000","clientId":"acme"}', db=dbs["keys"]
        )
        txn.put(outbox.seq_key(1), outbox.encode(record), db=dbs["outbox"])
        txn.put(outbox.NEXT_SEQ, (2).to_bytes(8, "big"), db=dbs["meta"])
    env.close()


def raw_meta(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), max_dbs=len(DB_NAMES) + 4)
    try:
        meta = env.open_db(b"meta")
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor(db=meta)}
    finally:
        env.close()


def test_every_format_below_the_current_one_has_a_step() -> None:
    assert sorted(MIGRATIONS) == list(range(FORMAT_VERSION))
    # env.py runs the same steps (until it imports this registry, it keeps a copy)
    assert sorted(env_module.MIGRATIONS) == sorted(MIGRATIONS)


def test_format_0_directory_is_migrated_on_open(tmp_path: Path) -> None:
    make_format_0(tmp_path)
    assert b"format" not in raw_meta(tmp_path)
    storage = Storage(tmp_path)
    assert storage.format_version() == FORMAT_VERSION == 1
    assert re.fullmatch(r"[0-9a-f]{8}", storage.node_id)
    assert [(seq, r.eid, r.receipt_id) for seq, r in outbox.iter_outbox(storage)] == [
        (1, "old-1", OLD_RECEIPT)
    ]
    # new events continue the sequence under the new node id
    result = admit(storage, ["new-1"])
    assert result.receipt_ids == [outbox.receipt_id(storage.node_id, 2)]
    node_id = storage.node_id
    storage.close()
    assert raw_meta(tmp_path)[b"format"] == b"1"
    assert Storage(tmp_path).node_id == node_id  # migrated once, not on every open


def test_the_step_keeps_an_existing_node_id(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), max_dbs=len(DB_NAMES) + 4)
    dbs = Databases(**{name: env.open_db(name.encode()) for name in DB_NAMES})
    with env.begin(write=True) as txn:
        format_0_to_1(txn, dbs)
        first = txn.get(b"node_id", db=dbs.meta)
        format_0_to_1(txn, dbs)
        assert txn.get(b"node_id", db=dbs.meta) == first
        txn.put(b"node_id", b"cafef00d", db=dbs.meta)
        format_0_to_1(txn, dbs)
        assert txn.get(b"node_id", db=dbs.meta) == b"cafef00d"
    env.close()
    assert first is not None and re.fullmatch(rb"[0-9a-f]{8}", first)


def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_format_0(tmp_path)
    before = raw_meta(tmp_path)

    def broken(txn: lmdb.Transaction, dbs: Databases) -> None:
        txn.put(b"node_id", b"halfdone", db=dbs.meta)
        raise RuntimeError("migration bug")

    monkeypatch.setitem(env_module.MIGRATIONS, 0, broken)
    with pytest.raises(RuntimeError, match="migration bug"):
        Storage(tmp_path)
    assert raw_meta(tmp_path) == before
    monkeypatch.undo()
    storage = Storage(tmp_path)
    assert storage.format_version() == FORMAT_VERSION and storage.node_id != "halfdone"
    storage.close()


def test_a_missing_step_is_a_format_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_format_0(tmp_path)
    monkeypatch.delitem(env_module.MIGRATIONS, 0)
    with pytest.raises(FormatError, match="no migration from storage format 0"):
        Storage(tmp_path)
    assert b"format" not in raw_meta(tmp_path)
