"""POST /v1/events end to end: counts, storage, idempotency, errors (spec 4.1, 2.5, 7.2)."""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from collector.ingest.content_hash import unkeyed_event_hashes
from collector.ingest.model import IngestContext
from collector.ingest.pipeline import prepare_batch
from storage import idempotency
from tests.conftest import (
    BROWSER_KEY,
    MOBILE_KEY,
    MovableClock,
    RunningServer,
    click,
    pageview,
    start_server,
)
from tests.helpers import outbox_dump, read_stored, rewrite_stored, run_cli

H = {"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com", "Content-Type": "application/json"}


async def post(server: RunningServer, body: object, headers: dict[str, str] | None = None, raw: bytes | None = None):
    content = raw if raw is not None else json.dumps(body).encode()
    return await server.client.post("/v1/events", content=content, headers=headers or H)


async def test_batch_is_accepted_stored_and_counted(server: RunningServer) -> None:
    events = [pageview("e1"), click("e2"), pageview("e3")]
    response = await post(server, {"events": events})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["success"] is True
    assert (body["accepted"], body["duplicates"], body["received"]) == (3, 0, 3)
    assert (body["dropped"], body["rejected"], body["errors"]) == (0, 0, [])
    assert body["delivery"] == "durable_outbox"
    assert len(body["receiptIds"]) == 3 and len(set(body["receiptIds"])) == 3
    assert body["ledgerKeys"] == ["acme/e1", "acme/e2", "acme/e3"]
    assert body["billing"]["monthlyPageviews"]["used"] == 2
    stored = await outbox_dump(server.data_dir)
    assert [row["eid"] for row in stored] == ["e1", "e2", "e3"]
    assert {row["clientId"] for row in stored} == {"acme"}
    assert {row["siteId"] for row in stored} == {"web"}
    assert [row["receiptId"] for row in stored] == body["receiptIds"]
    assert stored[1]["event"]["element"]["selector"] == "button.buy"


async def test_single_event_body(server: RunningServer) -> None:
    response = await post(server, pageview("solo"))
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == 1


async def test_exact_replay_is_a_duplicate_and_stored_once(server: RunningServer) -> None:
    first = await post(server, {"events": [pageview("r1"), click("r2")]})
    again = await post(server, {"events": [pageview("r1"), click("r2")]})
    assert again.status_code == 202
    body = again.json()
    assert (body["accepted"], body["duplicates"]) == (0, 2)
    assert body["receiptIds"] == first.json()["receiptIds"]
    assert body["billing"]["monthlyPageviews"]["used"] == 1
    assert len(await outbox_dump(server.data_dir)) == 2


async def test_reused_id_with_other_content_is_a_conflict(server: RunningServer) -> None:
    await post(server, pageview("c1"))
    response = await post(server, {"events": [pageview("c2"), pageview("c1", visitorId="other")]})
    assert response.status_code == 409
    assert response.json()["error"] == "idempotency_conflict"
    assert "c1" in response.json()["message"]
    assert (response.json()["eid"], response.json()["index"]) == ("c1", 1)  # which event, for the SDK
    stored = await outbox_dump(server.data_dir)
    assert [row["eid"] for row in stored] == ["c1"]  # c2 was not half-stored


async def test_an_event_id_sent_to_two_sites_of_a_tenant_is_a_conflict_not_a_duplicate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-101: the second site got "duplicate" with the first site's receipt, and the
    # event was stored for it nowhere (the consent route already said 409: helper-88).
    tenants = {"keys": [{"key": "cs_live_twosites00", "clientId": "two", "plan": "paid", "sites": [
        {"siteId": "web", "domains": ["two.com"]}, {"siteId": "shop", "domains": ["twoshop.net"]}]}]}
    server = await start_server(nursery, tmp_path, tenants)
    event = pageview("xs-1", type="custom", name="n")

    async def send(origin: str) -> httpx.Response:
        return await server.client.post(
            "/v1/events", json=event, headers={"X-API-Key": "cs_live_twosites00", "Origin": origin})

    assert (await send("https://two.com")).status_code == 202
    assert (await send("https://two.com")).json()["duplicates"] == 1  # a retry from its own site
    other = await send("https://twoshop.net")
    assert (other.status_code, other.json()["error"], other.json()["index"]) == (409, "idempotency_conflict", 0)
    assert "another of this tenant's sites" in other.json()["message"]
    assert [(row["eid"], row["siteId"]) for row in await outbox_dump(server.data_dir)] == [("xs-1", "web")]


async def test_the_cross_site_check_reads_the_receipts_of_a_restored_node(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # A restored directory gets a new node id; its old receipts were once taken as
    # another node's and never checked (helper-103).
    tenants = {"keys": [{"key": "cs_live_twosites00", "clientId": "two", "plan": "paid", "sites": [
        {"siteId": "web", "domains": ["two.com"]}, {"siteId": "shop", "domains": ["twoshop.net"]}]}]}
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    first = await start_server(nursery, tmp_path / "first", tenants)
    event = pageview("rs-1", type="custom", name="n")

    async def send(server: RunningServer, origin: str) -> httpx.Response:
        return await server.client.post(
            "/v1/events", json=event, headers={"X-API-Key": "cs_live_twosites00", "Origin": origin})

    stored = await send(first, "https://two.com")
    assert stored.status_code == 202
    backup = tmp_path / "backup"
    await trio.to_thread.run_sync(lambda: run_cli("backup", "--with-field-keys", str(backup), data_dir=first.data_dir))
    restored = tmp_path / "restored"
    said = await trio.to_thread.run_sync(lambda: run_cli("restore", str(backup), data_dir=restored))
    assert json.loads(said.stdout)["restoredNodeId"] not in stored.json()["receiptIds"][0]

    second = await start_server(nursery, tmp_path / "second", tenants, data_dir=str(restored))
    retry = await send(second, "https://two.com")
    assert (retry.status_code, retry.json()["duplicates"]) == (202, 1)
    assert retry.json()["receiptIds"] == stored.json()["receiptIds"]
    other = await send(second, "https://twoshop.net")
    assert (other.status_code, other.json()["error"]) == (409, "idempotency_conflict")
    assert "another of this tenant's sites" in other.json()["message"]


async def test_conflict_inside_one_batch(server: RunningServer) -> None:
    response = await post(server, {"events": [pageview("d1"), pageview("d1", visitorId="x")]})
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["eid"], response.json()["index"]) == (
        "idempotency_conflict", "d1", 1)
    assert await outbox_dump(server.data_dir) == []


async def test_same_id_twice_in_one_batch_is_one_event(server: RunningServer) -> None:
    response = await post(server, {"events": [pageview("t1"), pageview("t1")]})
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["duplicates"]) == (1, 1)
    assert body["receiptIds"][0] == body["receiptIds"][1]


async def test_idempotency_required_in_production(server: RunningServer) -> None:
    event = pageview("x")
    del event["_eid"]
    response = await post(server, {"events": [pageview("ok"), event]})
    assert response.status_code == 400
    assert (response.json()["error"], response.json()["indexes"]) == ("idempotency_required", [1])
    assert await outbox_dump(server.data_dir) == []


async def test_idempotency_key_header_names_the_events(server: RunningServer) -> None:
    a, b = pageview("x"), click("y")
    del a["_eid"], b["_eid"]
    headers = {**H, "Idempotency-Key": "batch-42"}
    first = await post(server, {"events": [a, b]}, headers)
    assert first.status_code == 202, first.text
    assert first.json()["ledgerKeys"] == ["acme/batch-42/0", "acme/batch-42/1"]
    again = await post(server, {"events": [a, b]}, headers)
    assert again.json()["duplicates"] == 2


async def test_a_single_valued_header_sent_twice_alike_counts_once(server: RunningServer) -> None:
    # helper-78: joined as "k1, k1", the id was another event than its retry's.
    bare = {k: v for k, v in pageview("x").items() if k != "_eid"}
    twice = [("X-API-Key", BROWSER_KEY), ("X-API-Key", BROWSER_KEY), ("Origin", "https://acme.com"),
             ("Origin", "https://acme.com"), ("Idempotency-Key", "k1"), ("Idempotency-Key", "k1"),
             ("Content-Type", "application/json")]
    first = await server.client.post("/v1/events", content=json.dumps(bare), headers=twice)
    assert (first.status_code, first.json()["ledgerKeys"]) == (202, ["acme/k1/0"]), first.text
    assert first.headers["access-control-allow-origin"] == "https://acme.com"
    once = await post(server, bare, headers={**H, "Idempotency-Key": "k1"})
    assert once.json()["duplicates"] == 1, once.text
    # Two different values are still two: refused as no such key.
    other = [("X-API-Key", BROWSER_KEY), ("X-API-Key", "cs_live_other000000000"), ("Origin", "https://acme.com")]
    refused = await server.client.post("/v1/events", json=pageview("y"), headers=other)
    assert refused.status_code == 401, refused.text


async def test_idempotency_key_over_512_chars(server: RunningServer) -> None:
    response = await post(server, pageview("k"), {**H, "Idempotency-Key": "k" * 513})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_idempotency_key"


async def test_development_mints_ids(dev_server: RunningServer) -> None:
    event = pageview("x")
    del event["_eid"]
    for _ in range(2):  # the same content twice: a random id each, so two events (README)
        response = await dev_server.client.post("/v1/events", json=event, headers=H)
        assert response.status_code == 202, response.text
        assert response.json()["accepted"] == 1
    minted = [row["eid"] for row in await outbox_dump(dev_server.data_dir)]
    assert len(set(minted)) == 2 and all(re.fullmatch(r"dev_[0-9a-f]{32}", eid) for eid in minted), minted


async def test_invalid_json_and_invalid_utf8(server: RunningServer) -> None:
    for raw in (b"{not json", b'{"type": "pageview", "visitorId": "\xff\xfe"}', b""):
        response = await post(server, None, raw=raw)
        assert response.status_code == 400, raw
        assert response.json()["error"] == "invalid_json"


async def test_translated_routes_refuse_invalid_utf8_cleanly(server: RunningServer) -> None:
    # msgspec raises UnicodeDecodeError, not DecodeError, for bad UTF-8 inside a string.
    for path in ("/v1/edge/pageview", "/v1/consent"):
        for raw in (b'{"visitorId": "\xff\xfe", "url": "https://acme.com/"}', b"[" * 10_000):
            response = await server.client.post(path, content=raw, headers={**H, "Content-Type": "application/json"})
            assert (response.status_code, response.json()["error"]) == (400, "invalid_json"), (path, raw[:20])


async def test_deeply_nested_body_is_refused_cleanly(server: RunningServer) -> None:
    raw = b'{"events": [' + b"[" * 10_000 + b"]" * 10_000 + b"]}"
    response = await post(server, None, raw=raw)
    assert (response.status_code, response.json()["error"]) == (400, "invalid_json"), response.text


async def test_single_invalid_event_has_details(server: RunningServer) -> None:
    response = await post(server, pageview("v", page={"url": "ftp://acme.com/x", "path": "/", "title": "t"}))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "validation_error"
    assert any("page.url" in d["path"] for d in body["details"])


async def test_all_failed_batch_has_per_index_errors(server: RunningServer) -> None:
    bad = pageview("b1", visitorId="v" * 129)
    worse = pageview("b2", device={"userAgent": "x" * 513, "viewport": {"width": 1, "height": 1}})
    response = await post(server, {"events": [bad, worse]})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert [e["index"] for e in errors] == [0, 1]
    assert {e["error"] for e in errors} == {"validation_error"}  # the entries of a 202's errors
    assert await outbox_dump(server.data_dir) == []


async def test_a_wild_client_clock_is_overridden_and_kept_only_when_readable(server: RunningServer) -> None:
    stamps = (-1, 2**53, 2**53 + 1, 10**300, 1e300)
    response = await post(server, {"events": [pageview(f"ts{i}", timestamp=ts) for i, ts in enumerate(stamps)]})
    assert response.json()["accepted"] == len(stamps), response.text
    stored = {row["eid"]: row["event"] for row in await outbox_dump(server.data_dir)}
    assert [stored[f"ts{i}"].get("clientTimestamp") for i in range(len(stamps))] == [None, 2**53, None, None, None]
    assert all(abs(event["timestamp"] - response.json()["timestamp"]) < 5000 for event in stored.values())


async def test_a_web_path_is_a_pathname_a_native_one_a_free_string(server: RunningServer) -> None:
    response = await post(server, pageview("np", page={"url": "https://acme.com/x", "path": "x", "title": "X"}))
    assert response.status_code == 400
    assert response.json()["details"] == [
        {"path": "$.page.path", "message": "page.path must be a pathname (starting with /) for web events"}]
    from tests.conftest import MOBILE_KEY

    native = pageview("nn", page={"path": "HomeScreen", "title": "Home"}, device={})
    assert (await post(server, native, headers={"X-API-Key": MOBILE_KEY})).status_code == 202


async def test_partly_failed_batch_is_202_with_errors(server: RunningServer) -> None:
    response = await post(server, {"events": [pageview("p1"), pageview("p2", timestamp="soon")]})
    assert response.status_code == 202
    body = response.json()
    assert (body["accepted"], body["rejected"], body["received"]) == (1, 1, 2)
    assert body["errors"][0]["index"] == 1
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["p1"]


async def test_batch_size_limits(server: RunningServer) -> None:
    for events in ([], [pageview(f"n{i}") for i in range(26)]):
        response = await post(server, {"events": events})
        assert response.status_code == 400
        assert response.json()["error"] == "validation_error"
    response = await post(server, {"events": [pageview(f"m{i}") for i in range(25)]})
    assert response.status_code == 202
    assert response.json()["accepted"] == 25


async def test_truncation_of_long_page_fields(server: RunningServer) -> None:
    url = "https://acme.com/" + "a" * 3000
    event = pageview("long", page={"url": url, "path": "/" + "p" * 3000, "title": "t" * 600})
    response = await post(server, event)
    assert response.status_code == 202, response.text
    stored = (await outbox_dump(server.data_dir))[0]["event"]
    assert len(stored["page"]["url"]) == 2048
    assert len(stored["page"]["path"]) == 2048
    assert len(stored["page"]["title"]) == 512


async def test_timestamp_skew_is_overridden(server: RunningServer) -> None:
    response = await post(server, pageview("old", timestamp=1_000_000_000_000))
    assert response.status_code == 202
    event = (await outbox_dump(server.data_dir))[0]["event"]
    assert event["clientTimestamp"] == 1_000_000_000_000
    assert abs(event["timestamp"] - response.json()["timestamp"]) < 1000


async def test_payment_data_refuses_the_whole_request(server: RunningServer) -> None:
    leaky = pageview("pay2", type="custom", name="checkout", label="card 4111 1111 1111 1111")
    response = await post(server, {"events": [pageview("pay1"), leaky]})
    assert response.status_code == 400
    assert response.json()["error"] == "prohibited_payment_data"
    assert response.json()["index"] == 1  # which event, so an SDK can drop it and resend the rest (helper-94)
    assert await outbox_dump(server.data_dir) == []
    # never a wrong index (helper-98): a card behind a repeated key in event 0 named event 2
    first = json.dumps(pageview("r0", type="custom", name="n", label="ok"))
    first = first.replace('"label": "ok"', '"label": "4111 1111 1111 1111", "label": "ok"')
    assert first.count('"label"') == 2
    raw = ('{"events": [' + first + ", " + json.dumps(pageview("r1")) + ", " + json.dumps(leaky) + "]}").encode()
    response = await post(server, None, raw=raw)
    assert (response.status_code, response.json()["error"], response.json().get("index")) == (
        400, "prohibited_payment_data", 0), response.text
    # and none for a body that is not a batch, whatever it holds under "events"
    for path, body in (("/v1/events", {**pageview("one"), "events": [{"a": 1}, {"b": "4111 1111 1111 1111"}]}),
                       ("/v1/edge/pageview", {"visitorId": "v", "sessionId": "s", "url": "https://acme.com/",
                                              "events": [{"a": 1}, {"b": "4111 1111 1111 1111"}]})):
        response = await server.client.post(path, json=body, headers=H)
        assert response.json()["error"] == "prohibited_payment_data" and "index" not in response.json(), (
            path, response.text)


async def test_payment_data_behind_a_repeated_key_refuses_the_request(server: RunningServer) -> None:
    # The decoders keep a repeated key's last value; a card (or card field) in
    # an earlier one was accepted with 202 (found by audit helper-30).
    def body(eid: str, members: str, kind: str = "custom", extra: str = '"name":"x"') -> bytes:
        event = json.dumps(pageview(eid, type=kind))[:-1]
        return f'{event},{extra},{members}}}'.encode()

    hidden = [
        body("d1", '"label":"4111111111111111","label":"ok"'),
        body("d2", '"label":"ok","cvv":"123","cvv":""'),
        body("d3", '"label":"4111 1111 1111 1111","label":"x"'),
        body("d4", '"values":{"cvv":"123"},"values":{"name":"x"}', "form",
             '"action":"submit","formId":"f","fieldCount":1'),
        body("d5", '"identity":{"cvv":"123"},"identity":{"crm":"c-1"}', "identify", f'"hem":"{"a" * 64}"'),
        body("d6", '"identity":{"note":"4111111111111111","note":"x"}', "identify", f'"hem":"{"a" * 64}"'),
    ]
    for raw in hidden:
        response = await post(server, None, raw=raw)
        assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), raw
        batch = b'{"events":[' + raw + b"]}"
        response = await post(server, None, raw=batch)
        assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), batch
    assert await outbox_dump(server.data_dir) == []
    # Nested near the member-keeping parser's limit: refused, never scanned on the
    # decoded body alone (which keeps only the last "note"): 202 in a band of depths
    # (974-979 in a served process; lower here, where the server runs in pytest).
    for depth in range(850, 1000):
        deep = body(f"deep{depth}", '"note":"4111 1111 1111 1111","note":"x"',
                    extra='"name":"x","nest":' + "[" * depth + "]" * depth)
        response = await post(server, None, raw=deep)
        assert response.status_code == 400, (depth, response.text)
        assert response.json()["error"] in ("invalid_json", "prohibited_payment_data"), response.text
    # A repeated key without payment material is still an ordinary event (the last value wins).
    fine = await post(server, None, raw=body("d7", '"label":"a","label":"b"'))
    assert fine.status_code == 202 and fine.json()["accepted"] == 1, fine.text
    assert (await outbox_dump(server.data_dir))[0]["event"]["label"] == "b"


async def test_card_numbers_in_the_shapes_forms_and_urls_give_them(server: RunningServer) -> None:
    for index, text in enumerate(("pan-4111111111111111", "card_4111111111111111", "4111111111111111_x",
                                  "https://acme.com/pay?cc=4111+1111+1111+1111", "?cc=4111%201111%201111%201111",
                                  "4111\u00a01111\u00a01111\u00a01111", "%B4111111111111111^DOE/JOHN^2512101",
                                  "my card: 4111111111111111.")):
        response = await post(server, pageview(f"shape{index}", type="custom", name="x", label=text))
        assert response.status_code == 400, text
        assert response.json()["error"] == "prohibited_payment_data", text
    assert await outbox_dump(server.data_dir) == []


async def test_card_numbers_written_outside_ascii_are_refused_on_every_write_route(server: RunningServer) -> None:
    # helper-128: full-width digits (a Japanese input method), Arabic-Indic digits, thin
    # spaces, zero-width joiners and line breaks between the groups were all stored.
    card = "4111111111111111"
    groups = [card[i : i + 4] for i in range(0, 16, 4)]
    written = ["".join(chr(0xFF10 + int(d)) for d in card), "".join(chr(0x0660 + int(d)) for d in card),
               "\u2009".join(groups), "\u200b".join(groups), "\u2013".join(groups), "\n".join(groups)]
    for index, text in enumerate(written):
        event = pageview(f"wide{index}", type="custom", name="x", label=f"card {text} end")
        for raw in (json.dumps(event).encode(), json.dumps(event, ensure_ascii=False).encode()):
            response = await post(server, None, raw=raw)
            assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), raw
        edge = {"_eid": f"edge-wide{index}", "visitorId": "v", "sessionId": "s", "url": "https://acme.com/",
                "title": f"card {text}"}
        response = await server.client.post("/v1/edge/pageview", json=edge, headers=H)
        assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), text
    keyed = pageview("hdr-wide")
    del keyed["_eid"]
    response = await post(server, keyed, headers={**H, "Idempotency-Key": written[0].encode()})  # type: ignore[dict-item]
    assert response.json()["error"] == "prohibited_payment_data", response.text
    # As a browser writes them in a URL: percent-encoded UTF-8 (helper-130: stored).
    encoded = "".join("%EF%BC%9" + digit for digit in card)
    response = await post(server, pageview("url-wide"), headers={**H, "Referer": f"https://acme.com/?c={encoded}"})
    assert response.json()["error"] == "prohibited_payment_data", response.text
    edge = {"_eid": "edge-url-wide", "visitorId": "v", "sessionId": "s", "url": f"https://acme.com/?c={encoded}"}
    response = await server.client.post("/v1/edge/pageview", json=edge, headers=H)
    assert response.json()["error"] == "prohibited_payment_data", response.text
    # Dates, phone numbers and ids in those digits are not cards.
    fine = pageview("wide-fine", type="custom", name="x",
                    label="\uff12\uff10\uff12\uff16\u5e74 \u2013 \u0665\u0660\u0663\u0662 \u2013 order 4567 8901 2345")
    response = await post(server, fine)
    assert response.json()["accepted"] == 1, response.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["wide-fine"]


async def test_a_card_number_in_a_header_the_write_keeps_refuses_it(server: RunningServer) -> None:
    event = pageview("hdr")
    del event["_eid"]
    for key in ("k-4111111111111111", "4111\u00a01111\u00a01111\u00a01111".encode()):  # NBSP as UTF-8
        response = await post(server, event, headers={**H, "Idempotency-Key": key})  # type: ignore[dict-item]
        assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), key
        # an authenticated response: it carries the key's rate headers (audit helper-42)
        assert response.headers["X-RateLimit-Scope"] == "ingest", response.headers
    # spec 4.1 rule 5, "anywhere in the request": a checkout page's URL in the Referer
    # or in the query string (audit helper-41: both were 202)
    for headers, params in (({**H, "Referer": "https://acme.com/checkout?cc=4111+1111+1111+1111"}, {}),
                            # a textarea's line breaks, percent-encoded (helper-134: 202)
                            ({**H, "Referer": "https://acme.com/?c=4111%0D%0A1111%0D%0A1111%0D%0A1111"}, {}),
                            # after percent-encoded punctuation (helper-142: 202)
                            ({**H, "Referer": "https://acme.com/?next=%2Fpay%3Fcard%3D4111111111111111"}, {}),
                            (H, {"cc": "4111 1111 1111 1111"}), (H, {"4111111111111111": "x"}),
                            # a repeated parameter's every value (review helper-45: the last one hid it)
                            (H, [("cc", "4111111111111111"), ("cc", "x")]),
                            ({}, [("key", "4111111111111111"), ("key", BROWSER_KEY)])):
        response = await server.client.post("/v1/events", content=json.dumps(pageview("q")).encode(),
                                            headers={"Origin": "https://acme.com", **headers}, params=params)
        assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), params
    assert await outbox_dump(server.data_dir) == []
    fine = await post(server, event, headers={**H, "Idempotency-Key": "order-2024-000123",
                                              "Referer": "https://acme.com/order/2024-000123?ts=1795509105242"})
    assert fine.json()["ledgerKeys"] == ["acme/order-2024-000123/0"]


async def test_order_ids_and_phones_are_not_payment_data(server: RunningServer) -> None:
    event = pageview("order", type="custom", name="order", label="order 2024-000123-77 call +1 415 555 2671")
    response = await post(server, event)
    assert response.status_code == 202, response.text


async def test_gzip_body(server: RunningServer) -> None:
    raw = gzip.compress(json.dumps({"events": [pageview("g1")]}).encode())
    response = await post(server, None, {**H, "Content-Encoding": "gzip"}, raw=raw)
    assert response.status_code == 202, response.text
    # RFC 1952: several members (pigz, streaming compressors) inflate to their concatenation.
    body = json.dumps({"events": [pageview("g2")]}).encode()
    members = gzip.compress(body[:40]) + gzip.compress(body[40:])
    response = await post(server, None, {**H, "Content-Encoding": "gzip"}, raw=members)
    assert response.status_code == 202, response.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["g1", "g2"]


async def test_gzip_needs_json_content_type(server: RunningServer) -> None:
    raw = gzip.compress(json.dumps(pageview("g2")).encode())
    headers = {**H, "Content-Encoding": "gzip", "Content-Type": "text/plain"}
    response = await post(server, None, headers, raw=raw)
    assert response.status_code == 400
    assert response.json() == {"error": "Content-Type must be application/json"}


async def test_an_unsupported_content_encoding_is_refused_before_the_body_is_read(server: RunningServer) -> None:
    # helper-78: a body in `br` was read whole (up to 10 MB) to be refused; `gzip, gzip` was told to "use gzip".
    for encoding, says in (("br", "use gzip"), ("gzip, gzip", "send one gzip layer")):
        async with await trio.open_tcp_stream("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])) as stream:
            await stream.send_all(
                f"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: {BROWSER_KEY}\r\nOrigin: https://acme.com\r\n"
                f"Content-Type: application/json\r\nContent-Encoding: {encoding}\r\n"
                "Content-Length: 5000000\r\n\r\n".encode()
            )  # and not one byte of the body
            answer = b""
            with trio.fail_after(10):
                while b"}" not in answer:
                    answer += await stream.receive_some()
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b'"validation_error"' in answer and says.encode() in answer, answer


async def test_gzip_bomb_is_aborted(server: RunningServer) -> None:
    bomb = gzip.compress(b"[" + b" " * (20 * 1024 * 1024) + b"]")
    assert len(bomb) < 1024 * 1024
    response = await post(server, None, {**H, "Content-Encoding": "gzip"}, raw=bomb)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"


async def test_compressed_body_over_1mb(server: RunningServer) -> None:
    import os

    raw = gzip.compress(os.urandom(1024 * 1024 + 10))
    response = await post(server, None, {**H, "Content-Encoding": "gzip"}, raw=raw)
    assert (response.status_code, response.json()["error"]) == (413, "payload_too_large"), response.text


async def test_raw_body_over_10mb(server: RunningServer) -> None:
    raw = b'{"events": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    response = await post(server, None, raw=raw)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"


async def test_event_over_120000_bytes_after_enrichment(server: RunningServer) -> None:
    values = {f"field{i}": "v" * 9_000 for i in range(14)}
    event = pageview("big", type="form", action="submit", formId="f", fieldCount=14, values=values)
    response = await post(server, {"events": [pageview("small"), event]})
    assert response.status_code == 413, response.text
    assert (response.json()["error"], response.json()["index"], response.json()["eid"]) == ("batch_too_large", 1, "big")


async def test_request_id_is_echoed_or_minted(server: RunningServer) -> None:
    response = await post(server, pageview("rid"), {**H, "X-Request-ID": "abc-123"})
    assert response.headers["X-Request-ID"] == "abc-123"
    minted = [(await server.client.post("/v1/events", content=b"{}")).headers["X-Request-ID"],
              (await server.client.get("/nowhere")).headers["X-Request-ID"]]
    # 24 hex digits (README), one per request (helper-96: a constant passed)
    assert all(re.fullmatch(r"[0-9a-f]{24}", rid) for rid in minted) and minted[0] != minted[1], minted


async def test_concurrent_replays_store_once(server: RunningServer) -> None:
    statuses: list[dict[str, int]] = []
    batch = {"events": [pageview(f"cc{i}") for i in range(10)]}

    async def one() -> None:
        response = await post(server, batch)
        assert response.status_code == 202
        statuses.append(response.json())

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one)
    assert sum(s["accepted"] for s in statuses) == 10
    assert sum(s["duplicates"] for s in statuses) == 110
    assert len(await outbox_dump(server.data_dir)) == 10


async def test_key_order_inside_form_values_and_identity_is_not_content(server: RunningServer) -> None:
    # Both are free-form maps; a retry that orders their keys differently was a 409.
    form = pageview("form-order", type="form", action="submit", formId="f", fieldCount=2,
                    values={"plan": "pro", "size": "m"})
    who = pageview("identify-order", type="identify", hem="a" * 64, identity={"crm": "c-1", "team": "blue"})
    for event, field in ((form, "values"), (who, "identity")):
        first = await server.client.post("/v1/events", json=event, headers=H)
        assert first.json()["accepted"] == 1, first.text
        reordered = {**event, field: dict(reversed(list(event[field].items())))}
        again = await server.client.post("/v1/events", json=reordered, headers=H)
        assert (again.status_code, again.json()["duplicates"]) == (202, 1), again.text
        changed = {**event, field: {**event[field], "extra": "x"}}
        refused = await server.client.post("/v1/events", json=changed, headers=H)
        assert refused.json()["error"] == "idempotency_conflict"


async def test_numbers_are_stored_as_written_and_old_float_records_still_match(server: RunningServer) -> None:
    scroll = pageview("numbers", type="scroll", depth=50, timeOnPage=1200)
    response = await post(server, scroll)
    assert response.json()["accepted"] == 1, response.text
    stored = (await outbox_dump(server.data_dir))[0]["event"]
    assert (stored["depth"], stored["timeOnPage"], stored["device"]["viewport"]) == (
        50, 1200, {"width": 1280, "height": 800})
    assert isinstance(stored["depth"], int) and isinstance(stored["device"]["viewport"]["width"], int)
    # Versions before 2026-11-25 stored and hashed those numbers as floats (1280.0): a
    # retry written with whole numbers is a duplicate of such a record, not a conflict.
    as_floats = pageview("old-record", type="scroll", depth=50.0, timeOnPage=1200.0,
                         device={**scroll["device"], "viewport": {"width": 1280.0, "height": 800.0}})  # type: ignore[dict-item]
    first = await post(server, as_floats)
    assert first.json()["accepted"] == 1, first.text
    # (this version's record, made as an earlier version wrote it: without its hash form,
    # and with the unkeyed hash of the float form those versions stored)
    key = idempotency.ledger_key("acme", "old-record")
    record = idempotency.decode(read_stored(server.data_dir, "idempotency", key) or b"")
    context = IngestContext(client_id="acme", site_id="web", key_type="browser", production=True, now_ms=0)
    hashed = prepare_batch(json.dumps(as_floats).encode(), context).accepted[0].hashed_event
    assert hashed is not None
    float_hash = unkeyed_event_hashes(hashed)[0]
    older = msgspec.msgpack.encode((float_hash, record.receipt_id, record.stored_ms))
    await trio.to_thread.run_sync(lambda: rewrite_stored(server.data_dir, "idempotency", key, value=older))
    retry = await post(server, {**scroll, "_eid": "old-record"})
    assert (retry.status_code, retry.json()["duplicates"]) == (202, 1), retry.text
    assert retry.json()["receiptIds"] == first.json()["receiptIds"]
    changed = await post(server, {**scroll, "_eid": "old-record", "depth": 75})
    assert changed.json()["error"] == "idempotency_conflict"
    # A record this version wrote with floats is other content than whole numbers
    # (helpers 87 and 88: it was a duplicate, or a 409, by which came first).
    new_floats = await post(server, {**as_floats, "_eid": "new-record"})
    assert new_floats.json()["accepted"] == 1, new_floats.text
    as_ints = await post(server, {**scroll, "_eid": "new-record"})
    assert as_ints.json()["error"] == "idempotency_conflict", as_ints.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["numbers", "old-record", "new-record"]


async def test_values_the_schema_let_through_are_refused_per_event_and_not_stored(server: RunningServer) -> None:
    # helper-81: each of these was accepted and stored as sent.
    bad = [
        pageview("hem-newline", type="identify", hem="a" * 64 + "\n"),
        pageview("misspelt-consent", consent={"analytics": True, "identity_resolution": False}),
        pageview("host-with-space", page={"url": "http://acme .com/", "path": "/", "title": "t"}),
        pageview("control-in-url", page={"url": "https://acme.com/\u0000", "path": "/", "title": "t"}),
    ]
    response = await post(server, {"events": [pageview("fine"), *bad]})
    assert response.status_code == 202, response.text
    errors = {e["eid"]: e["issues"][0]["path"] for e in response.json()["errors"]}
    assert errors == {"hem-newline": "$.hem", "misspelt-consent": "$.consent.identity_resolution",
                      "host-with-space": "$.page.url", "control-in-url": "$.page.url"}
    native = pageview("no-device", page={"path": "Home", "title": "Home"})
    del native["device"]
    response = await post(server, native, headers={"X-API-Key": MOBILE_KEY, "Content-Type": "application/json"})
    assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["fine"]


async def test_a_number_out_of_range_rejects_its_event_not_the_batch(server: RunningServer) -> None:
    # helper-87: 1e309 is valid JSON (RFC 8259 sets no limit), and one such number
    # anywhere refused the whole batch as invalid_json.
    fine = json.dumps(pageview("in-range"))
    huge = json.dumps(pageview("out-of-range", type="scroll", depth=50, timeOnPage=1)).replace(
        '"timeOnPage": 1', '"timeOnPage": 1e309')
    response = await post(server, None, raw=f'{{"events": [{fine}, {huge}]}}'.encode())
    assert response.status_code == 202, response.text
    assert (response.json()["accepted"], response.json()["rejected"]) == (1, 1)
    assert "out of range" in response.json()["errors"][0]["issues"][0]["message"]
    alone = await post(server, None, raw=huge.replace("out-of-range", "alone").encode())
    assert (alone.status_code, alone.json()["error"]) == (400, "validation_error"), alone.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["in-range"]


async def test_a_string_cut_inside_an_emoji_is_stored_with_a_replacement_character(server: RunningServer) -> None:
    # A JavaScript SDK cutting a title at a limit can keep half of a surrogate pair, which
    # JSON.stringify writes as the escape "\ud83d": the whole batch was refused as
    # invalid_json ("Input data was truncated").
    cut = pageview("cut-title", page={"url": "https://acme.com/", "path": "/", "title": "Launch \ud83d"})
    body = json.dumps({"events": [cut, pageview("beside-it")]}).encode()  # (escapes it as JSON.stringify does)
    assert b"\\ud83d" in body
    response = await post(server, None, raw=body)
    assert (response.status_code, response.json()["accepted"]) == (202, 2), response.text
    assert (await post(server, None, raw=body)).json()["duplicates"] == 2  # (a retry: the same content)
    edge = {"_eid": "edge-cut", "visitorId": "v9", "sessionId": "s9", "url": "https://acme.com/", "title": "Sale \ud83d",
            "userAgent": "Mozilla/5.0 (Windows NT 10.0) Chrome/131.0"}
    response = await server.client.post("/v1/edge/pageview", content=json.dumps(edge).encode(), headers=H)
    assert response.status_code == 202, response.text
    stored = {row["eid"]: row["event"] for row in await outbox_dump(server.data_dir)}
    assert stored["cut-title"]["page"]["title"] == "Launch \ufffd"
    assert stored["edge-cut"]["page"]["title"] == "Sale \ufffd"


async def test_a_misspelt_identity_denial_still_stops_the_identifies_after_it(server: RunningServer) -> None:
    # helper-87: the transition was refused for its spelling and the identify after it stored.
    denial = pageview("denial", type="_consent_transition", consent={"analytics": True, "identity_resolution": False})
    del denial["page"]
    who = pageview("who", type="identify", hem="a" * 64)
    other = pageview("other-visitor", type="identify", hem="b" * 64, visitorId="v2")
    response = await post(server, {"events": [denial, who, other]})
    assert response.status_code == 202, response.text
    body = response.json()
    assert [(e["eid"], e["error"], e.get("reason")) for e in body["errors"]] == [
        ("denial", "validation_error", None), ("who", "dropped", "identity_consent_denied")]
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["other-visitor"]
    # A choice spelt right after it decides, as between two spelt right (helper-91: the
    # misspelt denial outranked a later grant).
    grant = {**denial, "_eid": "grant", "consent": {"analytics": True, "identityResolution": True}}
    response = await post(server, {"events": [{**denial, "_eid": "denial-2"}, grant, {**who, "_eid": "who-2"}]})
    assert [e["eid"] for e in response.json()["errors"]] == ["denial-2"], response.text
    assert response.json()["accepted"] == 2


async def test_a_denial_in_a_refused_transition_still_stops_the_identifies_after_it(server: RunningServer) -> None:
    # helper-94: a transition refused for its page content (an SDK stamping the envelope's
    # page on every event) or a bad consent timestamp lost its denial; the identify was stored.
    spelt = {"analytics": True, "identityResolution": False}
    refused = [
        pageview("with-page", type="_consent_transition", consent=spelt),
        {**pageview("bad-time", type="_consent_transition", consent={**spelt, "timestamp": "now"}), "page": None},
        # a refusal written as a string (helper-98: the identify was stored)
        {**pageview("as-text", type="_consent_transition", consent={**spelt, "identityResolution": "false"}),
         "page": None},
    ]
    for n, denial in enumerate(refused):
        who = pageview(f"who-{n}", type="identify", hem="a" * 64, rawEmail="a@b.co")
        response = await post(server, {"events": [denial, who]})
        assert response.status_code == 202, response.text
        assert [(e["eid"], e["error"], e.get("reason")) for e in response.json()["errors"]] == [
            (denial["_eid"], "validation_error", None), (f"who-{n}", "dropped", "identity_consent_denied")]
    assert await outbox_dump(server.data_dir) == []


async def test_a_consent_transition_never_carries_page_content(server: RunningServer) -> None:
    # Spec 6.1. helper-135: a page without a title was told "missing required field
    # `title`", one with a title was then refused for it, and a path was stored.
    consent = {"analytics": True}
    refused = [{"path": "/", "title": "Pricing"}, {"url": "https://acme.com/"}, {"title": "Pricing"},
               {"url": "https://acme.com/", "path": "/"}, {"referrer": "https://acme.com/"}]
    events = [{**pageview(f"with-{n}", type="_consent_transition", consent=consent), "page": page}
              for n, page in enumerate(refused)]
    response = await post(server, {"events": events})
    assert response.status_code == 400, response.text
    errors = response.json()["errors"]
    assert [(e["eid"], e["error"]) for e in errors] == [(f"with-{n}", "validation_error") for n in range(5)]
    assert all(e["issues"] == [{"path": "$.page", "message": "a _consent_transition event never carries page"
                                " content (url, title or referrer): leave `page` out"}] for e in errors), errors
    # An empty page is no content; a path alone passes, as earlier versions took it (their
    # retries stay duplicates: helper-137), and is not stored (helper-135 found it stored).
    empty = [{**pageview(f"empty-{n}", type="_consent_transition", consent=consent), "page": page}
             for n, page in enumerate([{}, {"path": "", "title": ""}, {"path": "/account/123", "title": ""},
                                       {"path": "/account/123"}])]
    assert (await post(server, {"events": empty})).json()["accepted"] == 4
    retried = (await post(server, {"events": empty})).json()
    assert (retried["accepted"], retried["duplicates"]) == (0, 4), retried
    stored = await outbox_dump(server.data_dir)
    assert [row["eid"] for row in stored] == ["empty-0", "empty-1", "empty-2", "empty-3"]
    assert "/account/123" not in json.dumps(stored) and all("page" not in row["event"] for row in stored), stored


async def test_outbox_dump_lines_survive_unicode_line_splitting(server: RunningServer) -> None:
    # helper-84: U+2028 in a stored string (JSON lets it stand raw) cut a record of
    # `outbox dump` in two for any reader splitting lines the Unicode way.
    # helper-86: U+0085 too, and in the event's id.
    eid = "sep\u2028ar\u0085ators"
    event = pageview(eid, page={"url": "https://acme.com/", "path": "/a\u2028b\u2029c\u0085d", "title": "t"})
    assert (await post(server, event)).json()["accepted"] == 1
    dumped = run_cli("outbox", "dump", data_dir=server.data_dir).stdout
    lines = dumped.splitlines()  # (str.splitlines also splits at U+0085, U+2028 and U+2029)
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert (record["eid"], record["event"]["page"]["path"]) == (eid, "/a\u2028b\u2029c\u0085d")


async def test_edge_pageview(server: RunningServer) -> None:
    body = {"_eid": "edge-1", "visitorId": "v9", "sessionId": "s9", "url": "https://acme.com/blog/post?x=1",
            "title": "Post", "referrer": "https://news.example/"}
    headers = {**H, "User-Agent": "Mozilla/5.0 (Windows NT 10.0) Chrome/131.0"}
    response = await server.client.post("/v1/edge/pageview", json=body, headers=headers)
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == 1
    assert response.headers["X-Service-Monthly-Used"] == "1"
    # An exact retry is a duplicate, although the stored event's timestamp is the time of receipt.
    await trio.sleep(0.01)
    again = await server.client.post("/v1/edge/pageview", json=body, headers=headers)
    assert (again.status_code, again.json()["duplicates"]) == (202, 1), again.text
    changed = await server.client.post("/v1/edge/pageview", json={**body, "title": "Other"}, headers=headers)
    assert changed.json()["error"] == "idempotency_conflict"
    # Key order inside the free-form `consent` map is not content either (it was a 409).
    consented = {**body, "_eid": "edge-consent", "consent": {"analytics": True, "identityResolution": False}}
    first = await server.client.post("/v1/edge/pageview", json=consented, headers=headers)
    assert first.json()["accepted"] == 1, first.text
    reordered = {**consented, "consent": {"identityResolution": False, "analytics": True}}
    retry = await server.client.post("/v1/edge/pageview", json=reordered, headers=headers)
    assert (retry.status_code, retry.json()["duplicates"]) == (202, 1), retry.text
    event = (await outbox_dump(server.data_dir))[0]["event"]
    assert event["type"] == "pageview" and event["page"]["path"] == "/blog/post"
    assert event["device"]["userAgent"].startswith("Mozilla/5.0 (Windows")
    missing = await server.client.post("/v1/edge/pageview", json={"visitorId": "v"}, headers=H)
    assert missing.status_code == 400 and missing.json()["error"] == "validation_error"
    assert missing.json()["details"] == [{"path": "$", "message": "Object missing required field `url`"}]
    no_id = await server.client.post("/v1/edge/pageview", json={k: v for k, v in body.items() if k != "_eid"}, headers=H)
    assert no_id.json()["error"] == "idempotency_required"
    leak = await server.client.post("/v1/edge/pageview", json={**body, "_eid": "edge-2", "note": "4111 1111 1111 1111"}, headers=H)
    assert leak.json()["error"] == "prohibited_payment_data"


async def test_edge_pageview_errors_name_the_edge_fields_and_never_answer_500(server: RunningServer) -> None:
    body = {"_eid": "edge-err", "visitorId": "v", "sessionId": "s", "url": "https://acme.com/", "userAgent": "UA"}

    async def details(**fields: object) -> list[dict[str, str]]:
        response = await server.client.post("/v1/edge/pageview", json={**body, **fields}, headers=H)
        assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
        return response.json()["details"]

    # urlsplit raised on these and the route answered 500 "retry it" (helper-68).
    for url in ("http://[::1", "https://[zz]/", "https://ex\u2100ample.com/", "https://acme.com\uff03@evil.com/"):
        assert await details(url=url) == [{"path": "$.url", "message": "url does not parse as a URL"}], url
    # The translated pageview's paths ($.device.userAgent, $.page.url and $.page.path) were named.
    assert await details(userAgent="u" * 513) == [
        {"path": "$.userAgent", "message": "Expected `str` of length <= 512"}]
    assert [d["path"] for d in await details(url="javascript:alert(1)")] == ["$.url"]
    # a type error reads as the others do, path first (helper-94: msgspec's own wording)
    wrong = await server.client.post("/v1/edge/pageview", json={**body, "timestamp": "now"}, headers=H)
    assert wrong.json()["message"] == "invalid edge pageview: $.timestamp: Expected `int | float | null`, got `str`"
    assert await outbox_dump(server.data_dir) == []


async def test_an_edge_resend_differing_past_a_truncation_limit_is_a_duplicate(server: RunningServer) -> None:
    # As on /v1/events (spec 8.1 truncates, README "Field rules"); the edge route
    # hashed the request uncut and answered 409 (helper-68).
    long_url = "https://acme.com/" + "a" * 2100
    body = {"_eid": "edge-long", "visitorId": "v", "sessionId": "s", "userAgent": "UA", "title": "T" * 600}
    first = await server.client.post("/v1/edge/pageview", json={**body, "url": long_url + "X"}, headers=H)
    assert first.json()["accepted"] == 1, first.text
    again = await server.client.post("/v1/edge/pageview", headers=H,
                                     json={**body, "url": long_url + "Y", "title": "T" * 600 + "Z"})
    assert (again.status_code, again.json()["duplicates"]) == (202, 1), again.text
    changed = await server.client.post("/v1/edge/pageview", json={**body, "url": "https://acme.com/b"}, headers=H)
    assert changed.json()["error"] == "idempotency_conflict"
    # A null title is an empty one, as a null referrer or userAgent is absent (it was a 400);
    # an absent, null or empty title, and a clientIp (never stored), are the same content.
    untitled = {**body, "_eid": "edge-untitled", "url": "https://acme.com/", "title": None, "referrer": None}
    response = await server.client.post("/v1/edge/pageview", json=untitled, headers=H)
    assert response.json()["accepted"] == 1, response.text
    for same in ({**untitled, "title": ""}, {k: v for k, v in untitled.items() if k != "title"},
                 {**untitled, "clientIp": "198.51.100.7"}):
        response = await server.client.post("/v1/edge/pageview", json=same, headers=H)
        assert (response.status_code, response.json()["duplicates"]) == (202, 1), response.text


async def test_a_card_number_in_a_user_agent_after_a_shorter_number_is_refused(server: RunningServer) -> None:
    # The edge route stores the User-Agent header as the pageview's; the scan
    # missed a card that followed another number ("Firefox/133 4111...") (helper-68).
    headers = {**H, "User-Agent": "Mozilla/5.0 Firefox/133 4111111111111111"}
    body = {"_eid": "edge-ua-card", "visitorId": "v", "sessionId": "s", "url": "https://acme.com/"}
    response = await server.client.post("/v1/edge/pageview", json=body, headers=headers)
    assert (response.status_code, response.json()["error"]) == (400, "prohibited_payment_data"), response.text
    leak = pageview("ua-card", device={"userAgent": "Mozilla/5.0 Firefox/133 4111111111111111",
                                       "viewport": {"width": 1, "height": 1}})
    response = await server.client.post("/v1/events", json=leak, headers=H)
    assert response.json()["error"] == "prohibited_payment_data", response.text
    assert await outbox_dump(server.data_dir) == []


async def test_edge_pageview_with_a_mobile_key_is_native(server: RunningServer) -> None:
    # Spec 2.4: a mobile key's event without a declared platform is stamped
    # react-native; native clients are exempt from the user-agent heuristics
    # (spec 5.5 rule 7) and may use a custom scheme (2.2). It was stamped web:
    # an okhttp relay was a bot "tool" and an app URL a validation error.
    headers = {"X-API-Key": MOBILE_KEY, "User-Agent": "okhttp/4.12.0"}
    sent = [{"_eid": "edge-app-1", "visitorId": "mv1", "sessionId": "s1", "url": "myapp://home", "title": "Home"},
            {"_eid": "edge-app-2", "visitorId": "mv1", "sessionId": "s1", "url": "https://app.example/home"}]
    for body in sent:
        response = await server.client.post("/v1/edge/pageview", json=body, headers=headers)
        assert (response.status_code, response.json()["accepted"]) == (202, 1), response.text
    stored = [row["event"] for row in await outbox_dump(server.data_dir) if row["eid"].startswith("edge-app")]
    assert [e["device"]["clientPlatform"] for e in stored] == ["react-native", "react-native"]
    assert [e["bot"]["isBot"] for e in stored] == [False, False]
    # A website key's edge pageview stays web, and is classified as one.
    web = await server.client.post(
        "/v1/edge/pageview", headers={**H, "User-Agent": "okhttp/4.12.0"},
        json={"_eid": "edge-web-1", "visitorId": "wv1", "sessionId": "s1", "url": "https://acme.com/"},
    )
    assert web.status_code == 202, web.text
    [row] = [row for row in await outbox_dump(server.data_dir) if row["eid"] == "edge-web-1"]
    assert row["event"]["device"]["clientPlatform"] == "web" and row["event"]["bot"]["category"] == "tool"


async def test_unknown_routes_and_methods_use_the_error_format(server: RunningServer) -> None:
    for path in ("/v1/signals/v1/history", "/v1/live/sessions", "/nope"):
        response = await server.client.get(path)
        assert response.status_code == 404 and response.json()["error"] == "not_found"
    response = await server.client.get("/v1/events")
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"
    assert response.headers["Allow"] == "POST, OPTIONS"
    for path in ("/live/ws", "/signals/stream"):  # WebSocket-only routes over plain HTTP
        response = await server.client.get(path)
        assert response.status_code == 426 and response.json()["error"] == "upgrade_required"
        assert "does not serve it yet" in response.json()["message"]
        assert response.headers["X-Request-ID"] and response.headers["Upgrade"] == "websocket"


async def test_a_beacon_a_browser_sends_with_credentials_passes_its_preflight_and_is_readable(
    server: RunningServer,
) -> None:
    # helper-117: sendBeacon always sends in credentials mode "include"; with a Blob typed
    # application/json it is preflighted, and Chromium dropped it, silently, for want of
    # Access-Control-Allow-Credentials: true (a credentialed fetch was stored, then failed).
    origin = {"Origin": "https://acme.com"}
    preflight = await server.client.options(
        f"/v1/events?key={BROWSER_KEY}",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"},
    )
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    assert preflight.headers["Access-Control-Allow-Credentials"] == "true"
    beacon = await server.client.post(f"/v1/events?key={BROWSER_KEY}", content=json.dumps(pageview("beacon-1")),
                                      headers={**origin, "Content-Type": "application/json"})
    assert beacon.status_code == 202, beacon.text
    assert beacon.headers["Access-Control-Allow-Credentials"] == "true"
    refused = await server.client.post("/v1/events", json=pageview("beacon-2"), headers=origin)  # no key: 401
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Credentials"] == "true"
    assert "Access-Control-Allow-Credentials" not in (await server.client.get("/healthz", headers=origin)).headers


async def test_a_preflight_to_another_routes_path_carries_cors(server: RunningServer) -> None:
    # The signals route answers paths of other routes (404, 426); a preflight
    # to them lost its CORS headers as if its gate had refused it.
    preflight = {"Origin": "https://acme.com", "Access-Control-Request-Method": "GET"}
    for path, status in (("/v1/signals/v1/stream", 426), ("/v1/signals/a/b", 404)):
        response = await server.client.options(path, headers=preflight)
        assert response.status_code == status, response.text
        assert response.headers["Access-Control-Allow-Origin"] == "https://acme.com", path


async def test_a_long_request_id_is_cut_to_200_bytes_on_a_character_boundary(server: RunningServer) -> None:
    long_ascii = await server.client.get("/healthz", headers={"X-Request-ID": "r" * 250})
    assert long_ascii.headers["X-Request-ID"] == "r" * 200
    sent = ("a" + "\u00e4" * 150).encode()  # 301 bytes; byte 200 falls inside an "ä"
    response = await server.client.get("/healthz", headers={"X-Request-ID": sent})  # type: ignore[dict-item]
    [echoed] = [value for name, value in response.headers.raw if name.lower() == b"x-request-id"]
    assert echoed == sent[:199] and echoed.decode() == "a" + "\u00e4" * 99
    # Bytes that are not UTF-8 are cut at the limit, never to nothing (review of b061eaf).
    junk = b"a" + b"\xa9" * 300
    response = await server.client.get("/healthz", headers={"X-Request-ID": junk})  # type: ignore[dict-item]
    assert [v for n, v in response.headers.raw if n.lower() == b"x-request-id"] == [junk[:200]]


async def test_operational_routes_answer_like_the_others(server: RunningServer) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        response = await server.client.get(path, headers={"X-Request-ID": "ops-1"})
        assert response.status_code == 200 and response.headers["X-Request-ID"] == "ops-1", path
        refused = await server.client.post(path)
        assert refused.status_code == 405 and refused.json()["error"] == "method_not_allowed", path
        assert refused.headers["Allow"] and refused.headers["X-Request-ID"]


async def test_a_websocket_handshake_is_refused_in_the_error_format(server: RunningServer) -> None:
    host, port = server.base_url.removeprefix("http://").split(":")
    for path in ("/v1/signals/v1/stream?sessionId=s1", "/live/ws", "/healthz"):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "X-Request-ID: ws-1\r\n\r\n".encode())
            raw = b""
            with trio.fail_after(5):
                while b"}" not in raw:
                    chunk = await stream.receive_some()
                    if not chunk:
                        break
                    raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 404"), raw
        assert b"x-request-id: ws-1" in head.lower()
        assert json.loads(body)["error"] == "not_found"


async def test_responses_do_not_advertise_the_server_stack(server: RunningServer) -> None:
    response = await server.client.post("/v1/events", json=pageview("quiet"), headers=H)
    assert response.status_code == 202 and "server" not in response.headers
    assert "date" in response.headers  # RFC 9110: an origin server with a clock sends Date


async def test_a_request_framed_two_ways_is_answered_then_its_connection_closed(server: RunningServer) -> None:
    # RFC 9112 6.3: with both Transfer-Encoding and Content-Length the server must
    # close after responding, or a proxy that framed by Content-Length would have
    # the rest read as a next request (helper-62: the pipelined GET was served).
    host, port = server.base_url.removeprefix("http://").split(":")
    body = json.dumps(pageview("framed")).encode()
    head = (f"POST /v1/events HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {BROWSER_KEY}\r\n"
            f"Origin: https://acme.com\r\nContent-Type: application/json\r\nContent-Length: 5\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    request = head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    smuggled = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request + smuggled)
        raw = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                raw += chunk
    assert raw.startswith(b"HTTP/1.1 202"), raw
    assert b"connection: close" in raw.partition(b"\r\n\r\n")[0].lower()
    assert raw.count(b"HTTP/1.1 ") == 1, raw  # the pipelined request was never read
    stored = [row for row in await outbox_dump(server.data_dir) if row.get("eid") == "framed"]
    assert len(stored) == 1


async def test_a_request_framed_one_way_keeps_its_connection(server: RunningServer) -> None:
    host, port = server.base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() * 2)
        raw = b""
        with trio.fail_after(5):
            while raw.count(b"HTTP/1.1 200") < 2:
                raw += await stream.receive_some()
    assert b"connection: close" not in raw.lower()


async def test_a_body_in_neither_shape_is_refused_and_stores_nothing(server: RunningServer) -> None:
    # Decoders keep the last of repeated keys and ignore unknown fields: two
    # "events" arrays stored the second alone, an event carrying an "events"
    # array stored the event alone, each with a 202 that hid it (helper-62).
    first, second = json.dumps([pageview("shape-1")]), json.dumps([pageview("shape-2")])
    bodies = {
        f'{{"events": {first}, "events": {second}}}': 'more than one "events" array',
        json.dumps({**pageview("shape-3"), "events": [pageview("shape-4")]}): 'one event ("type") and a batch',
    }
    for body, message in bodies.items():
        response = await server.client.post("/v1/events", content=body.encode(), headers=H)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "validation_error" and message in response.json()["message"]
    assert not [row for row in await outbox_dump(server.data_dir) if str(row.get("eid", "")).startswith("shape-")]
    # "events" twice in the bytes, once as a key: an ordinary batch
    response = await server.client.post("/v1/events", json={"events": [pageview("shape-5b"), click("shape-6")],
                                                            "note": "events"}, headers=H)
    assert response.status_code == 202 and response.json()["accepted"] == 2, response.text


async def test_a_clicks_text_is_stored_scrubbed_of_personal_data(server: RunningServer) -> None:
    # Spec 2.3: element.text is "scrubbed of personal data"; it was stored as sent (helper-62).
    text = "Email jane.doe@example.com or call +1 415 555 0100"
    event = click("scrubbed", element={"selector": "a.contact", "text": text, "x": 1, "y": 2})
    response = await server.client.post("/v1/events", json=event, headers=H)
    assert response.status_code == 202 and response.json()["accepted"] == 1, response.text
    again = await server.client.post("/v1/events", json=event, headers=H)
    assert again.json()["duplicates"] == 1  # the id keeps the content the client sent
    stored = [row for row in await outbox_dump(server.data_dir) if row.get("eid") == "scrubbed"]
    assert len(stored) == 1
    assert "jane" not in json.dumps(stored) and "555" not in json.dumps(stored)
    assert "Email [email] or call [phone]" in json.dumps(stored)
    # Written outside ASCII (helper-128: each kept in clear): read as the ASCII it stands for.
    hidden = "Mail jane\u200b@example.com, Handy \uff10\uff11\uff15\uff11 \uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19"
    event = click("scrubbed-wide", element={"selector": "a.contact", "text": hidden, "x": 1, "y": 2})
    assert (await server.client.post("/v1/events", json=event, headers=H)).json()["accepted"] == 1
    stored = [row for row in await outbox_dump(server.data_dir) if row.get("eid") == "scrubbed-wide"]
    assert stored[0]["event"]["element"]["text"] == "Mail [email], Handy [phone]", stored


async def test_a_wall_clock_jumping_days_ahead_for_a_minute_removes_nothing(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-108: a minute of a clock set eight days ahead made the retention sweep remove
    # every stored event and its idempotency record; their retries were then stored and
    # billed again. The writer now goes on at real speed until a step has held 10 minutes.
    server = await start_server(nursery, tmp_path, steady=time.monotonic, outbox_retention_hours=1,
                                idempotency_window_hours=24, retention_interval_s=0.2)
    first = await post(server, {"events": [pageview("jump-1"), pageview("jump-2")]})
    assert first.json()["accepted"] == 2
    server.clock.offset = 8 * 86_400
    await trio.sleep(1.5)  # several sweeps
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_retention_removed_total{kind="outbox"} 0.0' in metrics
    assert 'collector_retention_removed_total{kind="idempotency"} 0.0' in metrics
    server.clock.offset = 0
    retry = await post(server, {"events": [pageview("jump-1"), pageview("jump-2")]})
    assert (retry.json()["accepted"], retry.json()["duplicates"]) == (0, 2), retry.text
    assert retry.json()["receiptIds"] == first.json()["receiptIds"]
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["jump-1", "jump-2"]


async def test_a_server_that_commits_nothing_still_sees_a_clock_step_within_a_second(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # helper-116: a guard read only at commits started its 10 minutes at its worker's next
    # commit, so an idle worker believed a step minutes after the others, and their stamps
    # differed by the whole step meanwhile.
    server = await start_server(nursery, tmp_path, steady=time.monotonic, retention_interval_s=600)
    with caplog.at_level(logging.WARNING, logger="collector.storage"):
        server.clock.offset = 2 * 86_400
        await trio.sleep(1.5)  # no request, no sweep
    assert any("the wall clock stepped +172800 s" in record.getMessage() for record in caplog.records), caplog.text


async def test_a_server_restarted_during_a_clock_jump_does_not_believe_it(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-111: a worker killed during a jump was restarted believing it, and its sweep
    # removed every stored event. A process starts from the anchor worker 0's writer publishes.
    settings = {"outbox_retention_hours": 1, "idempotency_window_hours": 24, "retention_interval_s": 0.2}
    first = await start_server(nursery, tmp_path, steady=time.monotonic, **settings)
    assert (await post(first, pageview("anchored"))).json()["accepted"] == 1
    await trio.sleep(0.6)  # (its first commit published the anchor; a sweep or two ran)
    first.cancel.cancel()
    await trio.sleep(0.5)  # (its storage closed)
    (tmp_path / "again").mkdir()
    jumped = MovableClock()
    jumped.offset = 8 * 86_400  # from its very start
    again = await start_server(nursery, tmp_path / "again", steady=time.monotonic, clock=jumped,
                               data_dir=str(first.data_dir), **settings)
    await trio.sleep(1.5)
    metrics = (await again.client.get("/metrics")).text
    assert 'collector_retention_removed_total{kind="outbox"} 0.0' in metrics, metrics
    again.clock.offset = 0
    retry = await post(again, pageview("anchored"))
    assert (retry.json()["accepted"], retry.json()["duplicates"]) == (0, 1), retry.text
