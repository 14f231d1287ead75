"""`check` over a real LMDB populated through Admission, then damaged on purpose."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

import msgspec
import pytest

from storage import counters, idempotency, keys, outbox, replay
from storage.admission import Admission, AdmissionResult, Candidate
from storage.audit import append_entry
from storage.check import check
from storage.env import Storage
from storage.errors import StorageError
from storage.keys import put_keys
from storage.retention import RetentionSweep
from storage.visitors import FoldVisitors, visitor_key
from storage.writer import run_job_now

NOV = calendar.timegm((2026, 11, 15, 12, 0, 0)) * 1000
DEC_START = calendar.timegm((2026, 12, 1, 0, 0, 0)) * 1000
DAY = 86_400_000
UNITS = ("pageview", "coverage")


def unit_for(kind: str, bot: bool) -> str | None:
    """The pipeline's meter: human pageviews, everything else but consent as coverage."""
    if kind == "_consent_transition":
        return None
    return "pageview" if kind == "pageview" and not bot else "coverage"


def admit(
    storage: Storage,
    events: list[tuple[str, str]] | list[str],
    *,
    client: str = "acme",
    account: str | None = None,
    now_ms: int = NOV,
    received_ms: int | None = None,
    bot: bool = False,
    unit: str | None = "auto",
) -> AdmissionResult:
    """Admit events given as eids (pageviews) or (eid, type), stored as the pipeline stores them."""
    received = now_ms if received_ms is None else received_ms
    candidates = []
    for item in events:
        eid, kind = (item, "pageview") if isinstance(item, str) else item
        body: dict[str, object] = {
            "type": kind,
            "visitorId": "v" * 32,
            "eid": eid,
            "clientId": client,
            "siteId": "web",
            "receivedAt": received,
        }
        if bot:
            body["bot"] = {"isBot": True, "category": "crawler"}
        stored = json.dumps(body).encode()
        drawn = unit_for(kind, bot) if unit == "auto" else unit
        candidates.append(Candidate(eid, eid.encode().ljust(16, b"#"), stored, drawn))
    job = Admission(
        client_id=client,
        site_id="web",
        key_type="browser",
        account=account or client,
        period=_period(received),
        candidates=candidates,
        budget=lambda used, added: None,
        units=UNITS,
    )
    result: AdmissionResult = run_job_now(storage, job, now_ms=now_ms)
    return result


def _period(ms: int) -> str:
    import time

    return time.strftime("%Y-%m", time.gmtime(ms / 1000))


def add_key(storage: Storage, client: str, billing_account: str | None = None) -> None:
    record: dict[str, object] = {
        "key": f"cs_live_{client}_0000",
        "clientId": client,
        "plan": "free",
    }
    if billing_account is not None:
        record["billingAccount"] = billing_account
    put_keys(storage, [(str(record["key"]), json.dumps(record).encode())])


def put_raw(storage: Storage, db: str, key: bytes, value: bytes | None) -> None:
    with storage.env.begin(write=True) as txn:
        if value is None:
            txn.delete(key, db=getattr(storage.dbs, db))
        else:
            txn.put(key, value, db=getattr(storage.dbs, db))


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    opened = Storage(tmp_path / "data")
    add_key(opened, "acme")
    admit(opened, ["p1", "p2", ("c1", "click"), ("s1", "scroll"), ("k1", "_consent_transition")])
    admit(opened, ["b1"], bot=True)
    admit(opened, ["d1", ("f1", "form")], now_ms=DEC_START + DAY)
    return opened


def test_a_consistent_directory_has_no_problems(storage: Storage) -> None:
    before = storage.env.info()["last_txnid"]
    report = check(storage)
    assert report.problems == [] and report.ok
    assert report.notes == []
    assert (report.outbox_records, report.idempotency_records, report.keys) == (8, 8, 1)
    assert report.counters == 4 and report.next_seq == 9 and report.retained_from == 0
    assert storage.env.info()["last_txnid"] == before  # check never writes


def test_counter_below_the_outbox_is_reported(storage: Storage) -> None:
    put_raw(
        storage,
        "counters",
        counters.counter_key("acme", "2026-11", "coverage"),
        counters.encode_value(2),
    )
    put_raw(storage, "counters", counters.counter_key("acme", "2026-12", "pageview"), None)
    report = check(storage)
    assert sorted(report.problems) == [
        "counter acme/2026-11/coverage is 2, the outbox holds 3",
        "counter acme/2026-12/pageview is 0, the outbox holds 1",
    ]
    assert not report.ok


def test_a_shortfall_from_a_billing_account_change_is_a_note(tmp_path: Path) -> None:
    # acme's events were counted into acme-eu while its key billed there (audit
    # helper-32); without the move an import records, the shortfall is damage,
    # whatever other accounts hold (review helper-34).
    storage = Storage(tmp_path)
    add_key(storage, "acme")
    admit(storage, ["p1", "p2"])
    admit(storage, ["p3"], account="acme-eu")
    shortfall = "counter acme/2026-11/pageview is 2, the outbox holds 3"
    assert check(storage).problems == [shortfall]
    put_raw(storage, "meta", keys.BILLING_MOVED + b"acme", b"2026-11")
    report = check(storage)
    assert report.problems == [] and report.ok
    assert report.notes == [f"{shortfall}; its billing account changed in 2026-11: events before that are"
                            " counted in the account of their time"]
    put_raw(storage, "meta", keys.BILLING_MOVED + b"acme", b"2026-10")  # a move before the period explains nothing
    assert check(storage).problems == [shortfall]


def test_counter_above_the_outbox_is_allowed(storage: Storage) -> None:
    put_raw(
        storage,
        "counters",
        counters.counter_key("acme", "2026-11", "pageview"),
        counters.encode_value(99),
    )
    assert check(storage).problems == []


def test_bot_pageviews_are_recounted_as_coverage(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    add_key(storage, "acme")
    admit(storage, ["bot1"], bot=True, unit="pageview")  # metered wrongly as a pageview
    assert check(storage).problems == ["counter acme/2026-11/coverage is 0, the outbox holds 1"]


def test_period_is_the_request_time_not_the_commit_time(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    add_key(storage, "acme")
    # received in the last millisecond of November, committed in December
    admit(storage, ["edge"], now_ms=DEC_START + 5, received_ms=DEC_START - 1)
    assert counters.read_counter(storage, "acme", "2026-11", "pageview") == 1
    assert check(storage).problems == []


def test_pooled_clients_are_compared_with_their_accounts_counter(tmp_path: Path) -> None:
    # helper-126: every client billing into another account was skipped with a note,
    # so a shared account, where an accounting bug would be likeliest, went unchecked.
    storage = Storage(tmp_path)
    add_key(storage, "acme")
    add_key(storage, "agency", billing_account="acme")
    admit(storage, ["a1"], client="agency", account="acme")
    admit(storage, ["m1"], account="acme")
    admit(storage, ["x1"], client="stranger")
    put_raw(storage, "counters", counters.counter_key("stranger", "2026-11", "pageview"), None)
    report = check(storage)
    assert report.problems == []  # acme's counter holds both clients' units
    assert report.notes == ["usage of client stranger not compared: it has no key record"]
    put_raw(storage, "counters", counters.counter_key("acme", "2026-11", "pageview"), counters.encode_value(1))
    shortfall = "counter acme/2026-11/pageview is 1, the outbox holds 2 of clients acme, agency"
    assert check(storage).problems == [shortfall]
    put_raw(storage, "meta", keys.BILLING_MOVED + b"agency", b"2026-11")  # agency came from elsewhere
    report = check(storage)
    assert report.problems == [] and report.notes == [
        "usage of client stranger not compared: it has no key record",
        f"{shortfall}; billing accounts changed (agency's in 2026-11): events before that are counted in"
        " the account of their time",
    ]


def test_gap_in_the_outbox_and_dangling_receipt(storage: Storage) -> None:
    put_raw(storage, "outbox", outbox.seq_key(3), None)
    report = check(storage)
    assert "outbox seqs 3..3 are missing (retained from 0)" in report.problems
    assert any("idempotency record acme/c1 names missing receipt" in p for p in report.problems)


def test_missing_tail_is_reported(storage: Storage) -> None:
    put_raw(storage, "outbox", outbox.seq_key(8), None)
    put_raw(storage, "idempotency", idempotency.ledger_key("acme", "f1"), None)
    assert check(storage).problems == ["outbox seqs 8..8 are missing (next seq 9)"]


def test_seq_past_the_marker_is_reported(storage: Storage) -> None:
    with storage.read() as txn:
        row = txn.get(outbox.seq_key(8), db=storage.dbs.outbox)
    put_raw(storage, "outbox", outbox.seq_key(12), row)
    problems = check(storage).problems
    assert "outbox seq 12 is at or past the next-seq marker 9" in problems
    assert "outbox seqs 9..11 are missing (retained from 0)" in problems


def test_gap_below_the_retention_mark_is_allowed(storage: Storage) -> None:
    sweep = RetentionSweep(outbox_retention_ms=DAY, idempotency_window_ms=60 * DAY)
    result = run_job_now(storage, sweep, now_ms=NOV + 2 * DAY)
    assert result.outbox_removed == 6 and result.retained_from == 7
    report = check(storage)
    # idempotency records still name the removed receipts: allowed below the mark
    assert report.problems == [] and report.retained_from == 7
    assert (report.outbox_records, report.idempotency_records) == (2, 8)
    # removed rows below the mark do not excuse a gap above it
    put_raw(storage, "outbox", outbox.seq_key(7), None)
    assert "outbox seqs 7..7 are missing (retained from 7)" in check(storage).problems


def test_records_that_do_not_decode(storage: Storage) -> None:
    put_raw(storage, "outbox", outbox.seq_key(2), b"\xc1garbage")
    put_raw(storage, "idempotency", idempotency.ledger_key("acme", "p1"), b"\x93\x01")
    put_raw(storage, "counters", b"acme\x002026-11", counters.encode_value(1))
    problems = check(storage).problems
    assert any(p.startswith("outbox seq 2 does not decode") for p in problems)
    assert any(p.startswith("idempotency record acme/p1 does not decode") for p in problems)
    assert "usage counter acme/2026-11 is malformed" in problems


def test_ledger_pointing_at_another_event(storage: Storage) -> None:
    with storage.read() as txn:
        raw = txn.get(idempotency.ledger_key("acme", "p1"), db=storage.dbs.idempotency)
    record = idempotency.decode(raw)
    other = outbox.receipt_id(storage.node_id, 2)
    put_raw(
        storage,
        "idempotency",
        idempotency.ledger_key("acme", "p1"),
        idempotency.encode(
            idempotency.IdempotencyRecord(record.content_hash, other, record.stored_ms)
        ),
    )
    assert check(storage).problems == [
        f"idempotency record acme/p1 names receipt {other}, but outbox seq 2 holds acme/p2 ({other})"
    ]


def test_outbox_record_with_a_foreign_receipt(storage: Storage) -> None:
    with storage.read() as txn:
        record = outbox.decode(txn.get(outbox.seq_key(5), db=storage.dbs.outbox))
    wrong = outbox.receipt_id(storage.node_id, 77)
    fields = [getattr(record, f) for f in record.__struct_fields__]
    fields[0] = wrong
    put_raw(storage, "outbox", outbox.seq_key(5), outbox.encode(outbox.OutboxRecord(*fields)))
    assert f"outbox seq 5 carries receipt {wrong} of another seq" in check(storage).problems


def test_problems_are_capped_and_counted(storage: Storage) -> None:
    for seq in range(1, 9):
        put_raw(storage, "outbox", outbox.seq_key(seq), b"\xc1")
    report = check(storage, max_problems=4)
    assert len(report.problems) == 4 and report.problems_omitted == 4


def test_outbox_facts_that_disagree_with_the_event(storage: Storage) -> None:
    with storage.read() as txn:
        record = outbox.decode(txn.get(outbox.seq_key(2), db=storage.dbs.outbox))
    assert check(storage).ok  # facts-less records (the fixture's) are not compared
    event = json.loads(record.event)
    agreeing = msgspec.structs.replace(record, visitor_id=event["visitorId"], event_type=event["type"],
                                       is_bot=False, bot_category="")
    put_raw(storage, "outbox", outbox.seq_key(2), outbox.encode(agreeing))
    assert check(storage).ok
    lying = msgspec.structs.replace(agreeing, visitor_id="someone-else")
    put_raw(storage, "outbox", outbox.seq_key(2), outbox.encode(lying))
    [problem] = check(storage).problems
    assert problem.startswith("outbox seq 2 carries facts ('someone-else', 'pageview', False, '')")


def spoiled(value: bytes, text: bytes) -> bytes:
    """`value` with the first byte of `text` in it replaced by 0xFF: a string that is not UTF-8."""
    at = value.index(text)
    return value[:at] + b"\xff" + value[at + 1 :]


def test_records_whose_strings_are_not_utf8_are_problems_not_crashes(storage: Storage) -> None:
    # msgspec raises UnicodeDecodeError, not DecodeError, for these
    with storage.read() as txn:
        row = bytes(txn.get(outbox.seq_key(2), db=storage.dbs.outbox))
        ledger = bytes(txn.get(idempotency.ledger_key("acme", "p1"), db=storage.dbs.idempotency))
        [(key_id, key_record)] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=storage.dbs.keys)]
    put_raw(storage, "outbox", outbox.seq_key(2), spoiled(row, b"acme"))
    put_raw(storage, "idempotency", idempotency.ledger_key("acme", "p1"), spoiled(ledger, b"rcpt_"))
    put_raw(storage, "keys", key_id, spoiled(key_record, b'acme"'))  # its clientId
    chunk = replay.ReplayRecord(NOV, "rply_x", b"h" * 16, "v1", None, b"[]")
    put_raw(storage, "replay", replay.chunk_key("acme", "web", "s1", 0), spoiled(replay.encode(chunk), b"v1"))
    append_entry(storage, at_ms=NOV, who="op", action="reveal", receipt_id="r", fields=[], reason="why")
    with storage.read() as txn:
        entry = bytes(txn.get((1).to_bytes(8, "big"), db=storage.dbs.audit))
    put_raw(storage, "audit", (1).to_bytes(8, "big"), spoiled(entry, b"op"))
    report = check(storage)
    problems = "\n".join(report.problems)
    assert "outbox seq 2 does not decode: 'utf-8' codec can't decode byte 0xff" in problems
    assert "idempotency record acme/p1 does not decode" in problems
    assert f"key record {key_id[:12]!r}... does not decode" in problems
    assert "replay chunk acme/web/s1/0 does not decode" in problems
    assert "audit entry 1 does not decode" in problems


def test_an_event_received_outside_any_period_is_a_problem(storage: Storage) -> None:
    with storage.read() as txn:
        record = outbox.decode(txn.get(outbox.seq_key(1), db=storage.dbs.outbox))
    event = json.loads(record.event)
    event["receivedAt"] = 1e300
    wild = msgspec.structs.replace(record, event=json.dumps(event).encode())
    put_raw(storage, "outbox", outbox.seq_key(1), outbox.encode(wild))
    assert "outbox seq 1 was received at 1e+300, a time in no billing period" in check(storage).problems


def test_no_audit_entry_is_chained_onto_one_that_does_not_decode(storage: Storage) -> None:
    append_entry(storage, at_ms=NOV, who="op", action="reveal", receipt_id="r", fields=[], reason="why")
    put_raw(storage, "audit", (1).to_bytes(8, "big"), b'{"seq": 1, "who": "\xff"}')
    with pytest.raises(StorageError, match="the last audit entry does not decode"):
        append_entry(storage, at_ms=NOV, who="op", action="reveal", receipt_id="r", fields=[], reason="why")
    assert check(storage).problems == ["audit entry 1 does not decode"]


def test_visitor_records_that_do_not_decode_and_cursors_past_the_head(storage: Storage) -> None:
    run_job_now(storage, FoldVisitors(), now_ms=NOV)
    report = check(storage)
    assert report.ok and report.visitor_records == 1  # the fixture has one visitor
    put_raw(storage, "visitors", visitor_key("acme", "web", "v" * 32), b"garbage")
    put_raw(storage, "visitors", b"no separators", b"")
    put_raw(storage, "cursors", b"visitors", (9 + 9999).to_bytes(8, "big"))
    put_raw(storage, "cursors", b"other", b"\x01")
    problems = check(storage).problems
    assert problems[0].startswith(f"visitor record acme/web/{'v' * 32} does not decode")
    assert problems[1:] == [
        "visitor key b'no separators' is malformed",
        "cursor other is not an 8-byte sequence number: b'\\x01'",
        "cursor visitors is at seq 10008, past the outbox head 8",
    ]


def test_an_event_member_that_is_not_utf8_is_a_problem(storage: Storage) -> None:
    # The facts decoder skips the members it does not read, unvalidated: check
    # passed a record `outbox dump` skips (review helper-48).
    with storage.read() as txn:
        row = bytes(txn.get(outbox.seq_key(1), db=storage.dbs.outbox))
    put_raw(storage, "outbox", outbox.seq_key(1), spoiled(row, b'web", "receivedAt'))  # the event's siteId
    problems = check(storage).problems
    assert len(problems) == 1 and problems[0].startswith("outbox seq 1 does not decode: 'utf-8' codec"), problems


def test_a_damaged_page_is_reported_and_the_rest_still_checked(tmp_path: Path) -> None:
    # helper-89: an MDB_CORRUPTED page ended `collector check` with one line and no report.
    opened = Storage(tmp_path / "data")
    add_key(opened, "acme")
    for batch in range(40):
        admit(opened, [f"e{batch * 25 + i:04d}" for i in range(25)])
    opened.close()
    data = bytearray((tmp_path / "data" / "data.mdb").read_bytes())
    page = 4096
    at = data.index(b'"eid": "e0500"') // page * page  # an outbox leaf page, mid-database
    assert data[at + 10] & 0x02  # (LMDB's page flags: P_LEAF)
    # Marked a meta page: "Located page was wrong type". (Some other damage trips an
    # assertion inside LMDB, which aborts the process: faulthandler names it on stderr.)
    data[at + 10 : at + 12] = b"\x10\x00"
    (tmp_path / "data" / "data.mdb").write_bytes(bytes(data))
    damaged = Storage(tmp_path / "data")
    try:
        report = check(damaged)
    finally:
        damaged.close()
    assert any(p.startswith("the outbox records are damaged: ") for p in report.problems), report.problems
    assert report.keys == 1  # (the passes after it ran, each in a transaction of its own)
