"""Ids the spec allows at their longest still fit LMDB's 511-byte keys (through the real server).

The spec bounds ids by characters (128; the Idempotency-Key header 512), so
one in four-byte UTF-8 characters needs up to 2 KB. Each case posts such an
id, then proves the record it keys works: a replay is a duplicate, a changed
body a conflict, the visitor snapshot and its consent state are found.
"""

from __future__ import annotations

import trio

from tests.e2e.test_signals_read import PAID, PAID_ORIGIN, event, read, started

WIDE = "\U0001f600"  # four bytes in UTF-8
LONG_VISITOR = WIDE * 128
LONG_EID = WIDE * 128
LONG_HEADER_KEY = "k" * 512  # the longest the spec allows: with "/index" and the tenant, over 511 bytes


async def _post(server, events, **headers):  # type: ignore[no-untyped-def]
    return await server.client.post(
        "/v1/events", json={"events": events}, headers={"X-API-Key": PAID, **PAID_ORIGIN, **headers}
    )


async def test_a_long_event_id_is_deduplicated(nursery: trio.Nursery, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = await started(nursery, tmp_path)
    sent = event(LONG_EID, "pageview", "v-long-eid")
    first = await _post(server, [sent])
    assert first.status_code == 202, first.text
    assert first.json()["accepted"] == 1
    again = await _post(server, [sent])
    assert again.status_code == 202, again.text
    assert again.json()["duplicates"] == 1 and again.json()["accepted"] == 0
    changed = await _post(server, [{**sent, "page": {**sent["page"], "title": "other"}}])  # type: ignore[dict-item]
    assert changed.status_code == 409, changed.text
    assert changed.json()["error"] == "idempotency_conflict"


async def test_a_long_idempotency_key_header_is_deduplicated(nursery: trio.Nursery, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = await started(nursery, tmp_path)
    sent = event("unused", "pageview", "v-long-header")
    del sent["_eid"]
    first = await _post(server, [sent, {**sent, "type": "custom", "name": "x"}], **{"Idempotency-Key": LONG_HEADER_KEY})
    assert first.status_code == 202, first.text
    assert first.json()["accepted"] == 2
    again = await _post(server, [sent, {**sent, "type": "custom", "name": "x"}], **{"Idempotency-Key": LONG_HEADER_KEY})
    assert again.status_code == 202, again.text
    assert again.json()["duplicates"] == 2


async def test_a_long_visitor_id_has_a_snapshot_and_consent(nursery: trio.Nursery, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = await started(nursery, tmp_path)
    neighbour = event("plain-1", "pageview", "v-plain")
    posted = await _post(server, [event("long-1", "pageview", LONG_VISITOR), event("long-2", "click", LONG_VISITOR), neighbour])
    assert posted.status_code == 202, posted.text
    consent = event("long-c", "_consent_transition", LONG_VISITOR, consent={"analytics": True})
    consent.pop("page", None)
    assert (await _post(server, [consent])).status_code == 202
    body = (await read(server, LONG_VISITOR, key=PAID, **PAID_ORIGIN)).json()
    assert body["pending"] is False, body
    assert body["activity"]["pageviews"] == 1 and body["activity"]["clicks"] == 1, body
    plain = (await read(server, "v-plain", key=PAID, **PAID_ORIGIN)).json()
    assert plain["activity"]["pageviews"] == 1, plain
    metrics = (await server.client.get("/metrics")).text
    assert "collector_writer_requests_failed 0.0" in metrics, metrics
    assert "collector_visitor_fold_at_commit_skipped 0.0" in metrics, metrics


async def test_the_longest_tenant_ids_a_tenants_file_may_hold_fit_every_record(
    nursery: trio.Nursery, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    # tenants.MAX_NAME_BYTES: a clientId and siteId of 440 bytes together (the
    # clientId also the billing account), with the longest ids inside them.
    from tests.conftest import start_server

    client, site = WIDE * 105, "s" * 20  # 420 + 20 bytes
    key = "cs_live_longtenant0"
    tenants = {"keys": [{"key": key, "clientId": client, "plan": "paid",
                         "sites": [{"siteId": site, "domains": ["long.com"]}]}]}
    server = await start_server(nursery, tmp_path, tenants)
    headers = {"X-API-Key": key, "Origin": "https://long.com"}
    sent = [event(LONG_EID, "pageview", LONG_VISITOR), event("c", "click", LONG_VISITOR)]
    for expected in ("accepted", "duplicates"):
        posted = await server.client.post("/v1/events", json={"events": sent}, headers=headers)
        assert (posted.status_code, posted.json()[expected]) == (202, 2), posted.text
    consent = {"visitorId": LONG_VISITOR, "consent": {"analytics": True, "identityResolution": False}}
    assert (await server.client.post("/v1/consent", json=consent, headers=headers)).status_code == 202
    chunk = {"sessionId": LONG_VISITOR, "visitorId": LONG_VISITOR, "seq": 2**53 - 1, "events": [{"t": 1}]}
    replay = await server.client.post("/v1/replay", json=chunk, headers=headers)
    assert replay.status_code == 202, replay.text
    snapshot = await read(server, LONG_VISITOR, key=key, **{"Origin": "https://long.com"})
    assert snapshot.status_code == 200, snapshot.text
    metrics = (await server.client.get("/metrics")).text
    assert "collector_writer_requests_failed 0.0" in metrics
