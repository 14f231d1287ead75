"""Recognising a data directory before opening it (storage/datadir.py): nothing is written."""

from __future__ import annotations

from pathlib import Path

import lmdb

from storage.datadir import data_dir_problem
from storage.env import Storage


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
