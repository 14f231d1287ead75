"""Backups of a live LMDB environment and checked, atomic restores."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest

import storage.backup as backup_module
from storage import outbox
from storage.backup import MANIFEST, BackupError, BackupManifest, backup, restore
from storage.check import check
from storage.env import FORMAT_VERSION, Storage
from storage.writer import WriteContext, run_job_now
from tests.unit.test_check import add_key, admit


@pytest.fixture
def live(tmp_path: Path) -> Storage:
    storage = Storage(tmp_path / "data")
    add_key(storage, "acme")
    admit(storage, ["a", "b", ("c", "click")])
    return storage


def eids(data_dir: Path) -> list[str]:
    storage = Storage(data_dir)
    try:
        return [record.eid for _, record in outbox.iter_outbox(storage)]
    finally:
        storage.close()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_backup_writes_a_compacted_copy_and_its_manifest(live: Storage, tmp_path: Path) -> None:
    dest = tmp_path / "backups" / "one"
    manifest = backup(live, dest)
    assert listing(dest) == ["MANIFEST.json", "data.mdb"]
    data = (dest / "data.mdb").read_bytes()
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.data_bytes == len(data)
    assert (manifest.format, manifest.node_id, manifest.outbox_last_seq) == (
        FORMAT_VERSION,
        live.node_id,
        3,
    )
    assert manifest.records["outbox"] == 3 and manifest.records["idempotency"] == 3
    assert manifest.records["keys"] == 1 and manifest.records["counters"] == 2
    on_disk = json.loads((dest / MANIFEST).read_text())
    assert on_disk["outboxLastSeq"] == 3 and on_disk["dataBytes"] == len(data)
    assert msgspec.json.decode((dest / MANIFEST).read_bytes(), type=BackupManifest) == manifest
    # the source stays open and writable: an online backup
    admit(live, ["d"])
    assert backup(live, tmp_path / "two").outbox_last_seq == 4


def test_backup_is_one_snapshot(live: Storage, tmp_path: Path) -> None:
    dest = tmp_path / "snap"
    original = live.read

    def read_then_write() -> Any:
        txn = original()
        admit(live, ["after-snapshot"])  # commits while the backup's snapshot is open
        return txn

    live.read = read_then_write  # type: ignore[method-assign]
    manifest = backup(live, dest)
    live.read = original  # type: ignore[method-assign]
    assert manifest.outbox_last_seq == 3 and manifest.records["outbox"] == 3
    restored = tmp_path / "restored"
    restore(dest, restored)
    assert eids(restored) == ["a", "b", "c"]


def test_backup_refuses_a_non_empty_destination(live: Storage, tmp_path: Path) -> None:
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(BackupError, match="not an empty directory"):
        backup(live, dest)
    assert listing(dest) == ["keep.txt"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BackupError, match="not an empty directory"):
        backup(live, tmp_path / "afile")
    # helper-89: one killed before its manifest was only "not an empty directory"
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "data.mdb").write_bytes(b"partial")
    with pytest.raises(BackupError, match="holds an unfinished backup"):
        backup(live, killed)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert backup(live, empty).outbox_last_seq == 3  # an empty directory is fine


def test_failed_backup_leaves_nothing(live: Storage, tmp_path: Path) -> None:
    class BrokenEnv:
        def __init__(self, env: lmdb.Environment) -> None:
            self.env = env

        def copy(self, path: str, **kwargs: object) -> None:
            Path(path, "data.mdb").write_bytes(b"partial")
            raise lmdb.DiskError("disk went away")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.env, name)

    real = live.env
    live.env = BrokenEnv(real)  # type: ignore[assignment]
    try:
        # (ENOSPC writing the copy: the destination's fault, said with its path; helper-100)
        with pytest.raises(BackupError, match="backup to .*never failed: disk went away; nothing was kept"):
            backup(live, tmp_path / "never")
    finally:
        live.env = real
    assert not (tmp_path / "never").exists()


def test_restore_round_trip(live: Storage, tmp_path: Path) -> None:
    manifest = backup(live, tmp_path / "bk")
    node_id = live.node_id
    live.close()
    restored = tmp_path / "restored"
    result = restore(tmp_path / "bk", restored)
    assert result.manifest == manifest
    assert listing(tmp_path) == ["bk", "data", "restored"]  # no staging left beside it
    storage = Storage(restored)
    try:
        # A node id of its own: receipts given out after the backup, or by another
        # restore of it, are never handed out again. The restore reports it.
        assert storage.node_id != node_id and len(storage.node_id) == len(node_id)
        assert result.node_id == storage.node_id
        records = [r for _, r in outbox.iter_outbox(storage)]
        assert [r.eid for r in records] == ["a", "b", "c"]
        assert records[0].receipt_id == outbox.receipt_id(node_id, 1)  # stored receipts are kept
        assert check(storage).problems == []
        # receipts continue after the restored sequence
        assert admit(storage, ["e"]).receipt_ids == [outbox.receipt_id(storage.node_id, 4)]
    finally:
        storage.close()


def test_restore_refuses_a_backup_inside_the_directory_it_replaces(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "data" / "backups" / "b1")
    live.close()
    with pytest.raises(BackupError, match="move it out first"):
        restore(tmp_path / "data" / "backups" / "b1", tmp_path / "data", force=True)
    assert (tmp_path / "data" / "backups" / "b1" / "MANIFEST.json").exists()


def test_restore_into_an_empty_directory_needs_no_force(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    target = tmp_path / "empty"
    target.mkdir()
    restore(tmp_path / "bk", target)
    assert eids(target) == ["a", "b", "c"]


def test_checksum_mismatch_changes_nothing(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    data = tmp_path / "bk" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    before = listing(tmp_path)
    with pytest.raises(
        BackupError, match=r"^checksum mismatch: .*data\.mdb has SHA-256 [0-9a-f]{64}"
    ):
        restore(tmp_path / "bk", tmp_path / "target")
    assert listing(tmp_path) == before
    # the live directory is not touched either, even with force
    with pytest.raises(BackupError, match="checksum mismatch"):
        restore(tmp_path / "bk", live.path, force=True)
    assert [r.eid for _, r in outbox.iter_outbox(live)] == ["a", "b", "c"]


def test_truncated_or_unfinished_backups_are_refused(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    data = tmp_path / "bk" / "data.mdb"
    data.write_bytes(data.read_bytes()[:-4096])
    with pytest.raises(BackupError, match="size mismatch"):
        restore(tmp_path / "bk", tmp_path / "t1")
    (tmp_path / "bk" / MANIFEST).unlink()
    with pytest.raises(BackupError, match="no readable MANIFEST.json"):
        restore(tmp_path / "bk", tmp_path / "t2")
    (tmp_path / "bk" / MANIFEST).write_text('{"format": 1}')
    with pytest.raises(BackupError, match="is not a backup manifest"):
        restore(tmp_path / "bk", tmp_path / "t3")
    assert not (tmp_path / "t1").exists() and not (tmp_path / "t2").exists()


def test_newer_format_is_refused(live: Storage, tmp_path: Path) -> None:
    with live.env.begin(write=True) as txn:
        txn.put(b"format", str(FORMAT_VERSION + 1).encode(), db=live.dbs.meta)
    assert backup(live, tmp_path / "bk").format == FORMAT_VERSION + 1
    with pytest.raises(BackupError, match="upgrade the collector"):
        restore(tmp_path / "bk", tmp_path / "target")
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_force_replaces_a_non_empty_directory(
    live: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    backup(live, tmp_path / "bk")
    live.close()
    other = Storage(tmp_path / "other")
    admit(other, ["x", "y"])
    other.close()
    with pytest.raises(BackupError, match="is not empty; pass --force to replace it"):
        restore(tmp_path / "bk", tmp_path / "other")
    assert eids(tmp_path / "other") == ["x", "y"]
    if not exchange:
        monkeypatch.setattr(backup_module, "_exchange", lambda a, b: False)
    restore(tmp_path / "bk", tmp_path / "other", force=True)
    assert eids(tmp_path / "other") == ["a", "b", "c"]
    assert listing(tmp_path) == ["bk", "data", "other"]


def test_force_replaces_only_a_data_directory(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    live.close()

    def refused(target: Path, why: str) -> None:
        before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
        for force in (False, True):  # refused before --force is even suggested
            with pytest.raises(BackupError, match=f"is not empty and not a collector data directory: {why}"):
                restore(tmp_path / "bk", target, force=force)
        assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before

    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "todo.txt").write_text("keep me")
    refused(home, "it holds notes;")
    (home / "data.mdb").write_text("junk")  # a file of that name proves nothing (helper-56)
    refused(home, "it holds notes;")
    other = tmp_path / "otherapp"
    env = lmdb.open(str(other), max_dbs=2)
    env.open_db(b"otherapp")
    env.close()
    refused(other, ".*not a collector's")
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / "data.mdb").symlink_to(tmp_path / "elsewhere.db")  # restore would create it (helper-58)
    refused(dangling, "its data.mdb is not a regular file")
    assert not (tmp_path / "elsewhere.db").exists()
    # What cannot be told is refused: a zeroed data.mdb may be ours, damaged, or someone's
    # (an Access .mdb); the operator removes it by hand (helper-59).
    zeroed = tmp_path / "zeroed"
    zeroed.mkdir()
    (zeroed / "data.mdb").write_bytes(b"\0" * 8192)
    refused(zeroed, "its data.mdb is not an LMDB file")
    # So is another program's LMDB that has a database named like one of ours (helper-58, -59).
    meta_too = tmp_path / "meta_too"
    env = lmdb.open(str(meta_too), max_dbs=3)
    with env.begin(write=True) as txn:
        txn.put(b"alice", b"precious", db=env.open_db(b"users", txn=txn))
        env.open_db(b"meta", txn=txn)
    env.close()
    refused(meta_too, r"its LMDB environment is not a collector's \(it has 'users'\)")
    # Names the collector also uses do not make it ours: a collector's meta has a node id (helper-60).
    outbox_only = tmp_path / "outbox_only"
    env = lmdb.open(str(outbox_only), max_dbs=2)
    with env.begin(write=True) as txn:
        txn.put(b"job1", b"precious", db=env.open_db(b"outbox", txn=txn))
    env.close()
    refused(outbox_only, r".*not a collector's \(no node id among \['outbox'\]\)")
    # Another program's LMDB cut short: what was read before LMDB faulted still counts (helper-60).
    cut_foreign = tmp_path / "cut_foreign"
    env = lmdb.open(str(cut_foreign))
    with env.begin(write=True) as txn:
        for n in range(400):
            txn.put(f"rec{n}".encode(), os.urandom(200))
    env.close()
    os.truncate(cut_foreign / "data.mdb", (cut_foreign / "data.mdb").stat().st_size - 4096)
    refused(cut_foreign, r".*not a collector's \(400 entries in its main database\)")
    # One cut short past its root page faults LMDB's mapping: the probe crashed
    # the restore with SIGBUS (helper-58); it runs in a child process now.
    cut = tmp_path / "cut"
    env = lmdb.open(str(cut), max_dbs=4, map_size=1 << 28)
    rows = env.open_db(b"outbox")
    with env.begin(write=True) as txn:
        for n in range(3000):
            txn.put(n.to_bytes(8, "big"), os.urandom(2000), db=rows)
    env.close()
    os.truncate(cut / "data.mdb", 8192)
    assert restore(tmp_path / "bk", cut, force=True).node_id
    assert eids(cut) == ["a", "b", "c"]
    # A probe that fails (rather than crashing on the file) decides nothing: refused, not guessed.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backup_module.sys, "executable", "/bin/false")
        with pytest.raises(BackupError, match="its data.mdb could not be inspected"):
            restore(tmp_path / "bk", cut, force=True)
    # A key file kept in a subdirectory is the collector's; what lies beside it is not (helper-58).
    keyed = tmp_path / "keyed"
    (keyed / "keys").mkdir(parents=True)
    (keyed / "keys" / "fk.json").write_text("{}")
    (keyed / "keys" / "old-key.json").write_text("{}")
    carry = (("field-keys.json", "keys/fk.json"),)
    with pytest.raises(BackupError, match="not a collector data directory: it holds keys/old-key.json"):
        restore(tmp_path / "bk", keyed, force=True, carry_files=carry)
    (keyed / "keys" / "old-key.json").unlink()
    assert restore(tmp_path / "bk", keyed, force=True, carry_files=carry).node_id
    assert (keyed / "keys" / "fk.json").is_file()
    # A field-keys.json the settings no longer name is not carried: it would be lost (helper-59).
    (keyed / "field-keys.json").write_text("{}")
    with pytest.raises(BackupError, match="not a collector data directory: it holds field-keys.json"):
        restore(tmp_path / "bk", keyed, force=True, carry_files=carry)


def test_restore_through_a_symlinked_data_dir(live: Storage, tmp_path: Path) -> None:
    # DynamicUser makes /var/lib/collector a symlink into /var/lib/private.
    backup(live, tmp_path / "bk")
    live.close()
    private = tmp_path / "private" / "collector"
    other = Storage(private)
    admit(other, ["x"])
    other.close()
    link = tmp_path / "collector"
    link.symlink_to(private)
    restore(tmp_path / "bk", link, force=True)
    assert link.is_symlink() and link.resolve() == private.resolve()
    assert eids(private) == ["a", "b", "c"]


def test_restore_refuses_a_directory_a_collector_has_open(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    live.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from storage.env import Storage; s = Storage(sys.argv[1]);"
            " print('open', flush=True); time.sleep(60)",
            str(live.path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(BackupError, match="open in a running collector; stop it"):
            restore(tmp_path / "bk", live.path, force=True)
    finally:
        holder.kill()
        holder.wait()
    restore(tmp_path / "bk", live.path, force=True)
    assert eids(live.path) == ["a", "b", "c"]


def test_restore_of_a_backup_larger_than_lmdb_default_map(live: Storage, tmp_path: Path) -> None:
    # py-lmdb maps 10 MiB unless told otherwise; a compacted copy has no free pages.
    class Pad:
        def run(self, ctx: WriteContext) -> None:
            for n in range(14):
                ctx.txn.put(f"pad{n}".encode(), bytes(1024 * 1024), db=ctx.dbs.meta)

    run_job_now(live, Pad())
    manifest = backup(live, tmp_path / "big")
    assert manifest.data_bytes > 14 * 1024 * 1024
    live.close()
    restore(tmp_path / "big", tmp_path / "restored")
    storage = Storage(tmp_path / "restored")
    try:
        assert check(storage).problems == []
    finally:
        storage.close()


def test_a_manifest_that_is_not_utf8_is_refused(live: Storage, tmp_path: Path) -> None:
    backup(live, tmp_path / "bk")
    manifest = tmp_path / "bk" / MANIFEST
    manifest.write_bytes(manifest.read_bytes().replace(b'"nodeId":"', b'"nodeId":"\xff', 1))
    with pytest.raises(BackupError, match="is not a backup manifest"):
        restore(tmp_path / "bk", tmp_path / "t")


def test_a_restore_holds_off_a_serve_and_a_second_restore(live: Storage, tmp_path: Path) -> None:
    # restore checked once, before its copy, that nothing had the directory open:
    # a serve started during the copy acknowledged events into the directory the
    # swap then deleted, and two restores removed each other's staging copy
    # (review helper-48). It now holds serve's lock on data.mdb, and one on the
    # parent directory, from its check to its swap.
    backup(live, tmp_path / "bk")
    live.close()
    with backup_module._held_for_restore(live.path):
        started = subprocess.run(
            [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0", "--data-dir", str(live.path)],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        )  # fmt: skip
        assert started.returncode == 2 and "another collector serve already serves" in started.stderr
        with pytest.raises(BackupError, match="another restore into .* is running"):
            restore(tmp_path / "bk", live.path, force=True)
    # and a serve that holds its lock refuses the restore
    serving = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--bind", "127.0.0.1:0", "--data-dir", str(live.path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        assert serving.stdout is not None and "listening on" in serving.stdout.readline()
        key = (("field-keys.json", "field-keys.json"),)  # serve made it; the CLI carries it
        with pytest.raises(BackupError, match="served by a running collector"):
            restore(tmp_path / "bk", live.path, force=True, carry_files=key)
    finally:
        serving.terminate()
        serving.wait(timeout=20)
    restore(tmp_path / "bk", live.path, force=True, carry_files=key)
    assert eids(live.path) == ["a", "b", "c"]


def test_a_backup_is_owner_only_while_it_is_written(live: Storage, tmp_path: Path) -> None:
    # LMDB created the copy with the umask (0644) and it was made 0600 only once
    # complete; in a destination that already existed (0755) any local user could
    # open it meanwhile and keep reading (review helper-48). The manifest too.
    dest = tmp_path / "bk"
    dest.mkdir(mode=0o755)
    seen: list[int] = []
    real_sha256 = backup_module._sha256

    def noting_modes(path: Path, *, fsync: bool = False) -> tuple[str, int]:
        seen.append(path.stat().st_mode & 0o777)  # as LMDB left it, before the chmod
        return real_sha256(path, fsync=fsync)

    previous = os.umask(0o022)
    try:
        backup_module._sha256 = noting_modes  # type: ignore[assignment]
        backup(live, dest)
    finally:
        backup_module._sha256 = real_sha256  # type: ignore[assignment]
        os.umask(previous)
    assert seen == [0o600]
    assert {p.name: p.stat().st_mode & 0o777 for p in dest.iterdir()} == {"data.mdb": 0o600, MANIFEST: 0o600}
    assert os.umask(0o022) == 0o022  # the process's umask is left as it was


def test_a_damaged_format_marker_is_one_line_not_a_traceback(live: Storage, tmp_path: Path) -> None:
    # int() of the marker raised ValueError: a traceback from check, serve,
    # backup and restore alike (review helper-48).
    backup(live, tmp_path / "bk")
    with live.env.begin(write=True) as txn:
        txn.put(b"format", b"zz", db=live.dbs.meta)
    with pytest.raises(BackupError, match="damaged storage format marker"):
        backup(live, tmp_path / "bk2")
    assert not (tmp_path / "bk2").exists()
    live.close()
    # the same damage inside a backup whose manifest matches it
    copy = lmdb.open(str(tmp_path / "bk"), max_dbs=64)
    with copy.begin(write=True) as txn:
        txn.put(b"format", b"zz", db=copy.open_db(b"meta", txn=txn))
    copy.close()
    (tmp_path / "bk" / "lock.mdb").unlink(missing_ok=True)
    data = (tmp_path / "bk" / "data.mdb").read_bytes()
    manifest = json.loads((tmp_path / "bk" / MANIFEST).read_text())
    manifest.update(dataBytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (tmp_path / "bk" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="damaged storage format marker"):
        restore(tmp_path / "bk", tmp_path / "restored")
    result = subprocess.run(
        [sys.executable, "-m", "collector", "check", "--data-dir", str(live.path)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "damaged storage format marker" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_operator_command_does_not_exit_0(live: Storage, tmp_path: Path, signum: int) -> None:
    # Ctrl-C during backup or restore exited 0 with nothing done: `backup && echo ok`
    # said ok (review helper-48). Here `outbox dump` blocks writing to a pipe nobody reads.
    admit(live, [f"e{n:04d}" for n in range(400)])
    live.close()
    dump = subprocess.Popen(
        [sys.executable, "-m", "collector", "outbox", "dump", "--data-dir", str(live.path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    time.sleep(2)  # blocked on the full pipe
    dump.send_signal(signum)
    assert dump.stderr is not None
    # SIGTERM (a `timeout`, a systemd stop) skipped every cleanup (review helper-50)
    assert dump.wait(timeout=20) == 128 + signum
    assert dump.stderr.read() == f"collector: interrupted ({signal.Signals(signum).name})\n".encode()


def _cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector", *args], capture_output=True, text=True, timeout=60,
        cwd=cwd or Path(__file__).parents[2], env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), **env},
    )


@pytest.mark.parametrize("inside", ["field-keys.json", "secrets/fk.json"])
def test_restore_keeps_a_key_file_configured_inside_the_data_directory(
    live: Storage, tmp_path: Path, inside: str
) -> None:
    # Only the default key file was carried across the swap: one configured at a
    # path inside the data directory (the default spelled out in an env file, or a
    # subdirectory) went with the old directory, silently (review helper-50).
    backup(live, tmp_path / "bk")
    live.close()
    key = live.path / inside
    key.parent.mkdir(exist_ok=True)
    key.write_bytes(b"the key the data was sealed with")
    done = _cli("restore", str(tmp_path / "bk"), "--force", "--data-dir", str(live.path),
                COLLECTOR_FIELD_KEY_FILE=str(key))
    assert done.returncode == 0, done.stderr
    assert key.read_bytes() == b"the key the data was sealed with" and "warning" not in done.stderr
    assert eids(live.path) == ["a", "b", "c"]


def test_restore_into_the_working_directory(live: Storage, tmp_path: Path) -> None:
    # `--data-dir .` was a ValueError traceback: `.` has no name (review helper-50).
    backup(live, tmp_path / "bk")
    live.close()
    done = _cli("restore", str(tmp_path / "bk"), "--force", "--data-dir", ".", cwd=live.path)
    assert done.returncode == 0, done.stderr
    assert eids(live.path) == ["a", "b", "c"]


def test_a_target_without_a_data_file_is_locked_against_a_serve(tmp_path: Path) -> None:
    # A serve creates data.mdb when it is missing: a target holding only a key file
    # was not locked, and a serve that started and stopped during the copy lost what
    # it acknowledged to the swap (review helper-50).
    target = tmp_path / "prepared"
    target.mkdir()
    (target / "field-keys.json").write_bytes(b"key")
    with pytest.raises(RuntimeError, match="the restore failed"), backup_module._held_for_restore(target):
        probe = os.open(target / "data.mdb", os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what serve does
        finally:
            os.close(probe)
        raise RuntimeError("the restore failed")
    assert listing(target) == ["field-keys.json"]  # the lock file it made is gone again


def test_an_interrupt_during_the_swap_waits_for_it(tmp_path: Path) -> None:
    # Ctrl-C right after the swap reported "interrupted" for a restore that had
    # already replaced the directory (review helper-50).
    # (at this thread: the operator commands have no other, but this test process
    # may, and the kernel hands a process-wide signal to any thread not blocking it)
    with backup_module._signals_held():
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(0.05)
    time.sleep(0.05)  # nothing is delivered afterwards either


def test_restore_through_a_symlink_keeps_the_default_key_file(live: Storage, tmp_path: Path) -> None:
    # The shipped unit's layout (DynamicUser: /var/lib/collector is a symlink): the
    # key file spelled through the link did not look inside the resolved directory,
    # so the swap deleted it, silently (review helper-52).
    backup(live, tmp_path / "bk")
    live.close()
    (live.path / "field-keys.json").write_bytes(b"the key the data was sealed with")
    link = tmp_path / "link"
    link.symlink_to(live.path)
    done = _cli("restore", str(tmp_path / "bk"), "--force", "--data-dir", str(link))
    assert done.returncode == 0, done.stderr
    assert (live.path / "field-keys.json").read_bytes() == b"the key the data was sealed with"
    assert "warning" not in done.stderr and eids(live.path) == ["a", "b", "c"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_a_command_starts_is_told_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signum: int
) -> None:
    # helper-139: a signal in the first 0.15 s (parsing, imports) ended in a traceback
    # (`collector.cli._Terminated: 15`, a bare KeyboardInterrupt) and the wrong status.
    from collector import cli

    def stopped() -> None:
        raise cli._Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", stopped)
    assert cli.main(["check"]) == 128 + signum
    assert capsys.readouterr().err == f"collector: interrupted ({signal.Signals(signum).name})\n"
