"""`collector backup` while serving, `restore` with its checksum, `check` of the result."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.conftest import BROWSER_KEY, click, pageview, start_server, write_tenants
from tests.helpers import run_cli

H = {"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com"}


async def test_online_backup_restore_and_check(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path)
    response = await server.client.post("/v1/events", json={"events": [pageview("b1"), click("b2")]}, headers=H)
    assert response.status_code == 202
    dest = tmp_path / "backup"
    result = await trio.to_thread.run_sync(lambda: run_cli("backup", str(dest), data_dir=server.data_dir))
    manifest = json.loads(result.stdout)
    assert manifest["outboxLastSeq"] == 2 and len(manifest["sha256"]) == 64
    # the server kept serving during the copy
    assert (await server.client.post("/v1/events", json=pageview("b3"), headers=H)).status_code == 202

    restored = tmp_path / "restored"
    printed = await trio.to_thread.run_sync(lambda: run_cli("restore", str(dest), data_dir=restored))
    # The backup's node id and the restored directory's new one, both named (was: only the first).
    said = json.loads(printed.stdout)
    assert said["nodeId"] == manifest["nodeId"] and said["sha256"] == manifest["sha256"]
    assert len(said["restoredNodeId"]) == 8 and said["restoredNodeId"] != manifest["nodeId"]
    dump = run_cli("outbox", "dump", data_dir=restored).stdout
    assert [json.loads(line)["eid"] for line in dump.splitlines()] == ["b1", "b2"]
    report = json.loads(run_cli("check", data_dir=restored).stdout)
    assert report["problems"] == [] and report["outbox_records"] == 2
    assert json.loads(run_cli("check", data_dir=server.data_dir).stdout)["problems"] == []

    again = run_cli("restore", str(dest), data_dir=restored, check=False)
    assert again.returncode == 2 and "not empty" in again.stderr
    data = dest / "data.mdb"
    data.write_bytes(data.read_bytes()[:-1] + b"\x01")
    tampered = run_cli("restore", str(dest), data_dir=tmp_path / "other", check=False)
    assert tampered.returncode == 2 and "checksum mismatch" in tampered.stderr
    assert not (tmp_path / "other").exists()


def test_a_restore_that_leaves_no_field_key_file_says_so(tmp_path: Path) -> None:
    # Restored into a new directory from a backup made without --with-field-keys,
    # it said nothing, and the first serve made a new key under the old key's id:
    # values sealed before could not be opened, nor those sealed after once the
    # old file was copied back (review helper-48).
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(write_tenants(tmp_path / "t.json")), data_dir=data_dir)
    run_cli("backup", str(tmp_path / "bk"), data_dir=data_dir)
    restored = run_cli("restore", str(tmp_path / "bk"), data_dir=tmp_path / "restored")
    assert "warning: the restored directory has no field-key file (field-keys.json)" in restored.stderr
    (data_dir / "field-keys.json").write_text('{"active": "k1", "keys": {"k1": "' + "A" * 43 + '="}}')
    (data_dir / "field-keys.json").chmod(0o600)
    run_cli("backup", str(tmp_path / "bk2"), "--with-field-keys", data_dir=data_dir)
    restored = run_cli("restore", str(tmp_path / "bk2"), data_dir=tmp_path / "restored2")
    assert "warning" not in restored.stderr and (tmp_path / "restored2" / "field-keys.json").is_file()


def test_backup_finds_a_field_key_file_the_config_names(tmp_path: Path) -> None:
    # helper-85: with field_key_file set in the serving config (as a systemd install
    # may), `backup --with-field-keys` looked beside the data and took no --config.
    data_dir, keys = tmp_path / "data", tmp_path / "secrets" / "fk.json"
    keys.parent.mkdir()
    keys.write_text('{"active": "k1", "keys": {"k1": "' + "A" * 43 + '="}}')
    keys.chmod(0o600)
    config = tmp_path / "collector.toml"
    config.write_text(f'field_key_file = "{keys}"\n')
    run_cli("tenants", "import", str(write_tenants(tmp_path / "t.json")), data_dir=data_dir)
    without = run_cli("backup", str(tmp_path / "bk0"), "--with-field-keys", data_dir=data_dir, check=False)
    assert without.returncode == 2 and "no field key file" in without.stderr
    run_cli("backup", str(tmp_path / "bk"), "--with-field-keys", "--config", str(config), data_dir=data_dir)
    assert (tmp_path / "bk" / "field-keys.json").read_bytes() == keys.read_bytes()
    restored = run_cli("restore", str(tmp_path / "bk"), "--config", str(config), data_dir=tmp_path / "restored")
    assert restored.returncode == 0, restored.stderr
    # the key file configured outside is left as it is, and it is said (helper-100: silent)
    assert "the backup holds a field-key file" in restored.stderr and str(keys) in restored.stderr
    # a --data-dir given that does not exist is refused, the key file untouched (helper-139:
    # it was rotated and nothing recorded)
    before = keys.read_bytes()
    typo = run_cli("keys", "rotate-field-key", "--config", str(config), data_dir=tmp_path / "dta", check=False)
    assert typo.returncode == 2 and "no data directory" in typo.stderr, typo.stderr
    # also named in the environment (helper-141; the shipped unit's env file names it so)
    typo = run_cli("keys", "rotate-field-key", "--config", str(config), check=False,
                   env={"COLLECTOR_DATA_DIR": str(tmp_path / "dta")})
    assert typo.returncode == 2 and "no data directory" in typo.stderr, typo.stderr
    assert keys.read_bytes() == before and not (tmp_path / "dta").exists()


def test_backup_with_field_keys_refuses_a_key_file_serve_would_refuse(tmp_path: Path) -> None:
    # helper-104: a file whose active id it does not hold was copied into the backup as
    # the data's key; and a key that is not base64 was called "another key".
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(write_tenants(tmp_path / "t.json")), data_dir=data_dir)
    assert run_cli("keys", "rotate-field-key", data_dir=data_dir).stdout.strip() == "k1"  # recorded
    key_file = data_dir / "field-keys.json"
    content = json.loads(key_file.read_text())
    key_file.write_text(json.dumps({**content, "active": "k9"}))
    refused = run_cli("backup", str(tmp_path / "bk"), "--with-field-keys", data_dir=data_dir, check=False)
    assert refused.returncode == 2 and "the active field key 'k9' is not among the keys" in refused.stderr, refused
    assert not (tmp_path / "bk").exists()
    key_file.write_text(json.dumps({"active": "k1", "keys": {"k1": "!!notb64"}}))
    for argv in (["backup", str(tmp_path / "bk"), "--with-field-keys"], ["serve", "--bind", "127.0.0.1:0"]):
        refused = run_cli(*argv, data_dir=data_dir, check=False)
        assert refused.returncode == 2 and "another key" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith(f"collector: field key file {key_file}: "), refused.stderr


def test_paths_lmdb_cannot_take_and_a_backup_inside_its_data_are_refused(tmp_path: Path) -> None:
    # helper-139: a path whose bytes are not UTF-8 ended in a traceback (exit 1), and serve
    # left the directory behind; a backup written inside the data directory was taken,
    # and a restore into that directory then refused both.
    bad = str(tmp_path) + "/bad\udcffdir"  # (os.fsdecode of b"bad\xffdir")
    for command in (("check",), ("outbox", "dump"), ("serve", "--env", "development", "--demo", "--bind",
                                                      "127.0.0.1:1")):
        refused = run_cli(*command, "--data-dir", bad, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and "is not valid UTF-8" in refused.stderr, refused.stderr
    assert not os.path.lexists(os.fsencode(bad))
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(write_tenants(tmp_path / "t.json")), data_dir=data_dir)
    for dest in (bad, str(data_dir / "inside")):
        refused = run_cli("backup", dest, data_dir=data_dir, check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert sorted(path.name for path in data_dir.iterdir()) == ["data.mdb", "lock.mdb"]
