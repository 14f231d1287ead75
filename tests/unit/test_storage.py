"""Storage and the group-commit writer against a real LMDB in a temp directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from storage import counters, idempotency, outbox
from storage.admission import Admission, AdmissionResult, Candidate, Conflict
from storage.env import FORMAT_VERSION, Storage
from storage.errors import FormatError, StorageFull, WriterBusy
from storage.retention import RetentionSweep
from storage.writer import GroupCommitWriter, JobRefused, WriteContext, run_job_now

UNITS = ("pageview", "coverage")


def admission(eids: list[str], *, content: bytes = b"h" * 16, budget=None, size: int = 100) -> Admission:
    return Admission(
        client_id="acme",
        site_id="web",
        key_type="browser",
        account="acme",
        period="2026-11",
        candidates=[Candidate(eid, content, b'{"x":"' + b"y" * size + b'"}', "pageview") for eid in eids],
        budget=budget or (lambda used, added: (used, added)),
        units=UNITS,
    )


def test_format_marker_written_and_checked(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    assert storage.format_version() == FORMAT_VERSION
    with storage.env.begin(write=True) as txn:
        txn.put(b"format", str(FORMAT_VERSION + 1).encode(), db=storage.dbs.meta)
    storage.close()
    with pytest.raises(FormatError, match="upgrade the collector"):
        Storage(tmp_path)


def test_admission_stores_events_and_counts(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    result: AdmissionResult = run_job_now(storage, admission(["a", "b"]))
    assert result.duplicate == [False, False]
    assert [r.eid for _, r in outbox.iter_outbox(storage)] == ["a", "b"]
    assert counters.read_counter(storage, "acme", "2026-11", "pageview") == 2
    again: AdmissionResult = run_job_now(storage, admission(["a", "c"]))
    assert again.duplicate == [True, False]
    assert again.receipt_ids[0] == result.receipt_ids[0]
    assert counters.read_counter(storage, "acme", "2026-11", "pageview") == 3
    assert outbox.last_seq(storage) == 3


def test_conflict_refuses_without_writing(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a"]))
    with pytest.raises(JobRefused) as refused:
        run_job_now(storage, admission(["b", "a"], content=b"z" * 16))
    assert refused.value.reason == Conflict("a", 1)
    assert [r.eid for _, r in outbox.iter_outbox(storage)] == ["a"]


def _rewrite_hash_form(storage: Storage, eid: str, hash_form: int) -> None:
    """The record of `eid` as a version writing that hash form left it."""
    key = idempotency.ledger_key("acme", eid)
    with storage.env.begin(write=True) as txn:
        record = idempotency.decode(txn.get(key, db=storage.dbs.idempotency))
        fields = (record.content_hash, record.receipt_id, record.stored_ms, hash_form)
        txn.put(key, idempotency.encode_fields(fields if hash_form else fields[:3]), db=storage.dbs.idempotency)


@pytest.mark.parametrize("hash_form", [0, idempotency.HASHED_AS_WRITTEN])
def test_a_record_with_an_earlier_versions_hash_is_the_same_content(tmp_path: Path, hash_form: int) -> None:
    # Versions before the keyed hash stored an unkeyed one (and before 2026-11-24 with
    # free-form map keys in the order sent): a retry of a request they stored carries
    # those hashes (older_hashes), and is a duplicate of their record.
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a"], content=b"o" * 16))
    _rewrite_hash_form(storage, "a", hash_form)
    retry = admission(["a"], content=b"n" * 16)
    retry.candidates = [msgspec.structs.replace(c, older_hashes=lambda _: (b"x" * 16, b"o" * 16)) for c in retry.candidates]
    result: AdmissionResult = run_job_now(storage, retry)
    assert result.duplicate == [True]
    with pytest.raises(JobRefused):  # anything else is still a conflict
        run_job_now(storage, admission(["a"], content=b"z" * 16))


def test_a_keyed_record_is_compared_with_the_keyed_hash_alone(tmp_path: Path) -> None:
    # A record this version wrote holds the keyed hash: an unkeyed one equal to it (a
    # guess made without the key) is not its content.
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a"], content=b"o" * 16))
    with storage.env.begin() as txn:
        record = idempotency.decode(txn.get(idempotency.ledger_key("acme", "a"), db=storage.dbs.idempotency))
    assert record.hash_form == idempotency.HASHED_KEYED
    retry = admission(["a"], content=b"n" * 16)
    retry.candidates = [msgspec.structs.replace(c, older_hashes=lambda _: (b"o" * 16,)) for c in retry.candidates]
    with pytest.raises(JobRefused):
        run_job_now(storage, retry)
    assert run_job_now(storage, admission(["a"], content=b"o" * 16)).duplicate == [True]


def test_an_id_is_forgotten_when_the_sweep_removes_its_record_not_before(tmp_path: Path) -> None:
    # Admission does not judge the window itself: a worker whose clock runs days ahead
    # (its own clock guard, restarted during a step) would store a retry again that
    # another worker had called a duplicate. Only the sweep, on worker 0, forgets.
    storage = Storage(tmp_path)
    first: AdmissionResult = run_job_now(storage, admission(["a"]), now_ms=1_000)
    later = 1_000 + 30 * 86_400_000
    retry: AdmissionResult = run_job_now(storage, admission(["a"]), now_ms=later)
    assert retry.duplicate == [True] and retry.receipt_ids == first.receipt_ids
    with pytest.raises(JobRefused):  # still the id's content until swept
        run_job_now(storage, admission(["a"], content=b"z" * 16), now_ms=later)
    sweep = RetentionSweep(outbox_retention_ms=86_400_000, idempotency_window_ms=7 * 86_400_000)
    assert run_job_now(storage, sweep, now_ms=1_000 + 7 * 86_400_000 - 1).idempotency_removed == 0
    assert run_job_now(storage, sweep, now_ms=1_000 + 7 * 86_400_000).idempotency_removed == 1
    again: AdmissionResult = run_job_now(storage, admission(["a"], content=b"z" * 16), now_ms=later)
    assert again.duplicate == [False]


def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    storage = Storage(tmp_path, map_size=1024 * 1024)
    for batch in range(40):
        run_job_now(storage, admission([f"e{batch}-{i}" for i in range(25)], size=2000))
    map_size, used = storage.usage()
    assert map_size > 1024 * 1024
    assert outbox.last_seq(storage) == 1000


def test_map_that_cannot_grow_fails_cleanly(tmp_path: Path) -> None:
    from storage.errors import StorageFull

    storage = Storage(tmp_path, map_size=1024 * 1024, max_map_size=1024 * 1024)
    with pytest.raises(StorageFull):
        for batch in range(100):
            run_job_now(storage, admission([f"e{batch}-{i}" for i in range(25)], size=4000))
    stored_before = outbox.last_seq(storage)
    assert stored_before % 25 == 0  # whole batches only


async def test_group_commit_shares_transactions(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    writer = GroupCommitWriter(storage)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as clients:
            for n in range(200):
                clients.start_soon(writer.submit, admission([f"g{n}"]))
        nursery.cancel_scope.cancel()
    stats = writer.statistics()
    assert stats.jobs_committed == 200
    assert stats.transactions < 200
    assert outbox.last_seq(storage) == 200


async def test_refused_job_does_not_affect_its_group(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    writer = GroupCommitWriter(storage)

    def refuse(used, added):
        raise JobRefused("billing stop")

    outcomes: dict[str, object] = {}

    async def submit(name: str, job: Admission) -> None:
        try:
            outcomes[name] = await writer.submit(job)
        except JobRefused as exc:
            outcomes[name] = exc.reason

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as clients:
            clients.start_soon(submit, "ok1", admission(["k1"]))
            clients.start_soon(submit, "no", admission(["k2"], budget=refuse))
            clients.start_soon(submit, "ok2", admission(["k3"]))
        nursery.cancel_scope.cancel()
    assert outcomes["no"] == "billing stop"
    assert sorted(r.eid for _, r in outbox.iter_outbox(storage)) == ["k1", "k3"]


async def test_crashing_job_fails_alone(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    writer = GroupCommitWriter(storage)

    class Crash:
        def run(self, ctx: WriteContext) -> None:
            ctx.txn.put(b"half", b"written", db=ctx.dbs.meta)
            raise RuntimeError("bug")

    errors: list[BaseException] = []

    async def crash() -> None:
        try:
            await writer.submit(Crash())
        except Exception as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as clients:
            clients.start_soon(writer.submit, admission(["ok"]))
            clients.start_soon(crash)
        nursery.cancel_scope.cancel()
    assert len(errors) == 1
    with storage.read() as txn:
        assert txn.get(b"half", db=storage.dbs.meta) is None
    assert [r.eid for _, r in outbox.iter_outbox(storage)] == ["ok"]


async def test_full_queue_refuses_at_once(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    writer = GroupCommitWriter(storage, max_queue=1)
    # Not started: nothing drains the queue, so the second submit must refuse.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.submit, admission(["q1"]))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(WriterBusy):
            await writer.submit(admission(["q2"]))
        nursery.cancel_scope.cancel()


def test_unreadable_counter_refuses_with_metering_unavailable(tmp_path: Path) -> None:
    from storage.admission import MeteringUnavailable

    storage = Storage(tmp_path)
    with storage.env.begin(write=True) as txn:
        txn.put(counters.counter_key("acme", "2026-11", "pageview"), b"\x01", db=storage.dbs.counters)
    with pytest.raises(JobRefused) as refused:
        run_job_now(storage, admission(["a"]))
    assert isinstance(refused.value.reason, MeteringUnavailable)
    assert outbox.last_seq(storage) == 0


def test_iter_counters_leaves_damaged_rows_out(tmp_path: Path) -> None:
    # /metrics reads every counter: one damaged row must not break it.
    storage = Storage(tmp_path)
    with storage.env.begin(write=True) as txn:
        txn.put(counters.counter_key("acme", "2026-11", "pageview"), counters.encode_value(7), db=storage.dbs.counters)
        txn.put(counters.counter_key("acme", "2026-11", "coverage"), b"\x01", db=storage.dbs.counters)
        txn.put(b"caf\xe9\x002026-11\x00pageview", counters.encode_value(1), db=storage.dbs.counters)
        txn.put(b"no-separators", counters.encode_value(1), db=storage.dbs.counters)
    assert list(counters.iter_counters(storage)) == [("acme", "2026-11", "pageview", 7)]
    storage.close()


def test_a_damaged_counter_row_says_what_it_counted_as_far_as_it_can_be_read(tmp_path: Path) -> None:
    # `usage show` and `invoice` name these and leave out what they counted (review helper-70 #1).
    assert counters.read_row(b"acme\x002026-11\x00pageview", counters.encode_value(7)) == (
        "acme", "2026-11", "pageview", 7)
    assert counters.read_row(b"acme\x002026-11\x00pageview_overage", b"xyz") == counters.DamagedCounter(
        "acme/2026-11/pageview_overage", "acme", "2026-11", "pageview_overage",
        "its value is 3 bytes, not an 8-byte count")
    assert counters.read_row(b"caf\xe9\x002026-11\x00pageview", counters.encode_value(1)) == counters.DamagedCounter(
        "caf\\xe9/2026-11/pageview", None, "2026-11", "pageview", "its key is not three UTF-8 parts")
    assert counters.read_row(b"no-separators", counters.encode_value(1)) == counters.DamagedCounter(
        "no-separators", None, None, None, "its key is not three UTF-8 parts")
    storage = Storage(tmp_path)
    with storage.env.begin(write=True) as txn:
        txn.put(counters.counter_key("acme", "2026-11", "pageview"), counters.encode_value(7), db=storage.dbs.counters)
        txn.put(counters.counter_key("acme", "2026-11", "coverage"), b"\x01", db=storage.dbs.counters)
    damaged: list[counters.DamagedCounter] = []
    assert list(counters.iter_counters(storage, on_damaged=damaged.append)) == [("acme", "2026-11", "pageview", 7)]
    assert [row.name for row in damaged] == ["acme/2026-11/coverage"]
    storage.close()


def test_format_0_directory_is_migrated(tmp_path: Path) -> None:
    import lmdb

    # A data directory from before the format marker: keys, and no marker or node id.
    env = lmdb.open(str(tmp_path), max_dbs=10)
    keys = env.open_db(b"keys")
    env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"cs_live_old0000000", b'{"key":"cs_live_old0000000","clientId":"old"}', db=keys)
    env.close()
    storage = Storage(tmp_path)
    assert storage.format_version() == FORMAT_VERSION
    assert len(storage.node_id) == 8
    with storage.read() as txn:
        assert txn.get(b"cs_live_old0000000", db=storage.dbs.keys) is not None
    result = run_job_now(storage, admission(["after-migration"]))
    assert result.receipt_ids[0].startswith("rcpt_" + storage.node_id)


def test_admission_encodings_match_the_record_structs() -> None:
    # Admission encodes field tuples and formats receipts per request; the
    # bytes must be those the Structs and receipt_id give.
    fields = ("rcpt_ab000000000001", "acme", "web", "e1", 123, "browser", b"{}", "v1", "scroll", True, "tool", 4567)
    scrolled = (*fields, ("s1", "/pricing", 75.0, 1200.0))
    assert outbox.encode_fields(scrolled) == outbox.encode(outbox.OutboxRecord(*scrolled))
    # Records of other events end before the page fact: they read as its default.
    assert outbox.decode(outbox.encode_fields(fields)) == outbox.OutboxRecord(*fields)
    assert outbox.decode_facts(outbox.encode_fields(scrolled)).page == ["s1", "/pricing", 75.0, 1200.0]
    ledger = (b"h" * 16, "rcpt_ab000000000001", 123, idempotency.HASHED_AS_WRITTEN)
    assert idempotency.encode_fields(ledger) == idempotency.encode(idempotency.IdempotencyRecord(*ledger))
    # A record of a version before the hash form reads as 0; those versions read a new one.
    assert idempotency.decode(idempotency.encode_fields(ledger[:3])).hash_form == 0
    class Before(msgspec.Struct, array_like=True, frozen=True):  # (the record as they declared it)
        content_hash: bytes
        receipt_id: str
        stored_ms: int

    assert msgspec.msgpack.decode(idempotency.encode_fields(ledger), type=Before) == Before(*ledger[:3])
    for node in ("ab12cd34", "odd%node"):
        assert outbox.receipt_format(node) % 0x1F == outbox.receipt_id(node, 0x1F)
    assert idempotency.ledger_keys("acme", ["a", "b"]) == [
        idempotency.ledger_key("acme", "a"), idempotency.ledger_key("acme", "b")]


def test_records_without_facts_read_as_before(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a"]))
    [(_, record)] = outbox.iter_outbox(storage)
    assert record.visitor_id is None  # the candidate gave no facts: consumers parse the event
    storage.close()


def test_the_facts_view_mirrors_the_outbox_record() -> None:
    # decode_facts reads records positionally: its fields must stay OutboxRecord's
    assert outbox.RecordFacts.__struct_fields__ == outbox.OutboxRecord.__struct_fields__


def test_a_reader_killed_mid_read_is_cleared(tmp_path: Path) -> None:
    # A `collector check` killed with -9 leaves its reader slot; until it is cleared,
    # LMDB cannot reuse any page freed after its snapshot.
    storage = Storage(tmp_path / "data")
    try:
        reader = subprocess.Popen(
            [sys.executable, "-c",
             "import lmdb, sys, time\n"
             "env = lmdb.open(sys.argv[1], readonly=True, max_dbs=32)\n"
             "txn = env.begin()\n"
             "print('reading', flush=True)\n"
             "time.sleep(60)\n",
             str(tmp_path / "data")],
            stdout=subprocess.PIPE, text=True,
        )
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        reader.kill()
        reader.wait()
        assert storage.clear_stale_readers() == 1
        assert storage.clear_stale_readers() == 0
    finally:
        storage.close()


async def test_a_solo_job_commits_alone_so_its_failure_spares_the_group(tmp_path: Path) -> None:
    # A map at its cap: a large solo write fails, the small admissions queued around it commit.
    storage = Storage(tmp_path, map_size=1024 * 1024, max_map_size=1024 * 1024)
    writer = GroupCommitWriter(storage)

    class Large:
        solo = True

        def run(self, ctx: WriteContext) -> None:
            ctx.txn.put(b"large", bytes(2 * 1024 * 1024), db=ctx.dbs.meta)

    outcomes: dict[str, object] = {}

    async def submit(name: str, job: object) -> None:
        try:
            outcomes[name] = await writer.submit(job)  # type: ignore[arg-type]
        except StorageFull as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as clients:
            clients.start_soon(submit, "before", admission(["s1"]))
            clients.start_soon(submit, "large", Large())
            clients.start_soon(submit, "after", admission(["s2"]))
        nursery.cancel_scope.cancel()
    assert isinstance(outcomes["large"], StorageFull)
    assert isinstance(outcomes["before"], AdmissionResult) and isinstance(outcomes["after"], AdmissionResult)
    assert outbox.last_seq(storage) == 2
    storage.close()


def test_iter_outbox_hands_an_unreadable_record_to_its_caller_and_goes_on(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    run_job_now(storage, admission(["a", "b", "c"]))
    with storage.env.begin(write=True) as txn:
        txn.put(outbox.seq_key(2), txn.get(outbox.seq_key(2), db=storage.dbs.outbox).replace(b"acme", b"\xffcme"),
                db=storage.dbs.outbox)
    skipped: list[tuple[int, str]] = []
    rows = outbox.iter_outbox(storage, on_unreadable=lambda seq, exc: skipped.append((seq, type(exc).__name__)))
    assert [r.eid for _, r in rows] == ["a", "c"]
    assert skipped == [(2, "UnicodeDecodeError")]
    with pytest.raises(UnicodeDecodeError):
        list(outbox.iter_outbox(storage))  # without a callback the error reaches the caller


def test_units_spent_beyond_the_included_ones_are_counted_as_served_overage(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        key, over = counters.counter_key("acme", "2026-11", "coverage"), counters.overage_key("acme", "2026-11", "coverage")
        for units in (3, 3, 3):  # 9 units, 5 included: the second spend crosses, the third is all overage
            spend = run_job_now(storage, counters.SpendUnits(key, units, lambda used, more: True,
                                                             overage=(over, 5, "2026-11")))
            assert spend.spent
        assert counters.read_counter(storage, "acme", "2026-11", "coverage") == 9
        assert counters.read_counter(storage, "acme", "2026-11", "coverage_overage") == 4
        # Without paid overage nothing is counted as served overage.
        run_job_now(storage, counters.SpendUnits(key, 1, lambda used, more: True))
        assert counters.read_counter(storage, "acme", "2026-11", "coverage_overage") == 4
        assert [counters.served_overage(5, used, 3) for used in (0, 3, 6)] == [0, 1, 3]
        # A period already past its included units without the counter (metered by a
        # version before it, review helper-34) starts from the overage its usage shows.
        old = counters.counter_key("old", "2026-11", "coverage")
        run_job_now(storage, counters.SpendUnits(old, 8, lambda used, more: True))
        counters.mark_overage_counting(storage, "2026-11")
        counters.mark_overage_counting(storage, "2026-12")  # (the first period stays)
        run_job_now(storage, counters.SpendUnits(old, 2, lambda used, more: True,
                                                 overage=(counters.overage_key("old", "2026-11", "coverage"), 5, "2026-11")))
        assert counters.read_counter(storage, "old", "2026-11", "coverage_overage") == 5
        # In a later period, units served as included before the allowance was lowered
        # are not overage (review helper-36).
        later = counters.counter_key("old", "2026-12", "coverage")
        run_job_now(storage, counters.SpendUnits(later, 8, lambda used, more: True))
        run_job_now(storage, counters.SpendUnits(later, 2, lambda used, more: True,
                                                 overage=(counters.overage_key("old", "2026-12", "coverage"), 5, "2026-12")))
        assert counters.read_counter(storage, "old", "2026-12", "coverage_overage") == 2
        assert counters.overage_counted_from(storage) == "2026-11"
    finally:
        storage.close()


def test_a_directory_with_nothing_metered_counts_overage_from_its_first_unit(tmp_path: Path) -> None:
    # Nothing was metered uncounted in the month: the mark is the month before, so
    # that month is priced from its counters alone (audit helper-42).
    storage = Storage(tmp_path)
    try:
        run_job_now(storage, counters.SpendUnits(counters.counter_key("acme", "2026-10", "pageview"), 3,
                                                 lambda used, more: True))
        counters.mark_overage_counting(storage, "2026-11")
        assert counters.overage_counted_from(storage) == "2026-10"
    finally:
        storage.close()
    assert [counters.period_before(p) for p in ("2026-01", "2026-11", "2027-10")] == ["2025-12", "2026-10", "2027-09"]


def test_the_room_left_counts_the_root_reserve_for_root_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # helper-100: /readyz counted blocks available to users while a root service wrote
    # into the reserve (every batch 202, /readyz 503); a commit's I/O error counted both.
    from storage.errors import usable_bytes

    stat = os.statvfs_result((4096, 4096, 1000, 300, 0, 10, 10, 10, 0, 255))  # bfree 300, bavail 0
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert usable_bytes(stat) == 300 * 4096
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert usable_bytes(stat) == 0
