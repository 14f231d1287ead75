"""A real full disk (a 4 MB tmpfs): 503 storage_unavailable, nothing half-stored, recovery."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from tests.conftest import BROWSER_KEY, pageview, start_server, write_tenants
from tests.helpers import outbox_dump, run_cli

H = {"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_disk_full_then_space_returns(nursery: trio.Nursery, small_disk: Path) -> None:
    server = await start_server(nursery, small_disk)
    filler = small_disk / "filler"
    # leave too little room for a 25-event batch of large events
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * max(0, free - 40 * 1024))
    events = [pageview(f"full-{i}", type="custom", name="n", label="x" * 4000) for i in range(25)]
    refused = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "storage_unavailable"
    # said as a full disk, whether LMDB saw ENOSPC or a short write (EIO: helper-98)
    assert "No space left" in refused.json()["message"] or "is full" in refused.json()["message"], refused.text
    assert str(small_disk) not in refused.text  # the server's paths are the operator's (helper-114)
    assert (await server.client.get("/healthz")).status_code == 200
    assert (await server.client.get("/readyz")).status_code == 503
    filler.unlink()
    again = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert again.status_code == 202, again.text
    assert again.json()["accepted"] == 25
    assert (await server.client.get("/readyz")).status_code == 200
    stored = await outbox_dump(server.data_dir)
    assert sorted(row["eid"] for row in stored) == sorted(f"full-{i}" for i in range(25))


async def test_a_map_at_its_cap_is_not_ready_and_is_not_counted_as_growth(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The disk has room, but the map may not grow past max_map_size_mb: every commit fails.
    server = await start_server(nursery, tmp_path, map_size_mb=1, max_map_size_mb=1)
    events = [pageview(f"cap-{i}", type="custom", name="n", label="x" * 4000) for i in range(25)]
    status = 202
    with caplog.at_level(logging.WARNING):
        for batch in range(40):
            batch_events = [dict(e, _eid=f"{e['_eid']}-{batch}") for e in events]
            refused = await server.client.post("/v1/events", json={"events": batch_events}, headers=H)
            if (status := refused.status_code) == 503:
                break
    assert status == 503
    assert "the data directory is full" in refused.json()["message"], refused.text
    # the operator is told which setting (helper-114: with room on the disk, "full" sent them to df)
    assert "its LMDB map is at max_map_size_mb (1)" in caplog.text, caplog.text
    ready = await server.client.get("/readyz")
    assert ready.status_code == 503, ready.text
    metrics = (await server.client.get("/metrics")).text
    assert "collector_lmdb_map_growths 0.0" in metrics


@pytest.fixture
def file_size_limit() -> Iterator[Callable[[int], None]]:
    """Sets this process's file size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a
    write past it fails with EFBIG, as under a quota or a file-size ulimit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        yield lambda size: resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


async def test_a_data_file_that_may_not_grow_is_not_ready(
    nursery: trio.Nursery, tmp_path: Path, file_size_limit: Callable[[int], None]
) -> None:
    # helper-77: the probe stored and deleted its megabyte in one transaction, which
    # writes no page, and a commit of duplicates alone made the writer healthy again:
    # /readyz said 200 while every new event got 503.
    server = await start_server(nursery, tmp_path)
    first = await server.client.post("/v1/events", json=pageview("before"), headers=H)
    assert first.status_code == 202, first.text
    events = [pageview(f"big-{i}", type="custom", name="n", label="x" * 4000) for i in range(25)]
    file_size_limit((server.data_dir / "data.mdb").stat().st_size)
    refused = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert (refused.status_code, refused.json()["error"]) == (503, "storage_unavailable"), refused.text
    assert (await server.client.get("/readyz")).status_code == 503
    duplicate = await server.client.post("/v1/events", json=pageview("before"), headers=H)
    assert duplicate.json()["duplicates"] == 1, duplicate.text
    assert (await server.client.get("/readyz")).status_code == 503
    file_size_limit(resource.RLIM_INFINITY)
    assert (await server.client.get("/readyz")).status_code == 200
    again = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert again.json()["accepted"] == 25, again.text
    assert len(await outbox_dump(server.data_dir)) == 26


async def test_a_node_restarted_with_its_map_full_is_not_ready(nursery: trio.Nursery, tmp_path: Path) -> None:
    # helper-139: after a restart /readyz said 200 (the reserve itself was free) and the
    # first write, checked by the writer once made, was refused 503.
    server = await start_server(nursery, tmp_path, map_size_mb=2, max_map_size_mb=2)
    status, batch = 202, 0
    while status == 202:
        events = [pageview(f"fill-{batch}-{i}", type="custom", name="n", label="x" * 4000) for i in range(20)]
        status = (await server.client.post("/v1/events", json={"events": events}, headers=H)).status_code
        batch += 1
    server.cancel.cancel()
    await trio.sleep(0.5)  # (its storage closed)
    (tmp_path / "again").mkdir()
    again = await start_server(nursery, tmp_path / "again", map_size_mb=2, max_map_size_mb=2,
                               data_dir=str(server.data_dir))
    ready = await again.client.get("/readyz")
    written = await again.client.post("/v1/events", json={"events": [
        pageview(f"after-{i}", type="custom", name="n", label="x" * 4000) for i in range(20)]}, headers=H)
    assert (ready.status_code, written.status_code) in ((503, 503), (200, 202)), (ready.text, written.text)


async def test_a_full_map_that_retention_empties_is_ready_again_without_traffic(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-82: the probe's one 1 MB value needed 256 free pages in a row, which a map
    # a sweep has just emptied seldom has: /readyz stayed 503 with half the map free,
    # and a node out of its balancer's rotation gets no traffic to make a small commit.
    server = await start_server(nursery, tmp_path, map_size_mb=2, max_map_size_mb=2,
                                outbox_retention_hours=0.001, retention_interval_s=0.2)
    status, batch = 202, 0
    while status == 202:
        events = [pageview(f"fill-{batch}-{i}", type="custom", name="n", label="x" * 4000) for i in range(20)]
        status = (await server.client.post("/v1/events", json={"events": events}, headers=H)).status_code
        batch += 1
    assert status == 503 and batch > 5
    assert (await server.client.get("/readyz")).status_code == 503
    # The last accepted batch did not take the map below its reserve (helper-84: one
    # group could, checked only before it ran, and then not even the sweep could delete).
    assert await _free_pages(server.data_dir, 2 * 1024 * 1024) >= 64
    server.clock.offset += 8 * 86_400  # past outbox retention and the idempotency window
    for _ in range(60):  # (the sweep runs every 0.2 s; readiness is asked as a balancer would)
        if (await server.client.get("/readyz")).status_code == 200:
            break
        await trio.sleep(0.3)
    else:
        raise AssertionError("/readyz stayed 503 after retention emptied the map")
    big = [pageview(f"after-{i}", type="custom", name="n", label="x" * 4000) for i in range(20)]
    again = await server.client.post("/v1/events", json={"events": big}, headers=H)
    assert again.status_code == 202 and again.json()["accepted"] == 20, again.text


_FREE_PAGES = """
import sys
from storage.env import Storage
size = int(sys.argv[2])
storage = Storage(sys.argv[1], map_size=size, max_map_size=size, readonly=True)
with storage.read() as txn:
    print(storage.free_pages_at_cap(txn)[0])
"""


async def _free_pages(data_dir: Path, map_size: int) -> int:
    """Free pages of a map at its cap, read by another process (py-lmdb opens an environment once per process)."""
    done = await trio.run_process(
        [sys.executable, "-c", _FREE_PAGES, str(data_dir), str(map_size)], capture_stdout=True
    )
    return int(done.stdout)


def test_no_new_data_directory_on_a_full_disk(small_disk: Path, tmp_path: Path) -> None:
    # LMDB maps its new lock file: without space that is a SIGBUS, not an error. Refused first.
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * max(0, free - 512 * 1024))
    result = run_cli("tenants", "import", str(write_tenants(tmp_path / "tenants.json")),
                     data_dir=small_disk / "new", check=False)
    assert result.returncode == 2, result.stderr
    assert "not enough free space" in result.stderr and result.stderr.count("\n") == 1
    assert not (small_disk / "new").exists()


async def test_a_data_file_removed_while_serving_is_refused_not_acknowledged(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Commits went on into the unlinked inode with 202 and readiness 200, and were
    # gone at the next start (audit helper-39).
    server = await start_server(nursery, tmp_path)
    assert (await server.client.post("/v1/events", json=pageview("kept"), headers=H)).status_code == 202
    (server.data_dir / "data.mdb").unlink()
    refused = await server.client.post("/v1/events", json=pageview("lost"), headers=H)
    assert (refused.status_code, refused.json()["error"]) == (503, "storage_unavailable"), refused.text
    assert "was removed" in refused.json()["message"]
    assert (await server.client.get("/readyz")).status_code == 503


def test_a_new_data_directory_is_owner_only(tmp_path: Path) -> None:
    # It holds server keys, the stream-token secret and the events (audit helper-39:
    # 0755 and 0644 under the usual umask). An older, open directory is closed up.
    old = os.umask(0o022)
    try:
        tenants = str(write_tenants(tmp_path / "tenants.json"))
        run_cli("tenants", "import", tenants, data_dir=tmp_path / "fresh")
        opened = tmp_path / "opened"
        run_cli("tenants", "import", tenants, data_dir=opened)
        opened.chmod(0o755)  # as an older version left it
        for name in ("data.mdb", "lock.mdb"):
            (opened / name).chmod(0o644)
        run_cli("tenants", "list", data_dir=opened)
    finally:
        os.umask(old)
    for directory in (tmp_path / "fresh", opened):
        assert directory.stat().st_mode & 0o777 == 0o700
        for name in ("data.mdb", "lock.mdb"):
            assert (directory / name).stat().st_mode & 0o777 == 0o600, name


def test_backup_and_restore_onto_a_full_disk_name_the_path_and_keep_nothing(small_disk: Path, tmp_path: Path) -> None:
    # helper-100: "storage error: mdb_env_copy3: No space left on device" (exit 1, as if
    # the data directory were broken), and a restore's bare "No space left on device".
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(write_tenants(tmp_path / "t.json")), data_dir=data_dir)
    run_cli("backup", str(tmp_path / "bk"), data_dir=data_dir)
    filler = small_disk / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):  # (to the last block)
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    backed = run_cli("backup", str(small_disk / "bk"), data_dir=data_dir, check=False)
    assert backed.returncode == 2 and f"backup to {small_disk / 'bk'} failed" in backed.stderr, backed.stderr
    assert not (small_disk / "bk").exists()
    restored = run_cli("restore", str(tmp_path / "bk"), data_dir=small_disk / "restored", check=False)
    assert restored.returncode == 2, restored.stderr
    assert f"restore into {small_disk / 'restored'} failed while copying" in restored.stderr, restored.stderr
    assert not (small_disk / "restored").exists()


def test_a_field_key_rotation_whose_record_fails_says_the_file_is_rotated(tmp_path: Path) -> None:
    # helper-100: the file had the new active key while the message read as if nothing
    # had happened, so a rerun rotated again.
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(write_tenants(tmp_path / "tenants.json")), data_dir=data_dir)
    assert run_cli("keys", "rotate-field-key", data_dir=data_dir).stdout.strip() == "k1"
    size = (data_dir / "data.mdb").stat().st_size
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    refused = subprocess.run(
        [sys.executable, "-m", "collector", "keys", "rotate-field-key", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard)),  # data.mdb may not grow
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(
        "collector: storage error: the key file now holds k2, active, but recording it in the data directory failed (")
    assert refused.stderr.rstrip().endswith("); the next start of serve records it")
    assert '"active": "k2"' in (data_dir / "field-keys.json").read_text()
