"""A stored record damaged on disk: the operator commands report it and carry on, never a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio

from storage.consent import consent_key
from storage.idempotency import ledger_key
from storage.outbox import NEXT_SEQ, seq_key
from storage.retention import RETAINED_FROM
from storage.visitors import visitor_key
from tests.conftest import BROWSER_KEY, RunningServer, pageview, start_server
from tests.e2e import test_signals_read as signals
from tests.helpers import rewrite_stored, run_cli

H = {"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com"}


async def committed(server: RunningServer, count: int) -> None:
    events = [pageview(f"e{n}") for n in range(count)]
    response = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert response.status_code == 202 and response.json()["accepted"] == count


def cli(*args: str, data_dir: Path) -> tuple[int, str, str]:
    result = run_cli(*args, data_dir=data_dir, check=False)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


async def test_check_and_dump_report_an_outbox_record_that_is_not_utf8(server: RunningServer) -> None:
    await committed(server, 4)
    # the auditor's damage: a byte of the client id replaced with 0xFF
    rewrite_stored(server.data_dir, "outbox", seq_key(2), spoil=b"acme")
    # and the stored event JSON of seq 3 (kept as bytes: decoding the record does not read it)
    rewrite_stored(server.data_dir, "outbox", seq_key(3), spoil=b"pageview")

    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 1
    problems = json.loads(out)["problems"]
    for seq in (2, 3):
        assert any(p.startswith(f"outbox seq {seq} does not decode: 'utf-8' codec") for p in problems), problems

    status, out, err = await trio.to_thread.run_sync(lambda: cli("outbox", "dump", data_dir=server.data_dir))
    assert status == 1
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 4]  # carries on past them
    lines = err.splitlines()
    assert len(lines) == 2
    for seq, line in zip((2, 3), lines, strict=True):
        assert line.startswith(f"collector: outbox seq {seq} does not decode, skipped: 'utf-8' codec")


async def test_check_refuses_an_outbox_mark_that_would_hide_lost_rows(server: RunningServer) -> None:
    await committed(server, 3)
    rewrite_stored(server.data_dir, "outbox", seq_key(2), value=b"")  # a row lost below the head
    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 1 and "outbox seq 2 does not decode" in out
    rewrite_stored(server.data_dir, "meta", RETAINED_FROM, value=(50).to_bytes(8, "big"))
    rewrite_stored(server.data_dir, "meta", NEXT_SEQ, value=b"\x00\x04")
    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    problems = json.loads(out)["problems"]
    # A mark past the head once excused every gap below it (helper-48).
    assert status == 1 and problems[:2] == [
        "meta outbox_next_seq is 2 bytes, not an 8-byte sequence number",
        "the outbox markers disagree: meta outbox_retained_from (50) is past outbox_next_seq (4); one of them is"
        " damaged, and gaps below the mark cannot be told from lost rows",
    ], problems


async def test_retention_steps_over_records_that_do_not_decode(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(
        nursery, tmp_path, outbox_retention_hours=1, idempotency_window_hours=24, retention_interval_s=0.2
    )
    await committed(server, 3)
    rewrite_stored(server.data_dir, "outbox", seq_key(2), spoil=b"acme")
    rewrite_stored(server.data_dir, "idempotency", ledger_key("acme", "e0"), spoil=b"rcpt_")
    server.clock.offset = 25 * 3600  # past both the outbox retention and the idempotency window
    for _ in range(50):
        if "collector_outbox_entries 1.0" in (await server.client.get("/metrics")).text:
            break
        await trio.sleep(0.2)
    else:
        raise AssertionError("retention did not remove the readable outbox records")
    metrics = (await server.client.get("/metrics")).text  # what an operator alerts on
    assert gauge(metrics, 'collector_retention_removed_total{kind="outbox"}') == 2
    assert gauge(metrics, 'collector_retention_removed_total{kind="idempotency"}') == 2
    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    report = json.loads(out)
    # what it could not read is kept, for check to report; the rest is gone
    assert (status, report["outbox_records"], report["idempotency_records"]) == (1, 1, 1)
    assert [p.split(":")[0] for p in report["problems"]] == [
        "outbox seq 2 does not decode",
        "idempotency record acme/e0 does not decode",
    ]


def gauge(metrics: str, name: str) -> float:
    [value] = [float(line.split(" ")[1]) for line in metrics.splitlines() if line.startswith(name + " ")]
    return value


async def test_a_visitor_record_that_does_not_decode_stops_no_one(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await signals.started(nursery, tmp_path)
    origin = signals.FREE_ORIGIN
    await signals.post(server, signals.FREE, [signals.event("a1", "pageview", "v1"),
                                              signals.event("a2", "pageview", "v2")], **origin)
    await signals.folded(server)
    rewrite_stored(server.data_dir, "visitors", visitor_key("acme", "web", "v1"), value=b"garbage")
    await signals.post(server, signals.FREE, [signals.event("b1", "click", "v1"),
                                              signals.event("b2", "click", "v2")], **origin)
    await signals.post(server, signals.FREE, [signals.event("c1", "scroll", "v2")], **origin)
    await signals.folded(server)  # the lag used to stay up, the catch-up failing every second
    metrics = (await server.client.get("/metrics")).text
    assert gauge(metrics, "collector_visitor_records_rebuilt") == 1
    assert gauge(metrics, "collector_visitor_fold_at_commit_skipped") == 0
    one = await signals.read(server, "v1", key=signals.FREE, **origin)
    assert one.status_code == 200, one.text  # it was 503
    assert one.json()["activity"]["events"] == 1 and one.json()["activity"]["clicks"] == 1  # started afresh
    two = await signals.read(server, "v2", key=signals.FREE, **origin)
    assert two.json()["activity"]["events"] == 3  # the other visitor keeps every event
    status, _, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 0  # the rebuilt record decodes


async def test_check_reports_visitor_records_and_cursors_and_a_read_sees_no_record(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await signals.started(nursery, tmp_path)
    origin = signals.FREE_ORIGIN
    await signals.post(server, signals.FREE, [signals.event("a1", "pageview", "v1")], **origin)
    await signals.folded(server)
    rewrite_stored(server.data_dir, "visitors", visitor_key("acme", "web", "v1"), value=b"garbage")
    rewrite_stored(server.data_dir, "cursors", b"visitors", value=(1 + 9999).to_bytes(8, "big"))

    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    report = json.loads(out)
    assert status == 1 and report["visitor_records"] == 1
    assert [p.split(":")[0] for p in report["problems"]] == [
        "visitor record acme/web/v1 does not decode",
        "cursor visitors is at seq 10000, past the outbox head 1",
    ]
    status, out, err = await trio.to_thread.run_sync(
        lambda: cli("visitors", "show", "v1", data_dir=server.data_dir)
    )
    assert (status, out) == (1, "")
    assert err.startswith("collector: visitor record acme/web/v1 does not decode, skipped:")
    # until a new event rebuilds it, the visitor reads as one the projection does not know (was: 503),
    # pending only while the fold is behind (helper-69 #1)
    snapshot = await signals.read(server, "v1", key=signals.FREE, **origin)
    assert snapshot.status_code == 200, snapshot.text
    assert (snapshot.json()["behavioralClass"], snapshot.json()["pending"]) == ("unknown", False)


async def test_a_consent_record_that_does_not_decode_counts_as_a_denial(server: RunningServer) -> None:
    decision = {"visitorId": "v1", "timestamp": pageview("x")["timestamp"],
                "consent": {"analytics": True, "identityResolution": True}}
    assert (await server.client.post("/v1/consent", json=decision, headers=H)).status_code == 202
    rewrite_stored(server.data_dir, "consent", consent_key("acme", "web", "v1"), value=b"garbage")

    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 1
    assert any(p.startswith("consent record acme/web/v1 does not decode") for p in json.loads(out)["problems"])
    # No identity value on a guess: the identify is dropped, not a 500.
    identify = pageview("id-1", type="identify", hem="a" * 64)
    body = (await server.client.post("/v1/events", json=identify, headers=H)).json()
    assert (body["accepted"], body["dropped"]) == (0, 1)
    # An old decision arriving late (an offline queue, a retry under a new id) cannot turn
    # the damage into a grant.
    late = {**decision, "_eid": "c-late", "timestamp": decision["timestamp"] - 60_000}
    assert (await server.client.post("/v1/consent", json=late, headers=H)).status_code == 202
    body = (await server.client.post("/v1/events", json=pageview("id-late", type="identify", hem="a" * 64),
                                     headers=H)).json()
    assert (body["accepted"], body["dropped"]) == (0, 1)
    # A new decision replaces the damaged record (not a 503 on every retry).
    fresh = {"visitorId": "v1", "_eid": "c-2", "consent": {"analytics": True, "identityResolution": True}}
    again = await server.client.post("/v1/consent", json=fresh, headers=H)
    assert again.status_code == 202, again.text
    body = (await server.client.post("/v1/events", json=pageview("id-2", type="identify", hem="a" * 64),
                                     headers=H)).json()
    assert body["accepted"] == 1
    status, _, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 0


async def test_an_idempotency_record_that_does_not_decode_refuses_nothing(server: RunningServer) -> None:
    await committed(server, 1)  # e0
    rewrite_stored(server.data_dir, "idempotency", ledger_key("acme", "e0"), value=b"garbage")
    status, out, _ = await trio.to_thread.run_sync(lambda: cli("check", data_dir=server.data_dir))
    assert status == 1 and any("e0" in p for p in json.loads(out)["problems"])
    # Not a 503 on every retry for the damaged id and every event beside it: taken as new.
    events = [pageview("e0"), pageview("e-next")]
    response = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert response.status_code == 202, response.text
    assert (response.json()["accepted"], response.json()["duplicates"]) == (2, 0)
    # and its record is whole again: the next retry is a duplicate
    again = await server.client.post("/v1/events", json={"events": events}, headers=H)
    assert again.json()["duplicates"] == 2


async def test_a_replay_chunk_that_does_not_decode_is_skipped_and_stored_afresh(server: RunningServer) -> None:
    # replay dump printed a traceback and none of the session; POST answered 503
    # for that chunk on every retry (found by audit helper-32).
    from storage.replay import chunk_key
    from tests.e2e.test_replay import chunk, send

    for seq in range(3):
        assert (await send(server, chunk(seq, session="rs"))).status_code == 202
    rewrite_stored(server.data_dir, "replay", chunk_key("acme", "web", "rs", 1), value=b"garbage")
    status, out, err = await trio.to_thread.run_sync(
        lambda: cli("replay", "dump", "--session", "rs", data_dir=server.data_dir))
    assert status == 1 and [json.loads(line)["seq"] for line in out.splitlines()] == [0, 2]
    assert err.count("\n") == 1 and "replay chunk acme/web/rs/1 does not decode" in err, err
    again = await send(server, chunk(1, session="rs"))
    assert again.status_code == 202 and again.json()["duplicate"] is False, again.text
    status, out, _ = await trio.to_thread.run_sync(
        lambda: cli("replay", "dump", "--session", "rs", data_dir=server.data_dir))
    assert status == 0 and [json.loads(line)["seq"] for line in out.splitlines()] == [0, 1, 2]


async def test_a_key_record_that_does_not_decode_is_skipped_by_the_listing_commands(server: RunningServer) -> None:
    # usage show and invoice printed a traceback (found by audit helper-32).
    await committed(server, 2)
    rewrite_stored(server.data_dir, "keys", b"cs_live_readonly0000", value=b"garbage")
    period = time.strftime("%Y-%m", time.gmtime(server.clock()))
    for argv in (["tenants", "list"], ["usage", "show", "--period", period], ["usage", "invoice", "--period", period]):
        status, out, err = await trio.to_thread.run_sync(lambda argv=argv: cli(*argv, data_dir=server.data_dir))
        assert status == 1 and out, (argv, status, out, err)
        assert err.count("\n") == 1 and "key record cs_live_read... does not decode" in err, (argv, err)
    status, out, _ = await trio.to_thread.run_sync(
        lambda: cli("usage", "show", "--period", period, data_dir=server.data_dir))
    assert any(json.loads(line)["account"] == "acme" and json.loads(line)["used"] == 2 for line in out.splitlines())
