"""Session replay: the pure body rules, the chunk store, its retention, check and backup."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from collector.errors import ServiceError
from collector.ingest.replay import MAX_CHUNK_BYTES, prepare_replay
from storage import replay
from storage.backup import backup
from storage.check import check
from storage.env import DB_NAMES, Storage
from storage.retention import RetentionSweep, SweepResult
from storage.writer import GroupCommitWriter, JobRefused, run_job_now
from tests.unit.test_check import NOV

DAY = 86_400_000


def body(**overrides: object) -> bytes:
    chunk: dict[str, object] = {
        "visitorId": "v1",
        "sessionId": "s1",
        "seq": 0,
        "timestamp": NOV,
        "events": [{"type": 2, "timestamp": NOV, "data": {"node": {"id": 1}}}],
    }
    chunk.update(overrides)
    return json.dumps(chunk).encode()


def refused(raw: bytes, code: str) -> ServiceError:
    with pytest.raises(ServiceError) as info:
        prepare_replay(raw)
    assert info.value.code == code, info.value.message
    return info.value


# -- the pure body rules ------------------------------------------------------


def test_replay_module_imports_no_io_frameworks() -> None:
    code = (
        "import sys, collector.ingest.replay;"
        "bad = {'trio', 'quart', 'lmdb', 'hypercorn'} & {m.split('.')[0] for m in sys.modules};"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_chunk_is_parsed_and_its_records_stored_canonically() -> None:
    chunk = prepare_replay(body(_eid="ignored", extra="ignored too"))
    assert (chunk.visitor_id, chunk.session_id, chunk.seq, chunk.client_timestamp) == (
        "v1",
        "s1",
        0,
        NOV,
    )
    assert json.loads(chunk.events) == [{"type": 2, "timestamp": NOV, "data": {"node": {"id": 1}}}]
    assert chunk.events.startswith(b'[{"data":')  # object keys sorted


def test_content_hash_ignores_key_order_whitespace_and_send_time() -> None:
    first = prepare_replay(body())
    reordered = json.dumps(
        {
            "events": [{"data": {"node": {"id": 1}}, "timestamp": NOV, "type": 2}],
            "seq": 0,
            "sessionId": "s1",
            "visitorId": "v1",
        },
        indent=2,
    ).encode()
    assert prepare_replay(reordered).content_hash == first.content_hash
    assert prepare_replay(body(timestamp=NOV + 5000)).content_hash == first.content_hash
    assert prepare_replay(body(events=[{"type": 3}])).content_hash != first.content_hash
    assert prepare_replay(body(visitorId="v2")).content_hash != first.content_hash


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"seq": -1}, "$.seq"),
        ({"seq": True}, "$.seq"),
        ({"seq": 1.5}, "$.seq"),
        ({"seq": 2**53}, "$.seq"),
        ({"events": []}, "$.events"),
        ({"events": [1]}, "$.events[0]"),
        ({"events": {"type": 2}}, "$.events"),
        ({"sessionId": ""}, "$.sessionId"),
        ({"sessionId": "s" * 129}, "$.sessionId"),
        ({"sessionId": "a\x00b"}, "$.sessionId"),
        ({"visitorId": 7}, "$.visitorId"),
        ({"_eid": "e" * 129}, "$._eid"),
        ({"timestamp": "now"}, "$.timestamp"),
    ],
)
def test_validation_errors_name_the_field(overrides: dict[str, object], path: str) -> None:
    error = refused(body(**overrides), "validation_error")
    assert error.extra["details"][0]["path"] == path  # type: ignore[index]


def test_missing_fields_and_non_objects_are_validation_errors() -> None:
    assert refused(b'{"visitorId": "v", "seq": 0, "events": [{}]}', "validation_error").extra[
        "details"
    ] == [{"path": "$", "message": "Object missing required field `sessionId`"}]
    refused(b"[1, 2]", "validation_error")


@pytest.mark.parametrize("raw", [b"{", b"", b'{"a": 1,}', b"\xff\xfe"])
def test_malformed_json_is_invalid_json(raw: bytes) -> None:
    refused(raw, "invalid_json")


def test_payment_data_anywhere_refuses_the_chunk() -> None:
    card = {"type": 3, "data": {"source": 5, "text": "4111 1111 1111 1111"}}
    refused(body(events=[card]), "prohibited_payment_data")
    refused(body(events=[{"type": 3, "data": {"cvv": "123"}}]), "prohibited_payment_data")
    # a card number in an invalid chunk still wins: nothing of it is trusted
    refused(body(seq=-1, events=[card]), "prohibited_payment_data")


def test_records_over_the_stored_cap_are_payload_too_large() -> None:
    filler = "x" * 1000
    records = [{"t": filler} for _ in range(MAX_CHUNK_BYTES // 1000)]
    error = refused(body(events=records), "payload_too_large")
    assert "1048576" in error.message
    prepare_replay(body(events=records[: len(records) // 2]))


# -- the chunk store ------------------------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage(tmp_path / "data")


def store(
    storage: Storage,
    seq: int,
    *,
    session: str = "s1",
    client: str = "acme",
    site: str = "web",
    content: bytes = b'[{"type":2}]',
    now_ms: int = NOV,
) -> replay.StoredChunk:
    job = replay.StoreChunk(
        client_id=client,
        site_id=site,
        session_id=session,
        seq=seq,
        content_hash=content.ljust(16, b"#")[:16],
        visitor_id="v1",
        client_timestamp=None,
        events=content,
    )
    result: replay.StoredChunk = run_job_now(storage, job, now_ms=now_ms)
    return result


def dumped(
    storage: Storage, session: str = "s1", client: str | None = None
) -> list[tuple[str, str, int]]:
    return [
        (parts[0], parts[1], parts[3])
        for parts, _ in replay.iter_session(storage, session, client, chunk=2)
    ]


def test_chunks_read_back_in_seq_order_per_session(storage: Storage) -> None:
    for seq in (10, 2, 256, 0, 1):
        store(storage, seq)
    store(storage, 3, session="s2")
    store(storage, 5, client="other")
    store(storage, 4, site="shop")
    assert dumped(storage) == [
        ("acme", "shop", 4),
        ("acme", "web", 0),
        ("acme", "web", 1),
        ("acme", "web", 2),
        ("acme", "web", 10),
        ("acme", "web", 256),
        ("other", "web", 5),
    ]
    assert [seq for _, _, seq in dumped(storage, client="other")] == [5]
    assert dumped(storage, client="acm") == []  # a client id is matched whole
    assert dumped(storage, "s2") == [("acme", "web", 3)]
    assert dumped(storage, "nope") == []


def test_same_content_is_a_duplicate_with_the_first_receipt(storage: Storage) -> None:
    first = store(storage, 0)
    assert not first.duplicate and first.receipt_id.startswith(f"rply_{storage.node_id}")
    again = store(storage, 0, now_ms=NOV + DAY)
    assert again == replay.StoredChunk(first.receipt_id, True)
    [(_, record)] = list(replay.iter_session(storage, "s1"))
    assert record.received_ms == NOV  # the duplicate changed nothing


def test_other_content_under_the_same_seq_is_a_conflict(storage: Storage) -> None:
    store(storage, 0)
    with pytest.raises(JobRefused) as info:
        store(storage, 0, content=b'[{"type":3}]')
    assert info.value.reason == replay.ChunkConflict("s1", 0)
    [(_, record)] = list(replay.iter_session(storage, "s1"))
    assert record.events == b'[{"type":2}]'


def test_split_key_round_trips_and_rejects_garbage() -> None:
    key = replay.chunk_key("acme", "web", "s1", 2**40 + 7)
    assert replay.split_key(key) == ("acme", "web", "s1", 2**40 + 7)
    assert replay.split_key(replay.chunk_key("a", "b", "c", 0)) == ("a", "b", "c", 0)
    assert replay.split_key(b"short") is None
    assert replay.split_key(b"no-separators-here" + bytes(8)) is None


# -- retention, check, backup ---------------------------------------------------------


def chunk_count(storage: Storage) -> int:
    with storage.read() as txn:
        return int(txn.stat(storage.dbs.replay)["entries"])


def test_retention_removes_chunks_older_than_the_replay_retention(storage: Storage) -> None:
    store(storage, 0, now_ms=NOV)
    store(storage, 1, now_ms=NOV + 10 * DAY)
    store(storage, 0, session="s2", now_ms=NOV + DAY)
    sweep = RetentionSweep(DAY, 30 * DAY, replay_retention_ms=30 * DAY)
    result = run_job_now(storage, sweep, now_ms=NOV + 30 * DAY)  # exactly s1/0's age
    assert (result.replay_removed, result.replay_scanned) == (1, 3)
    assert dumped(storage) == [("acme", "web", 1)] and dumped(storage, "s2") != []
    sweep.count_outcome(result)
    assert sweep.statistics().replay_removed == 1


def test_retention_keeps_chunks_without_a_replay_retention(storage: Storage) -> None:
    store(storage, 0, now_ms=NOV)
    result = run_job_now(storage, RetentionSweep(DAY, 30 * DAY), now_ms=NOV + 365 * DAY)
    assert (result.replay_removed, result.replay_scanned) == (0, 0) and chunk_count(storage) == 1
    assert SweepResult(0, 0, 0, 0, False).replay_removed == 0


def test_replay_sweep_is_bounded_and_resumes_where_it_stopped(storage: Storage) -> None:
    for seq in range(7):
        store(storage, seq, now_ms=NOV)
    sweep = RetentionSweep(DAY, 30 * DAY, batch=3, replay_retention_ms=DAY)
    removed = []
    for _ in range(4):
        result = run_job_now(storage, sweep, now_ms=NOV + 2 * DAY)
        assert result.replay_scanned <= 3
        removed.append(result.replay_removed)
    assert removed == [3, 3, 1, 0] and chunk_count(storage) == 0
    with storage.read() as txn:
        assert txn.get(replay.SWEEP_POS, db=storage.dbs.meta) is None  # wrapped around


def test_check_counts_chunks_and_reports_damaged_ones(storage: Storage) -> None:
    store(storage, 0)
    store(storage, 1)
    report = check(storage)
    assert report.ok and report.replay_chunks == 2
    with storage.env.begin(write=True) as txn:
        txn.put(replay.chunk_key("acme", "web", "s1", 1), b"\xc1junk", db=storage.dbs.replay)
        txn.put(b"bad-key", b"", db=storage.dbs.replay)
    report = check(storage)
    assert report.replay_chunks == 3
    assert any("acme/web/s1/1 does not decode" in p for p in report.problems)
    assert any("replay key b'bad-key' is malformed" in p for p in report.problems)


def test_backup_counts_replay_chunks(storage: Storage, tmp_path: Path) -> None:
    assert "replay" in DB_NAMES
    store(storage, 0)
    manifest = backup(storage, tmp_path / "backup")
    assert manifest.records["replay"] == 1
    copy = Storage(tmp_path / "backup")
    try:
        assert dumped(copy) == [("acme", "web", 0)]
    finally:
        copy.close()


def test_dump_lines_are_json_with_the_records_spliced_in(storage: Storage) -> None:
    from collector.replay_admin import session_lines

    store(storage, 1, content=b'[{"type":3,"data":{"x":1}}]')
    store(storage, 0)
    lines = [json.loads(line) for line in session_lines(storage, "s1", "acme")]
    assert [line["seq"] for line in lines] == [0, 1]
    assert lines[1]["events"] == [{"type": 3, "data": {"x": 1}}]
    assert set(lines[0]) == {
        "clientId", "siteId", "sessionId", "seq", "visitorId", "receivedAt", "receiptId",
        "timestamp", "events",
    }  # fmt: skip
    assert (lines[0]["receivedAt"], lines[0]["timestamp"]) == (NOV, None)


async def test_a_stored_chunk_proves_the_directory_writable_and_a_duplicate_does_not(storage: Storage) -> None:
    # helper-86: after a refused chunk /readyz stayed 503 while smaller chunks were stored
    # (only an event or the probe, whose megabyte no longer fitted, made it healthy).
    def chunk(seq: int) -> replay.StoreChunk:
        return replay.StoreChunk(client_id="acme", site_id="web", session_id="s1", seq=seq,
                                 content_hash=b"#" * 16, visitor_id="v1", client_timestamp=None, events=b"[]")

    writer = GroupCommitWriter(storage)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.submit(chunk(1))
        writer.healthy = False  # (as after a failed commit)
        assert (await writer.submit(chunk(1))).duplicate and not writer.healthy
        assert not (await writer.submit(chunk(2))).duplicate and writer.healthy
        nursery.cancel_scope.cancel()
