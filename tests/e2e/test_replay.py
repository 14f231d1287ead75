"""POST /v1/replay through the real server: storage, idempotency, body rules and every gate."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.conftest import (
    BROWSER_KEY,
    MOBILE_KEY,
    SERVER_KEY,
    STAMP,
    RunningServer,
    pageview,
    start_server,
)
from tests.e2e.test_gates import EXPOSED
from tests.helpers import outbox_dump, run_cli

READONLY = "cs_live_readonly0000"
WRITER = "cs_live_writer000000"
SUSPENDED = "cs_live_suspended000"
MULTI = "cs_live_multi0000000"
SLOW = "cs_live_slow00000000"
STRICT = "cs_live_strict000000"
TENANTS = {
    "keys": [
        {"key": BROWSER_KEY, "clientId": "acme", "plan": "free", "rateLimit": 100,
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": MOBILE_KEY, "clientId": "acme", "plan": "free", "rateLimit": 50, "keyType": "mobile",
         "sites": [{"siteId": "app"}]},
        {"key": SERVER_KEY, "clientId": "acme", "plan": "free", "rateLimit": 50, "keyType": "server",
         "sites": [{"siteId": "backend"}]},
        {"key": READONLY, "clientId": "acme", "permissions": ["events:read"],
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": WRITER, "clientId": "acme", "permissions": ["events:read", "events:write"],
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": SUSPENDED, "clientId": "gone", "suspended": True,
         "sites": [{"siteId": "web", "domains": ["gone.com"]}]},
        {"key": MULTI, "clientId": "multi", "plan": "paid", "rateLimit": 100,
         "sites": [{"siteId": "main", "domains": ["multi.com"]},
                   {"siteId": "shop", "domains": ["shop.example.co.uk"]}]},
        {"key": SLOW, "clientId": "slow", "plan": "free", "rateLimit": 1,
         "sites": [{"siteId": "web", "domains": ["slow.com"]}]},
        {"key": STRICT, "clientId": "strict", "plan": "paid", "rateLimit": 100,
         "sites": [{"siteId": "web", "domains": ["strict.example"], "strictConsent": True}]},
    ]
}  # fmt: skip
ACME = {"Origin": "https://acme.com"}


def chunk(seq: int = 0, session: str = "s1", **overrides: object) -> dict[str, Any]:
    body: dict[str, Any] = {
        "visitorId": "v1",
        "sessionId": session,
        "seq": seq,
        "timestamp": STAMP,
        "events": [
            {"type": 4, "timestamp": STAMP, "data": {"href": "https://acme.com/", "width": 1280}},
            {"type": 2, "timestamp": STAMP + 1, "data": {"node": {"id": 1, "childNodes": []}}},
        ],
    }
    body.update(overrides)
    return body


async def send(
    server: RunningServer,
    body: dict[str, Any] | None = None,
    *,
    key: str | None = BROWSER_KEY,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
    path: str = "/v1/replay",
) -> httpx.Response:
    sent = dict(ACME if headers is None else headers)
    if key is not None:
        sent["X-API-Key"] = key
    if content is None:
        content = json.dumps(chunk() if body is None else body).encode()
        sent.setdefault("Content-Type", "application/json")
    return await server.client.post(path, content=content, headers=sent)


async def replay_dump(server: RunningServer, *args: str) -> list[dict[str, Any]]:
    result = await trio.to_thread.run_sync(
        lambda: run_cli("replay", "dump", *args, data_dir=server.data_dir)
    )
    return [json.loads(line) for line in result.stdout.splitlines() if line]


async def serve(nursery: trio.Nursery, tmp_path: Path, **overrides: object) -> RunningServer:
    return await start_server(nursery, tmp_path, TENANTS, **overrides)


def refused_with(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"] == code, body
    return body


async def test_chunks_are_stored_and_dumped_in_seq_order(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await serve(nursery, tmp_path)
    responses = [await send(server, chunk(seq)) for seq in (1, 0)]
    for seq, response in zip((1, 0), responses, strict=True):
        assert response.status_code == 202, response.text
        body = response.json()
        assert set(body) == {
            "success",
            "accepted",
            "duplicate",
            "sessionId",
            "seq",
            "receiptId",
            "timestamp",
        }
        assert (body["success"], body["accepted"], body["duplicate"]) == (True, 1, False)
        assert (body["sessionId"], body["seq"]) == ("s1", seq)
        assert body["receiptId"].startswith("rply_")
    assert responses[0].headers["X-RateLimit-Scope"] == "ingest"
    assert "X-Service-Billing-Mode" not in responses[0].headers  # replay draws on no unit

    rows = await replay_dump(server, "--session", "s1")
    assert [row["seq"] for row in rows] == [0, 1]
    first = rows[0]
    assert {k: first[k] for k in ("clientId", "siteId", "sessionId", "visitorId", "timestamp")} == {
        "clientId": "acme", "siteId": "web", "sessionId": "s1", "visitorId": "v1", "timestamp": STAMP,
    }  # fmt: skip
    assert first["receiptId"] == responses[1].json()["receiptId"]
    assert first["events"] == chunk()["events"]
    assert isinstance(first["receivedAt"], int)
    assert await replay_dump(server, "--session", "s1", "--client", "acme") == rows
    assert await replay_dump(server, "--session", "s1", "--client", "other") == []
    assert await replay_dump(server, "--session", "nope") == []
    assert await outbox_dump(server.data_dir) == []  # replay never enters the event outbox
    usage = await trio.to_thread.run_sync(
        lambda: run_cli("usage", "show", "--account", "acme", data_dir=server.data_dir)
    )
    rows_used = [json.loads(line)["used"] for line in usage.stdout.splitlines()]
    assert rows_used == [0, 0]  # and counts toward no monthly unit
    report = await trio.to_thread.run_sync(lambda: run_cli("check", data_dir=server.data_dir))
    assert json.loads(report.stdout)["replay_chunks"] == 2


async def test_duplicate_and_conflict(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    first = (await send(server)).json()
    again = await send(server, chunk(timestamp=STAMP + 9000))  # a retry, sent later
    assert again.status_code == 202
    assert again.json() | {"timestamp": 0} == first | {
        "accepted": 0,
        "duplicate": True,
        "timestamp": 0,
    }
    reordered = json.dumps(dict(reversed(list(chunk().items()))), indent=1).encode()
    assert (await send(server, content=reordered, headers=ACME)).json()["duplicate"] is True
    conflict = await send(server, chunk(events=[{"type": 3, "data": {"source": 1}}]))
    body = refused_with(conflict, 409, "idempotency_conflict")
    assert (body["sessionId"], body["seq"]) == ("s1", 0)
    other_visitor = await send(server, chunk(visitorId="v2"))
    refused_with(other_visitor, 409, "idempotency_conflict")
    [stored] = await replay_dump(server, "--session", "s1")
    assert stored["events"] == chunk()["events"] and stored["visitorId"] == "v1"


async def test_a_wild_send_time_is_dropped_not_a_storage_error(nursery: trio.Nursery, tmp_path: Path) -> None:
    # 10**20 does not fit the 64-bit integers the chunk record stores: it was a
    # 503 (retried by SDKs forever) and a writer traceback; now, as on /v1/events,
    # a send time a JavaScript consumer cannot read exactly is dropped.
    server = await serve(nursery, tmp_path)
    for seq, wild in enumerate((10**20, -(10**19), -1, 1e300)):
        response = await send(server, chunk(seq, timestamp=wild))
        assert response.status_code == 202, response.text
    stored = await replay_dump(server, "--session", "s1")
    assert [row["timestamp"] for row in stored] == [None, None, None, None]
    kept = await send(server, chunk(9, timestamp=STAMP))
    assert kept.status_code == 202
    assert (await replay_dump(server, "--session", "s1"))[-1]["timestamp"] == STAMP


async def test_gzip_bodies_and_size_caps(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    packed = gzip.compress(json.dumps(chunk(3)).encode())
    headers = {**ACME, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert (await send(server, content=packed, headers=headers)).status_code == 202
    wrong_type = await send(
        server,
        content=packed,
        headers={**ACME, "Content-Encoding": "gzip", "Content-Type": "text/plain"},
    )
    assert wrong_type.status_code == 400
    assert wrong_type.json() == {"error": "Content-Type must be application/json"}
    records = [{"type": 3, "data": {"text": "x" * 1000}} for _ in range(1100)]  # ~1.1 MB decoded
    refused_with(await send(server, chunk(4, events=records)), 413, "payload_too_large")
    bomb = gzip.compress(b'{"visitorId": "' + b" " * (11 * 1024 * 1024) + b'"}')
    refused_with(await send(server, content=bomb, headers=headers), 413, "payload_too_large")
    assert [row["seq"] for row in await replay_dump(server, "--session", "s1")] == [3]


async def test_send_beacon_with_key_in_query(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    for seq, content_type in enumerate(("text/plain;charset=UTF-8", None)):
        headers = dict(ACME)
        if content_type:
            headers["Content-Type"] = content_type
        response = await send(
            server,
            key=None,
            path=f"/v1/replay?key={BROWSER_KEY}",
            headers=headers,
            content=json.dumps(chunk(seq)).encode(),
        )
        assert response.status_code == 202, response.text
    assert len(await replay_dump(server, "--session", "s1")) == 2


async def test_key_gate_errors(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    refused_with(await send(server, key=None), 401, "missing_api_key")
    refused_with(await send(server, key="cs_live_unknown00000"), 401, "invalid_api_key")
    refused_with(
        await send(server, key=SUSPENDED, headers={"Origin": "https://gone.com"}),
        403,
        "account_suspended",
    )
    refused_with(await send(server, key=READONLY), 403, "insufficient_permission")
    assert (await send(server, chunk(1), key=WRITER)).status_code == 202
    for key in (MOBILE_KEY, SERVER_KEY):
        body = refused_with(await send(server, key=key), 403, "key_type_not_allowed")
        assert body["keyType"] in ("mobile", "server")
    wrong_method = await server.client.get("/v1/replay", headers={"X-API-Key": BROWSER_KEY})
    refused_with(wrong_method, 405, "method_not_allowed")
    assert [row["seq"] for row in await replay_dump(server, "--session", "s1")] == [1]


async def test_domain_gate_and_site_scope(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    refused_with(await send(server, headers={}), 403, "origin_required")
    refused_with(await send(server, headers={"Origin": "null"}), 403, "origin_required")
    evil = await send(server, headers={"Origin": "https://evilacme.com"})
    refused_with(evil, 403, "domain_not_allowed")
    passing = [
        {"Referer": "https://www.acme.com/checkout/step-2?x=y"},
        {"Origin": "http://[::1]:3000"},
        {"Origin": "http://localhost:5173"},
        {"Origin": "https://shop.acme.com"},
    ]
    for seq, headers in enumerate(passing):
        response = await send(server, chunk(seq), headers=headers)
        assert response.status_code == 202, (headers, response.text)
    ambiguous = await send(
        server, chunk(session="m"), key=MULTI, headers={"Origin": "http://localhost"}
    )
    refused_with(ambiguous, 403, "site_scope_ambiguous")
    for seq, origin in enumerate(("https://multi.com", "https://example.co.uk")):
        response = await send(
            server, chunk(seq, session="m"), key=MULTI, headers={"Origin": origin}
        )
        assert response.status_code == 202, response.text
    assert len(await replay_dump(server, "--session", "s1")) == len(passing)
    rows = await replay_dump(server, "--session", "m", "--client", "multi")
    assert [(row["siteId"], row["seq"]) for row in rows] == [("main", 0), ("shop", 1)]


async def test_rate_bucket_is_shared_with_events(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    server.clock.fixed = 1_800_000_000.0  # the start of a minute window
    slow = {"Origin": "https://slow.com"}
    for n in range(20):
        event = await server.client.post(
            "/v1/events", json=pageview(f"e{n}"), headers={"X-API-Key": SLOW, **slow}
        )
        assert event.status_code == 202, event.text
    for seq in range(100):  # the burst bucket holds 120
        assert (await send(server, chunk(seq), key=SLOW, headers=slow)).status_code == 202
    last = await send(server, chunk(100), key=SLOW, headers=slow)
    body = refused_with(last, 429, "rate_limit_exceeded")
    assert body["retryAfter"] == 60 and last.headers["Retry-After"] == "60"
    assert last.headers["X-RateLimit-Remaining"] == "0"
    assert last.headers["X-RateLimit-Burst-Remaining"] == "0"
    assert last.headers["X-RateLimit-Policy"] == "60;w=60;burst=2"
    assert last.headers["X-RateLimit-Scope"] == "ingest"
    assert len(await replay_dump(server, "--session", "s1", "--client", "slow")) == 100
    server.clock.fixed += 60
    assert (await send(server, chunk(100), key=SLOW, headers=slow)).status_code == 202


async def test_cors_and_preflight(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    preflight = await server.client.options(
        "/v1/replay",
        headers={"Origin": "https://acme.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type,content-encoding,x-api-key"},
    )  # fmt: skip
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    allowed = set(preflight.headers["Access-Control-Allow-Headers"].lower().split(", "))
    assert {"content-type", "content-encoding", "x-api-key"} <= allowed
    refused = await server.client.options(
        f"/v1/replay?key={BROWSER_KEY}", headers={"Origin": "https://evilacme.com"}
    )
    refused_with(refused, 403, "domain_not_allowed")
    assert "Access-Control-Allow-Methods" not in refused.headers
    response = await send(server)
    assert response.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    exposed = {
        h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")
    }
    assert exposed == EXPOSED
    denied = await send(server, headers={"Origin": "https://evilacme.com"})
    assert (
        denied.headers["Access-Control-Allow-Origin"] == "https://evilacme.com"
    )  # readable refusal


async def test_body_refusals_store_nothing(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path)
    card = chunk(events=[{"type": 3, "data": {"source": 5, "text": "4111-1111-1111-1111"}}])
    body = refused_with(await send(server, card), 400, "prohibited_payment_data")
    assert "nothing was stored" in body["message"]
    field = chunk(events=[{"type": 3, "data": {"card_number": "x"}}])
    refused_with(await send(server, field), 400, "prohibited_payment_data")
    # typed with a Japanese input method: full-width digits (helper-128: stored)
    wide = chunk(events=[{"type": 3, "data": {"source": 5, "text": "\uff14" + "\uff11" * 15}}])
    refused_with(await send(server, wide), 400, "prohibited_payment_data")
    refused_with(
        await send(server, content=b'{"visitorId": "v1",', headers=ACME), 400, "invalid_json"
    )
    invalid = refused_with(await send(server, chunk(seq=-1)), 400, "validation_error")
    assert invalid["details"] == [{"path": "$.seq", "message": "Expected `int` >= 0"}]
    refused_with(await send(server, chunk(events=[])), 400, "validation_error")
    assert await replay_dump(server, "--session", "s1") == []


async def test_retention_sweeps_old_chunks(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await serve(nursery, tmp_path, replay_retention_hours=1, retention_interval_s=0.2)
    assert (await send(server)).status_code == 202
    assert len(await replay_dump(server, "--session", "s1")) == 1
    server.clock.offset = 2 * 3600  # two hours later: the next sweep (every 0.2 s) removes it
    for _ in range(50):
        if not await replay_dump(server, "--session", "s1"):
            break
        await trio.sleep(0.2)
    else:
        raise AssertionError("the retention sweep did not remove the expired chunk")


async def test_a_session_id_of_the_full_length_is_stored_and_found(nursery: trio.Nursery, tmp_path: Path) -> None:
    # 128 characters of four bytes each: over LMDB's 511-byte keys until digested
    session = "\U0001f600" * 128
    server = await serve(nursery, tmp_path)
    first = await send(server, chunk(0, session=session))
    assert first.status_code == 202, first.text
    assert first.json()["sessionId"] == session
    assert (await send(server, chunk(1, session=session))).status_code == 202
    assert (await send(server, chunk(0, session=session))).json()["duplicate"] is True
    refused_with(await send(server, chunk(0, session=session, visitorId="v2")), 409, "idempotency_conflict")
    rows = await replay_dump(server, "--session", session)
    assert [(row["sessionId"], row["seq"]) for row in rows] == [(session, 0), (session, 1)]
    report = await trio.to_thread.run_sync(lambda: run_cli("check", data_dir=server.data_dir))
    assert json.loads(report.stdout)["replay_chunks"] == 2 and json.loads(report.stdout)["problems"] == []


async def test_a_strict_consent_property_records_no_session_without_analytics_consent(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 4.1 rule 9 drops a strict property's events without analytics consent;
    # its replay chunks were stored all the same, a recording of the session (helper-68).
    server = await serve(nursery, tmp_path)
    origin = {"Origin": "https://strict.example"}
    answers = {}
    for seq, consent in enumerate((None, {"analytics": False}, {"analytics": True})):
        body = chunk(seq, session="strict-s") | ({} if consent is None else {"consent": consent})
        response = await send(server, body, key=STRICT, headers=origin)
        assert response.status_code == 202, response.text
        answers[seq] = response.json()
    assert {k: answers[0][k] for k in ("accepted", "duplicate", "dropped", "receiptId")} == {
        "accepted": 0, "duplicate": False, "dropped": "consent_missing", "receiptId": None}
    assert answers[1]["dropped"] == "consent_denied" and answers[1]["accepted"] == 0
    assert answers[2]["accepted"] == 1 and "dropped" not in answers[2]
    assert [c["seq"] for c in await replay_dump(server, "--session", "strict-s", "--client", "strict")] == [2]
    # A stored chunk resent without consent is still its duplicate, and other content a 409:
    # it answered "dropped, not stored" for a chunk that was stored (helper-71).
    resent = await send(server, chunk(2, session="strict-s"), key=STRICT, headers=origin)
    assert resent.json() | {"timestamp": 0} == answers[2] | {"accepted": 0, "duplicate": True, "timestamp": 0}
    other = chunk(2, session="strict-s", events=[{"type": 3, "data": {}}])
    refused_with(await send(server, other, key=STRICT, headers=origin), 409, "idempotency_conflict")
    # A property without strict consent records the chunk whatever it says, as events.
    assert (await send(server, chunk(9, consent={"analytics": False}))).json()["accepted"] == 1
    bad = await send(server, chunk(10, consent={"analytics": "yes"}))
    assert refused_with(bad, 400, "validation_error")["details"][0]["path"] == "$.consent.analytics"


async def test_a_chunk_consent_keeps_out_is_not_sent_back_for_a_retry_by_storage_trouble(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # It went through the writer to look for a stored twin, and storage trouble
    # answered 503 "retry the chunk" for a chunk that would never be stored (helper-72).
    server = await serve(nursery, tmp_path)
    origin = {"Origin": "https://strict.example"}
    (server.data_dir / "data.mdb").unlink()
    kept_out = await send(server, chunk(0, session="gone"), key=STRICT, headers=origin)
    assert (kept_out.status_code, kept_out.json()["dropped"]) == (202, "consent_missing"), kept_out.text
    consented = await send(server, chunk(1, session="gone", consent={"analytics": True}), key=STRICT, headers=origin)
    refused_with(consented, 503, "storage_unavailable")


async def test_a_chunk_with_a_string_cut_inside_an_emoji_is_stored(server: RunningServer) -> None:
    # DOM text cut by the recorder inside a surrogate pair refused the chunk as invalid_json.
    body = chunk(events=[{"type": 3, "timestamp": STAMP, "data": {"text": "Sale \ud83d"}}])
    response = await send(server, content=json.dumps(body).encode())
    assert response.status_code == 202, response.text


async def test_replay_dump_and_visitors_show_lines_survive_unicode_line_splitting(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-107: U+2028, U+2029 and U+0085, which JSON lets stand raw in a string, were
    # written raw by `replay dump` (page text recorded as sent) and `visitors show`: a
    # reader splitting lines the Unicode way, as str.splitlines does, cut a record in two.
    server = await serve(nursery, tmp_path)
    visitor, text = "v\u2028x", "line\u2028sep\u0085nel\u2029p"
    recorded = chunk(session="s-lines", visitorId=visitor, events=[{"type": 3, "timestamp": STAMP, "t": text}])
    assert (await send(server, recorded)).status_code == 202
    rows = await replay_dump(server, "--session", "s-lines")  # (split with str.splitlines)
    assert [(row["visitorId"], row["events"][0]["t"]) for row in rows] == [(visitor, text)]
    stored = await send(server, pageview("lines-1", visitorId=visitor), path="/v1/events")
    assert stored.status_code == 202, stored.text
    shown = await trio.to_thread.run_sync(
        lambda: run_cli("visitors", "show", visitor, "--client", "acme", data_dir=server.data_dir))
    lines = shown.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["visitorId"] == visitor, shown.stdout
