"""Recognising a data directory before opening it (storage/datadir.py): nothing is written."""

from __future__ import annotations

from pathlib import Path

import lmdb

from storage.datadir import DB_NAMES, data_dir_problem
from storage.env import FORMAT_VERSION, Storage
from tests.unit.test_migrations import make_format_0


def test_a_collector_directory_is_accepted_for_every_command(tmp_path: Path) -> None:
    Storage(tmp_path / "data").close()
    assert data_dir_problem(tmp_path / "data", create=False) is None
    assert data_dir_problem(tmp_path / "data", create=True) is None


def test_an_empty_data_file_is_a_first_start_that_stopped_early(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "data.mdb").write_bytes(b"")
    assert data_dir_problem(tmp_path / "data", create=True) is None
    assert "no collector data" in (data_dir_problem(tmp_path / "data", create=False) or "")


def test_a_foreign_environment_is_refused_and_left_alone(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "other"))
    with env.begin(write=True) as txn:
        txn.put(b"user:1", b"alice")
    env.close()
    before = (tmp_path / "other" / "data.mdb").read_bytes()
    for create in (False, True):
        assert "not a collector's" in (data_dir_problem(tmp_path / "other", create=create) or "")
    assert (tmp_path / "other" / "data.mdb").read_bytes() == before


def test_an_environment_larger_than_lmdb_default_map_is_read(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "data")
    with storage.env.begin(write=True) as txn:
        for n in range(24):
            txn.put(f"pad{n}".encode(), bytes(512 * 1024), db=storage.dbs.meta)
    storage.close()  # (py-lmdb opens an environment once per process)
    assert data_dir_problem(tmp_path / "data", create=False) is None


def _environment(path: Path, databases: dict[bytes, dict[bytes, bytes]], main: dict[bytes, bytes] | None = None) -> bytes:
    """Another program's LMDB environment with these named databases and main-database keys; its data.mdb."""
    env = lmdb.open(str(path), max_dbs=len(databases) + 1)
    with env.begin(write=True) as txn:
        for name, rows in databases.items():
            db = env.open_db(name, txn=txn)
            for key, value in rows.items():
                txn.put(key, value, db=db)
        for key, value in (main or {}).items():
            txn.put(key, value)
    env.close()
    return (path / "data.mdb").read_bytes()


def _refused(path: Path, before: bytes, expected: str) -> None:
    for create in (False, True):
        problem = data_dir_problem(path, create=create) or ""
        assert expected in problem, (create, problem)
    assert (path / "data.mdb").read_bytes() == before


def test_a_foreign_environment_with_a_meta_database_is_refused(tmp_path: Path) -> None:
    # A database called meta vouched for the whole environment: every command
    # but restore opened (and serve wrote into) another program's LMDB (helper-58).
    before = _environment(tmp_path / "other", {b"meta": {b"schema": b"3"}, b"users": {b"1": b"alice"}})
    _refused(tmp_path / "other", before, "not a collector's (it has 'users')")


def test_a_meta_database_with_a_format_marker_and_no_node_id_is_not_a_collectors(tmp_path: Path) -> None:
    # A collector writes both in one transaction; format 0 had neither.
    before = _environment(tmp_path / "other", {b"meta": {b"format": b"1"}, b"keys": {b"k": b"v"}})
    _refused(tmp_path / "other", before, "a format marker or a node id without the other")
    before = _environment(tmp_path / "another", {b"meta": {b"node_id": b"x"}})
    _refused(tmp_path / "another", before, "a format marker or a node id without the other")


def test_a_format_0_directory_still_opens_and_migrates(tmp_path: Path) -> None:
    # Its meta holds outbox_next_seq and no node id (helper-61: refused by every command).
    make_format_0(tmp_path / "data")
    assert data_dir_problem(tmp_path / "data", create=False) is None
    assert data_dir_problem(tmp_path / "data", create=True) is None
    storage = Storage(tmp_path / "data")
    assert storage.format_version() == FORMAT_VERSION and storage.node_id
    storage.close()
    assert data_dir_problem(tmp_path / "data", create=False) is None


def test_a_plain_value_named_like_a_collector_database_is_refused(tmp_path: Path) -> None:
    # Storage's open failed on it with a storage error (exit 1) instead of one line and exit 2.
    before = _environment(tmp_path / "other", {b"meta": {}}, main={b"visitors": b"plain"})
    _refused(tmp_path / "other", before, "its 'visitors' is not a database the collector made")


def test_a_meta_key_that_is_no_database_is_not_a_collectors(tmp_path: Path) -> None:
    before = _environment(tmp_path / "other", {}, main={b"meta": b"plain value"})
    _refused(tmp_path / "other", before, "not a collector's")


def test_a_main_database_with_more_entries_than_a_collector_has_databases_is_refused(tmp_path: Path) -> None:
    # Another program's many keys are counted, not walked.
    before = _environment(tmp_path / "other", {}, main={f"user:{n}".encode(): b"x" for n in range(1500)})
    _refused(tmp_path / "other", before, "not a collector's (1500 entries in its main database)")
    many = {f"user:{n}".encode(): b"x" for n in range(1500)}
    before = _environment(tmp_path / "plain-meta", {}, main={**many, b"meta": b"plain"})  # (helper-64)
    _refused(tmp_path / "plain-meta", before, "not a collector's (its 'meta' is not a database the collector made)")
    before = _environment(tmp_path / "few", {}, main={f"user:{n}".encode(): b"x" for n in range(20)})
    _refused(tmp_path / "few", before, "not a collector's (it has 'user:0', 'user:1', 'user:10')")


def _collector_directory(path: Path, *, extra_database: bytes | None = None, marker: bytes | None = None) -> bytes:
    """A real collector directory, then changed as a later collector might have; its data.mdb."""
    Storage(path).close()
    env = lmdb.open(str(path), max_dbs=20)
    with env.begin(write=True) as txn:
        if extra_database is not None:
            env.open_db(extra_database, txn=txn)
        if marker is not None:
            txn.put(b"format", marker, db=env.open_db(b"meta", txn=txn))
    env.close()
    return (path / "data.mdb").read_bytes()


def test_a_later_collectors_extra_database_reads_as_a_later_format(tmp_path: Path) -> None:
    before = _collector_directory(tmp_path / "data", extra_database=b"sessions", marker=b"7")
    _refused(tmp_path / "data", before, "has storage format 7; this collector reads formats up to")


def test_a_later_format_is_refused_before_any_command_writes(tmp_path: Path) -> None:
    # keys rotate-field-key has no other gate: it wrote a key file beside data Storage refuses (helper-61).
    before = _collector_directory(tmp_path / "data", marker=b"7")
    _refused(tmp_path / "data", before, "has storage format 7; this collector reads formats up to")


def test_an_extra_database_beside_a_collectors_meta_names_both_readings(tmp_path: Path) -> None:
    # A later collector may add a database without a new format: not called someone else's.
    before = _collector_directory(tmp_path / "data", extra_database=b"sessions")
    _refused(tmp_path / "data", before, "has databases this collector does not use ('sessions'); if a later")


def test_a_first_start_that_stopped_before_its_node_id_is_finished_by_the_next(tmp_path: Path) -> None:
    # The databases are made in one transaction, the format marker and node id
    # in the next: a start killed between them leaves an empty meta.
    _environment(tmp_path / "data", {name.encode(): {} for name in DB_NAMES})
    assert data_dir_problem(tmp_path / "data", create=True) is None
    storage = Storage(tmp_path / "data")
    assert len(storage.node_id) == 8
    storage.close()
    assert data_dir_problem(tmp_path / "data", create=False) is None
