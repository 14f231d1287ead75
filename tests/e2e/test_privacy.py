"""Consent, the form privacy floor, sealed fields and the audited reveal, end to end (issue 6).

Every case goes through the real server on 127.0.0.1 and checks what was
stored with the real `collector outbox dump`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio
import xxhash

from collector.http.consent_body import ConsentBody
from collector.http.edge_body import content_identities
from collector.ingest.content_hash import unkeyed_event_hashes
from collector.ingest.model import IngestContext
from collector.ingest.pipeline import prepare_batch
from storage import consent as consent_store
from storage import idempotency
from tests.conftest import STAMP, RunningServer, pageview, start_server
from tests.helpers import outbox_dump, read_stored, rewrite_stored, run_cli

KEY = "cs_live_privacy00000"
STRICT = "cs_live_strict000000"
MULTI = "cs_live_pmulti000000"
TENANTS = {
    "keys": [
        {"key": KEY, "clientId": "acme", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": STRICT, "clientId": "eu", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "eu-web", "domains": ["acme.eu"], "strictConsent": True}]},
        {"key": MULTI, "clientId": "multi", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "a", "domains": ["a.com"]}, {"siteId": "b", "domains": ["b.com"]}]},
    ]
}
ACME = {"X-API-Key": KEY, "Origin": "https://acme.com"}
EU = {"X-API-Key": STRICT, "Origin": "https://acme.eu"}
EMAIL = "jane.doe@example.com"
HEM = hashlib.sha256(EMAIL.encode()).hexdigest()


async def started(nursery: trio.Nursery, tmp_path: Path) -> RunningServer:
    return await start_server(nursery, tmp_path, TENANTS)


def form(eid: str, form_id: str, values: dict[str, str], raw_fields: dict[str, str] | None = None,
         **extra: object) -> dict[str, object]:
    event = pageview(eid, type="form", action="submit", formId=form_id, fieldCount=len(values),
                     values=values, **extra)
    event["raw_fields"] = json.dumps(raw_fields or {name: "text" for name in values})
    return event


def identify(eid: str, **extra: object) -> dict[str, object]:
    return pageview(eid, type="identify", hem=HEM, rawEmail=EMAIL, rawPhone="+1 415 555 0100", **extra)


async def stored_events(server: RunningServer) -> dict[str, dict[str, object]]:
    return {str(row["eid"]): row for row in await outbox_dump(server.data_dir)}


async def test_strict_consent_drops_before_any_side_effect(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    url = {"page": {"url": "https://acme.eu/", "path": "/", "title": "Home"}}
    batch = {"events": [
        pageview("no-consent", **url),
        pageview("denied", consent={"analytics": False}, **url),
        pageview("granted", consent={"analytics": True}, **url),
    ]}
    response = await server.client.post("/v1/events", json=batch, headers=EU)
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["dropped"], body["received"]) == (1, 2, 3)
    reasons = {e["eid"]: e["reason"] for e in body["errors"] if e["error"] == "dropped"}
    assert reasons == {"no-consent": "consent_missing", "denied": "consent_denied"}
    assert response.headers["X-Service-Monthly-Used"] == "1"  # only the consented pageview counts
    assert set(await stored_events(server)) == {"granted"}
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_events_dropped_total{reason="consent_missing"} 1.0' in metrics
    assert 'collector_events_dropped_total{reason="consent_denied"} 1.0' in metrics
    # A non-strict property keeps events without a consent object.
    response = await server.client.post("/v1/events", json=pageview("plain"), headers=ACME)
    assert response.json()["accepted"] == 1


async def test_all_dropped_is_202_not_a_validation_error(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    response = await server.client.post("/v1/events", json=pageview("x"), headers=EU)
    assert response.status_code == 202
    assert (response.json()["accepted"], response.json()["dropped"]) == (0, 1)
    assert await stored_events(server) == {}


async def test_consent_route_records_and_denies_identity(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    decision = {"visitorId": "v1", "sessionId": "s1", "timestamp": STAMP,
                "consent": {"analytics": True, "identityResolution": False}}
    response = await server.client.post("/v1/consent", json=decision, headers=ACME)
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == 1
    assert response.headers["X-Service-Monthly-Used"] == "0"  # consent counts toward nothing
    again = await server.client.post("/v1/consent", json=decision, headers=ACME)
    assert again.json()["duplicates"] == 1
    reordered = {**decision, "consent": {"identityResolution": False, "analytics": True}}
    again = await server.client.post("/v1/consent", json=reordered, headers=ACME)
    assert again.json()["duplicates"] == 1, again.text  # key order is not content (it was a 409)
    # With an _eid and no timestamp (the time of receipt), an exact retry is a duplicate too.
    undated = {"_eid": "c-undated", "visitorId": "v9", "consent": {"analytics": True}}
    assert (await server.client.post("/v1/consent", json=undated, headers=ACME)).json()["accepted"] == 1
    await trio.sleep(0.01)
    assert (await server.client.post("/v1/consent", json=undated, headers=ACME)).json()["duplicates"] == 1
    # The recorded denial keeps identity values out, even when the event says nothing.
    response = await server.client.post("/v1/events", json=identify("id-1"), headers=ACME)
    body = response.json()
    assert (body["accepted"], body["dropped"]) == (0, 1)
    assert body["errors"][0]["reason"] == "identity_consent_denied"
    # Another visitor without a recorded denial is stored.
    response = await server.client.post("/v1/events", json=identify("id-2", visitorId="v2"), headers=ACME)
    assert response.json()["accepted"] == 1
    # Within one batch each visitor's record decides for all of that visitor's events.
    batch = {"events": [identify("id-4"), identify("id-5", visitorId="v2"), identify("id-6")]}
    body = (await server.client.post("/v1/events", json=batch, headers=ACME)).json()
    assert (body["accepted"], body["dropped"]) == (1, 2)
    assert [e["index"] for e in body["errors"]] == [0, 2]
    # The same for a body large enough to be prepared in a worker thread.
    padded = {"events": [identify(f"big-{n}", visitorId="v1" if n % 2 else "v2", padding="p" * 12_000)
                         for n in range(25)]}
    body = (await server.client.post("/v1/events", json=padded, headers=ACME)).json()
    assert (body["accepted"], body["dropped"]) == (13, 12), body
    # An older decision arriving late does not undo the newer one.
    late = dict(decision, timestamp=STAMP - 60_000,
                consent={"analytics": True, "identityResolution": True})
    assert (await server.client.post("/v1/consent", json=late, headers=ACME)).json()["accepted"] == 1
    response = await server.client.post("/v1/events", json=identify("id-3"), headers=ACME)
    assert response.json()["dropped"] == 1
    # The event's own denial also keeps it out.
    own = identify("id-4", visitorId="v3", consent={"analytics": True, "identityResolution": False})
    assert (await server.client.post("/v1/events", json=own, headers=ACME)).json()["dropped"] == 1
    stored = await stored_events(server)
    assert {"id-1", "id-3", "id-4"}.isdisjoint(stored) and "id-2" in stored
    [transition] = [row["event"] for eid, row in stored.items() if eid.startswith(f"consent:v1:{STAMP}:web:")]
    assert transition["type"] == "_consent_transition"  # type: ignore[index]
    assert "page" not in transition  # type: ignore[operator]


async def test_the_retry_of_an_identify_stored_before_a_denial_is_a_duplicate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 4.1 rule 4: its first 202 lost, the retry was reported dropped although the
    # event is stored (audits helper-33, helper-35).
    server = await started(nursery, tmp_path)
    first = (await server.client.post("/v1/events", json=identify("id-r", visitorId="vr"), headers=ACME)).json()
    assert first["accepted"] == 1
    denial = {"visitorId": "vr", "timestamp": STAMP, "consent": {"analytics": True, "identityResolution": False}}
    assert (await server.client.post("/v1/consent", json=denial, headers=ACME)).status_code == 202
    batch = {"events": [identify("id-r", visitorId="vr"), identify("id-new", visitorId="vr"), pageview("pv-r")]}
    body = (await server.client.post("/v1/events", json=batch, headers=ACME)).json()
    assert (body["received"], body["accepted"], body["duplicates"], body["dropped"]) == (3, 1, 1, 1), body
    assert body["receiptIds"][0] == first["receiptIds"][0] and len(body["receiptIds"]) == 2
    assert [e["index"] for e in body["errors"]] == [1]
    assert body["ledgerKeys"] == ["acme/id-r", "acme/pv-r"]  # in request order (review helper-36)
    # Changed content under the same id is not a replay: it stays dropped.
    changed = identify("id-r", visitorId="vr", hemMd5="b" * 32)
    body = (await server.client.post("/v1/events", json=changed, headers=ACME)).json()
    assert (body["duplicates"], body["dropped"]) == (0, 1), body


async def test_an_identify_dropped_for_consent_leaves_its_id_to_the_batch(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The id of an identify that consent drops is not taken: an event of the batch
    # under the same id is no conflict, and a repeat after the visitor's own grant
    # in the same request is judged again.
    server = await started(nursery, tmp_path)
    denial = {"visitorId": "vd", "timestamp": STAMP, "consent": {"analytics": True, "identityResolution": False}}
    assert (await server.client.post("/v1/consent", json=denial, headers=ACME)).status_code == 202
    batch = {"events": [pageview("shared-id", visitorId="vd"), identify("shared-id", visitorId="vd"),
                        identify("again", visitorId="vd"), _transition("grant", "vd", STAMP + 1, True),
                        identify("again", visitorId="vd")]}
    response = await server.client.post("/v1/events", json=batch, headers=ACME)
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["dropped"], body["duplicates"]) == (3, 2, 0), body
    assert [(e["index"], e["reason"]) for e in body["errors"]] == [
        (1, "identity_consent_denied"), (2, "identity_consent_denied")
    ]
    assert body["ledgerKeys"] == ["acme/shared-id", "acme/grant", "acme/again"]
    stored = await stored_events(server)
    assert stored["shared-id"]["event"]["type"] == "pageview"  # type: ignore[index]
    assert "again" in stored


async def test_an_in_batch_repeat_of_a_decision_is_not_a_newer_choice(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # A transition repeated later in the batch counted as the visitor's latest
    # choice: [grant, deny, grant again, identify] stored the identify after the
    # denial, and the opposite order dropped one the visitor allowed (review helper-52).
    server = await started(nursery, tmp_path)
    denied_last = {"events": [_transition("g1", "va", STAMP, True), _transition("d1", "va", STAMP + 1, False),
                              _transition("g1", "va", STAMP, True), identify("ia", visitorId="va")]}
    body = (await server.client.post("/v1/events", json=denied_last, headers=ACME)).json()
    assert (body["accepted"], body["duplicates"], body["dropped"]) == (2, 1, 1), body
    granted_last = {"events": [_transition("d2", "vb", STAMP, False), _transition("g2", "vb", STAMP + 1, True),
                               _transition("d2", "vb", STAMP, False), identify("ib", visitorId="vb")]}
    body = (await server.client.post("/v1/events", json=granted_last, headers=ACME)).json()
    assert (body["accepted"], body["duplicates"], body["dropped"]) == (3, 1, 0), body
    stored = await stored_events(server)
    assert "ia" not in stored and "ib" in stored


async def test_consent_decisions_in_order_in_time_and_in_part(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    now = STAMP

    async def consent(body: dict[str, object], **headers: str) -> httpx.Response:
        response = await server.client.post("/v1/consent", json=body, headers={**ACME, **headers})
        assert response.status_code == 202, response.text
        return response

    async def identity_dropped(visitor: str, eid: str) -> bool:
        body = (await server.client.post("/v1/events", json=identify(eid, visitorId=visitor), headers=ACME)).json()
        return bool(body["dropped"])

    # A denial earlier in the same batch keeps a later identify of that visitor out.
    batch = {"events": [
        {"type": "_consent_transition", "_eid": "ct-b", "visitorId": "vb", "sessionId": "s1", "timestamp": now,
         "consent": {"analytics": True, "identityResolution": False}},
        identify("id-b", visitorId="vb"),
    ]}
    body = (await server.client.post("/v1/events", json=batch, headers=ACME)).json()
    assert (body["accepted"], body["dropped"]) == (1, 1)
    # A client clock a day fast does not pin the record against the real, later denial.
    await consent({"visitorId": "vf", "timestamp": now + 86_400_000,
                   "consent": {"analytics": True, "identityResolution": True}})
    await trio.sleep(0.01)
    await consent({"visitorId": "vf", "consent": {"analytics": True, "identityResolution": False}})
    assert await identity_dropped("vf", "id-f")
    # A denial from a clock an hour slow, after a grant ten minutes old, is the newest
    # decision (it was kept at its stated time and lost: found by audit helper-33);
    # a grant queued an hour ago does not undo a newer denial.
    for visitor, first, second, dropped in (("vs", True, False, True), ("vq", False, True, True)):
        await consent({"visitorId": visitor, "timestamp": now - 600_000,
                       "consent": {"analytics": True, "identityResolution": first}})
        await consent({"visitorId": visitor, "timestamp": now - 3_600_000,
                       "consent": {"analytics": True, "identityResolution": second}})
        assert await identity_dropped(visitor, f"id-{visitor}") is dropped, visitor
    # Only the identity choice is re-dated: the late decision's analytics and sharing
    # grants do not undo the newer refusals (review helper-34).
    await consent({"visitorId": "va", "timestamp": now - 60_000,
                   "consent": {"analytics": False, "thirdPartySharing": False}})
    await consent({"visitorId": "va", "timestamp": now - 3_600_000,
                   "consent": {"analytics": True, "identityResolution": False, "thirdPartySharing": True}})
    raw = await trio.to_thread.run_sync(
        lambda: read_stored(server.data_dir, "consent", consent_store.consent_key("acme", "web", "va")))
    assert raw is not None
    state = consent_store.decode_strict(raw)
    assert (state.analytics, state.third_party_sharing, state.identity_resolution) == (False, False, False), state
    # A queued denial, then the visitor's later grant, in one request: the grant is the latest.
    queued = {"events": [
        {"type": "_consent_transition", "_eid": "ct-q1", "visitorId": "vo", "sessionId": "s1",
         "timestamp": now - 600_000, "consent": {"analytics": True, "identityResolution": False}},
        {"type": "_consent_transition", "_eid": "ct-q2", "visitorId": "vo", "sessionId": "s1",
         "timestamp": now - 540_000, "consent": {"analytics": True, "identityResolution": True}},
        identify("id-vo", visitorId="vo"),
    ]}
    body = (await server.client.post("/v1/events", json=queued, headers=ACME)).json()
    assert (body["accepted"], body["dropped"]) == (3, 0), body
    assert not await identity_dropped("vo", "id-vo2")
    # ... but such a queued pair does not undo a newer recorded denial (review helper-36).
    await consent({"visitorId": "vn", "timestamp": now - 120_000,
                   "consent": {"analytics": True, "identityResolution": False}})
    pair = {"events": [
        {"type": "_consent_transition", "_eid": "ct-n1", "visitorId": "vn", "sessionId": "s1",
         "timestamp": now - 3_600_000, "consent": {"analytics": True, "identityResolution": False}},
        {"type": "_consent_transition", "_eid": "ct-n2", "visitorId": "vn", "sessionId": "s1",
         "timestamp": now - 3_000_000, "consent": {"analytics": True, "identityResolution": True}},
    ]}
    assert (await server.client.post("/v1/events", json=pair, headers=ACME)).json()["accepted"] == 2
    assert await identity_dropped("vn", "id-vn")

    # What the last choice of a request is (review helper-37): a later transition that
    # is rejected, or an in-batch repeat, does not take a late denial's receipt date;
    # a clock stepping back inside one request does not let an earlier grant win.
    def transition(eid: str, visitor: str, at: int, identity: bool, **extra: object) -> dict[str, object]:
        return {"type": "_consent_transition", "_eid": eid, "visitorId": visitor, "sessionId": "s1",
                "timestamp": at, "consent": {"analytics": True, "identityResolution": identity}, **extra}

    cases = {
        "vx": [transition("x1", "vx", now - 3_600_000, False),
               transition("x2", "vx", now - 3_000_000, True, page={"path": "/x", "title": "X"})],  # rejected
        "vd": [transition("d1", "vd", now - 3_600_000, False), transition("d1", "vd", now - 3_600_000, False)],
        "vb": [transition("b1", "vb", now - 60_000, True), transition("b2", "vb", now - 120_000, False)],
    }
    for visitor, events in cases.items():
        await consent({"visitorId": visitor, "timestamp": now - 600_000,
                       "consent": {"analytics": True, "identityResolution": True}})
        response = await server.client.post("/v1/events", json={"events": events}, headers=ACME)
        assert response.status_code == 202, response.text
        assert await identity_dropped(visitor, f"id-{visitor}"), visitor
    # An absurd consent time is the time of receipt, not a 503 for the whole request.
    wild = await server.client.post("/v1/consent", json={"visitorId": "vw", "consent": {"analytics": True,
                                                                                        "timestamp": 1e300}},
                                    headers=ACME)
    assert wild.status_code == 202, wild.text
    # A later decision that leaves identityResolution out keeps the earlier denial.
    await consent({"visitorId": "vp", "timestamp": now, "consent": {"analytics": True, "identityResolution": False}})
    await consent({"visitorId": "vp", "timestamp": now + 1, "consent": {"analytics": False}})
    assert await identity_dropped("vp", "id-p")
    # A late, older grant and a newer decision that leaves identity out, in one request, after a
    # stored denial: the denial is still the newest statement about identity.
    await consent({"visitorId": "vr", "timestamp": now, "consent": {"analytics": True,
                                                                    "identityResolution": False}})
    mixed = {"events": [
        {"type": "_consent_transition", "_eid": "ct-r1", "visitorId": "vr", "sessionId": "s1",
         "timestamp": now - 1000, "consent": {"analytics": True, "identityResolution": True}},
        {"type": "_consent_transition", "_eid": "ct-r2", "visitorId": "vr", "sessionId": "s1",
         "timestamp": now + 1000, "consent": {"analytics": True}},
        identify("id-r", visitorId="vr"),
    ]}
    body = (await server.client.post("/v1/events", json=mixed, headers=ACME)).json()
    assert (body["accepted"], body["dropped"]) == (2, 1)
    assert await identity_dropped("vr", "id-r2")
    # A visitor id of the spec's full 128 characters can record a decision (the generated id is digested).
    long_visitor = "v" * 128
    await consent({"visitorId": long_visitor, "timestamp": now, "consent": {"analytics": True,
                                                                            "identityResolution": False}})
    assert await identity_dropped(long_visitor, "id-long")
    # Without a timestamp an Idempotency-Key makes the retry a duplicate.
    undated = {"visitorId": "vk", "consent": {"analytics": True}}
    first = await consent(undated, **{"Idempotency-Key": "consent-once"})
    await trio.sleep(0.01)
    retry = await consent(undated, **{"Idempotency-Key": "consent-once"})
    assert (first.json()["accepted"], retry.json()["duplicates"]) == (1, 1)


async def test_consent_route_refusals(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    decision = {"visitorId": "v1", "consent": {"analytics": True}}
    ambiguous = await server.client.post(
        "/v1/consent", json=decision, headers={"X-API-Key": MULTI, "Origin": "http://localhost:3000"}
    )
    assert (ambiguous.status_code, ambiguous.json()["error"]) == (403, "site_scope_ambiguous")
    bound = await server.client.post(
        "/v1/consent", json=decision, headers={"X-API-Key": MULTI, "Origin": "https://b.com"}
    )
    assert bound.status_code == 202
    no_origin = await server.client.post("/v1/consent", json=decision, headers={"X-API-Key": KEY})
    assert (no_origin.status_code, no_origin.json()["error"]) == (403, "origin_required")
    missing = await server.client.post("/v1/consent", json={"visitorId": "v1"}, headers=ACME)
    assert (missing.status_code, missing.json()["error"]) == (400, "validation_error")
    no_analytics = await server.client.post(
        "/v1/consent", json={"visitorId": "v1", "consent": {"identityResolution": True}}, headers=ACME
    )
    assert (no_analytics.status_code, no_analytics.json()["error"]) == (400, "validation_error")
    broken = await server.client.post("/v1/consent", content=b"{nope", headers=ACME)
    assert (broken.status_code, broken.json()["error"]) == (400, "invalid_json")
    stored = await stored_events(server)
    assert [row["siteId"] for row in stored.values()] == ["b"]


async def test_consent_route_refuses_misspelt_choices_and_an_empty_id(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-69 #3: unknown keys inside `consent` were dropped, a misspelt denial with
    # them, and the visitor's identify was then stored. #4: `_eid: ""` was replaced by
    # a generated id, where /v1/events refuses it.
    server = await started(nursery, tmp_path)
    misspelt = {"visitorId": "vm", "timestamp": STAMP,
                "consent": {"analytics": True, "identity_resolution": False, "thirdParty": False}}
    response = await server.client.post("/v1/consent", json=misspelt, headers=ACME)
    assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
    assert [d["path"] for d in response.json()["details"]] == [
        "$.consent.identity_resolution", "$.consent.thirdParty"
    ]
    # helper-85: of several unknown top-level fields only the first was named
    extra = {**misspelt, "consent": {"analytics": True}, "visitor_id": "vm", "session": "s"}
    response = await server.client.post("/v1/consent", json=extra, headers=ACME)
    assert [d["path"] for d in response.json()["details"]] == ["$.visitor_id", "$.session"], response.text
    # one alone reads the same way, at its own path (helper-98: "$" and msgspec's wording)
    one = {**misspelt, "consent": {"analytics": True}, "page": {}}
    response = await server.client.post("/v1/consent", json=one, headers=ACME)
    assert response.json()["details"] == [{"path": "$.page", "message": "Object contains unknown field `page`"}]
    assert response.json()["message"] == "invalid consent body: $.page: Object contains unknown field `page`"
    empty_id = {"_eid": "", "visitorId": "vm", "consent": {"analytics": True, "identityResolution": False}}
    response = await server.client.post("/v1/consent", json=empty_id, headers=ACME)
    assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
    assert [d["path"] for d in response.json()["details"]] == ["$._eid"]
    as_event = {**pageview("x"), "_eid": ""}
    response = await server.client.post("/v1/events", json=as_event, headers=ACME)
    assert response.json()["details"] == (await server.client.post("/v1/consent", json=empty_id, headers=ACME)).json()["details"]
    assert await stored_events(server) == {}


async def test_privacy_floor_on_realistic_forms(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    forms = [
        form("signup", "signup-form", {"fullName": "Jane Doe", "email": EMAIL, "password": "hunter2!",
                                       "company": "Acme"},
             {"fullName": "text", "email": "email", "password": "password", "company": "text"}),
        form("contact", "contact", {"name": "Jane", "email": EMAIL, "message": "Call me about pricing"}),
        form("checkout", "order-form", {"email": EMAIL, "shipping_address": "1 Main St"},
             {"email": "email", "shipping_address": "street-address", "cardNumber": "cc-number",
              "cardExpiry": "cc-exp"}),
        form("checkout-by-id", "checkout", {"email": EMAIL}),
        form("tax", "w9", {"name": "Jane Doe", "ssn": "123-45-6789", "tin_field": "987-65-4321",
                           "annual_income": "85000", "filing_status": "single"}),
        form("medical", "patient-intake", {"name": "Jane Doe", "date_of_birth": "1990-01-01",
                                           "allergies": "penicillin", "current_medications": "none",
                                           "insurance_member_id": "XK-99321", "reason_for_visit": "checkup"}),
        form("bank", "payout-settings", {"holder": "Jane Doe", "iban": "DE89 3704 0044 0532 0130 00",
                                         "payout_note": "GB82WEST12345698765432"}),
    ]
    response = await server.client.post("/v1/events", json={"events": forms}, headers=ACME)
    assert response.status_code == 202, response.text
    body = response.json()
    dropped = {e["eid"]: e["reason"] for e in body["errors"] if e["error"] == "dropped"}
    assert dropped == {"checkout": "checkout_form", "checkout-by-id": "checkout_form"}
    stored = await stored_events(server)
    assert set(stored) == {"signup", "contact", "tax", "medical", "bank"}

    def kept(eid: str) -> set[str]:
        return set(stored[eid]["event"]["values"])  # type: ignore[index]

    def withheld(eid: str) -> dict[str, str]:
        return stored[eid]["event"].get("privacyWithheld", {})  # type: ignore[union-attr]

    assert kept("signup") == {"fullName", "email", "company"} and withheld("signup") == {"password": "secret"}
    assert kept("contact") == {"name", "email", "message"} and withheld("contact") == {}
    assert kept("tax") == {"name", "filing_status"}
    assert withheld("tax") == {"annual_income": "financial", "ssn": "government_id",
                               "tin_field": "government_id"}
    assert kept("medical") == {"name", "date_of_birth", "reason_for_visit"}
    assert set(withheld("medical").values()) == {"health"}
    assert kept("bank") == {"holder"}
    assert withheld("bank") == {"iban": "financial", "payout_note": "financial"}
    # No withheld value appears anywhere in what was stored.
    dump = json.dumps(stored)
    for secret in ("hunter2!", "123-45-6789", "987-65-4321", "penicillin", "XK-99321", "DE89", "GB82"):
        assert secret not in dump


async def test_a_card_of_another_kind_or_a_checkout_word_elsewhere_drops_no_form(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Each was dropped whole as a checkout (helper-75): a loyalty card's number, the name
    # on a badge, an ancestor's class in the selector, a survey after checkout. Their
    # card-like fields are still withheld; a real checkout is still dropped.
    server = await started(nursery, tmp_path)
    forms = [
        form("loyalty", "signup", {"email": EMAIL, "loyalty_card_number": "LC-2231"}),
        form("badge", "conference-registration", {"first_name": "Ann", "name_on_badge": "Ann K"}),
        form("intake", "patient-intake", {"name": "Ann", "insurance_card_number": "XK-1"}),
        form("survey", "checkoutSurvey", {"rating": "5"}),
        form("after", "post-checkout-signup", {"email": EMAIL}),
        form("newsletter", "nl", {"email": EMAIL}, form_selector="div.checkout-page > form#newsletter"),
        form("pay", "pay", {"email": EMAIL, "name_on_card": "Ann K"}),
        form("ancestor", "f1", {"email": EMAIL}, form_selector="div#checkout form"),
    ]
    response = await server.client.post("/v1/events", json={"events": forms}, headers=ACME)
    assert response.status_code == 202, response.text
    dropped = {e["eid"]: e["reason"] for e in response.json()["errors"] if e["error"] == "dropped"}
    assert dropped == {"pay": "checkout_form", "ancestor": "checkout_form"}
    stored = await stored_events(server)
    assert stored["loyalty"]["event"]["privacyWithheld"] == {"loyalty_card_number": "payment"}  # type: ignore[index]
    assert stored["badge"]["event"]["privacyWithheld"] == {"name_on_badge": "payment"}  # type: ignore[index]
    assert set(stored) >= {"survey", "after", "newsletter", "intake"}


async def test_privacy_floor_reads_run_together_names_and_multi_token_types(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await started(nursery, tmp_path)
    forms = [
        form("cvv", "profile", {"CVVCode": "cvv-987-secret"}),  # a CVV field makes it a checkout
        form("caps", "PAYMENTFORM", {"email": EMAIL}),
        form("autocomplete", "signup", {"f1": "csc-435-secret"}, {"f1": "section-pay cc-csc"}),
        form("account", "profile", {"accountnumber": "acct-12345678", "SSNNumber": "ssn-078051120", "nick": "jd"},
             {"accountnumber": "text", "SSNNumber": "text", "nick": "text"}),
        form("login", "login", {"user": "jd", "pw": "hunter2!"}, {"user": "username", "pw": "current-password webauthn"}),
    ]
    body = (await server.client.post("/v1/events", json={"events": forms}, headers=ACME)).json()
    dropped = {e["eid"]: e["reason"] for e in body["errors"] if e["error"] == "dropped"}
    assert dropped == {"cvv": "checkout_form", "caps": "checkout_form", "autocomplete": "checkout_form"}
    stored = await stored_events(server)
    assert set(stored["account"]["event"]["values"]) == {"nick"}  # type: ignore[index]
    assert set(stored["login"]["event"]["values"]) == {"user"}  # type: ignore[index]
    dump = json.dumps(stored)
    # (distinctive values: short digit strings turn up in timestamps and receipt ids)
    for secret in ("cvv-987", "csc-435", "acct-12345678", "ssn-078051120", "hunter2!"):
        assert secret not in dump


async def test_privacy_floor_reads_names_in_other_languages(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    forms = [
        form("alta", "registro", {"nombre": "Ana", "contraseña": "clave-secreta-1", "niño": "Pablo",
                                  "acepto_tratamiento_de_datos": "si"}),
        form("compte", "profil", {"prénom": "Léa", "mot_de_passe": "motsecret-2",
                                  "numéro de sécurité sociale": "secu-2850178", "compte_bancaire": "rib-30004"}),
        form("pago", "pedido", {"correo": EMAIL, "numero_de_tarjeta": "tarjeta-4111"}),
        form("socio", "club", {"nombre": "Ana", "numero_tarjeta_fidelidad": "fidelidad-778"}),
    ]
    body = (await server.client.post("/v1/events", json={"events": forms}, headers=ACME)).json()
    dropped = {e["eid"]: e["reason"] for e in body["errors"] if e["error"] == "dropped"}
    assert dropped == {"pago": "checkout_form"}
    stored = await stored_events(server)
    assert stored["alta"]["event"]["privacyWithheld"] == {"contraseña": "secret"}  # type: ignore[index]
    assert set(stored["alta"]["event"]["values"]) == {"nombre", "niño", "acepto_tratamiento_de_datos"}  # type: ignore[index]
    assert stored["compte"]["event"]["privacyWithheld"] == {  # type: ignore[index]
        "compte_bancaire": "financial", "mot_de_passe": "secret", "numéro de sécurité sociale": "government_id"}
    assert stored["socio"]["event"]["privacyWithheld"] == {"numero_tarjeta_fidelidad": "payment"}  # type: ignore[index]
    dump = json.dumps(stored, ensure_ascii=False)
    for secret in ("clave-secreta-1", "motsecret-2", "secu-2850178", "rib-30004", "tarjeta-4111", "fidelidad-778"):
        assert secret not in dump


async def test_sealed_at_rest_and_the_audited_reveal(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    events = [form("contact", "contact", {"email": EMAIL, "message": "hello there"}), identify("who")]
    response = await server.client.post("/v1/events", json={"events": events}, headers=ACME)
    assert response.json()["accepted"] == 2
    receipts = dict(zip(["contact", "who"], response.json()["receiptIds"], strict=True))
    dump = (await trio.to_thread.run_sync(lambda: run_cli("outbox", "dump", data_dir=server.data_dir))).stdout
    assert EMAIL not in dump and "hello there" not in dump and "415 555" not in dump
    rows = {row["eid"]: row["event"] for row in map(json.loads, dump.splitlines())}
    assert rows["contact"]["values"]["email"].startswith("enc:v1:k1:")
    assert rows["who"]["rawEmail"].startswith("enc:v1:k1:") and rows["who"]["hem"] == HEM
    key_file = server.data_dir / "field-keys.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    def cli(*args: str, check: bool = True):
        return run_cli(*args, data_dir=server.data_dir, check=check)

    refused = await trio.to_thread.run_sync(lambda: cli("reveal", receipts["who"], "--reason", "x", check=False))
    assert refused.returncode == 2 and EMAIL not in refused.stdout
    invisible = await trio.to_thread.run_sync(
        lambda: cli("reveal", receipts["who"], "--reason", "\u200b" * 8 + " \u00a0", check=False))
    assert invisible.returncode == 2 and EMAIL not in invisible.stdout
    unknown = await trio.to_thread.run_sync(
        lambda: cli("reveal", "rcpt_00000000ffffffffffff", "--reason", "support ticket 42", check=False))
    assert unknown.returncode == 2 and "no stored event" in unknown.stderr
    # Who is the real uid's account, not what LOGNAME says; SUDO_USER is only recorded as a claim.
    shown = await trio.to_thread.run_sync(lambda: run_cli(
        "reveal", receipts["who"], "--reason", "support ticket 42", data_dir=server.data_dir,
        env={"LOGNAME": "innocent_intern", "USER": "innocent_intern", "SUDO_USER": "someone_else"}))
    revealed = json.loads(shown.stdout)["event"]
    assert (revealed["rawEmail"], revealed["rawPhone"]) == (EMAIL, "+1 415 555 0100")
    shown = await trio.to_thread.run_sync(lambda: cli("reveal", receipts["contact"], "--reason", "GDPR access req"))
    assert json.loads(shown.stdout)["event"]["values"] == {"email": EMAIL, "message": "hello there"}
    audit = await trio.to_thread.run_sync(lambda: cli("audit", "list"))
    entries = [json.loads(line) for line in audit.stdout.splitlines()]
    assert [(e["seq"], e["receipt_id"], e["reason"]) for e in entries] == [
        (1, receipts["who"], "support ticket 42"), (2, receipts["contact"], "GDPR access req")]
    assert entries[0]["fields"] == ["rawEmail", "rawPhone"] and entries[1]["prev_hash"] == entries[0]["hash"]
    assert entries[0]["who"].startswith(f"{pwd.getpwuid(os.getuid()).pw_name} (uid {os.getuid()})")
    assert "innocent_intern" not in entries[0]["who"]
    if os.getuid() == 0:  # a sudo user is only ever a claim from the environment
        assert "SUDO_USER='someone_else' (from the environment)" in entries[0]["who"]
    else:
        assert "someone_else" not in entries[0]["who"]
    # The audit log names fields, never values; `collector check` verifies its chain.
    assert EMAIL not in audit.stdout
    assert json.loads((await trio.to_thread.run_sync(lambda: cli("check"))).stdout)["problems"] == []


async def test_rotated_field_key_still_reveals_old_values(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    response = await server.client.post("/v1/events", json=identify("old"), headers=ACME)
    receipt = response.json()["receiptIds"][0]
    rotated = await trio.to_thread.run_sync(
        lambda: run_cli("keys", "rotate-field-key", data_dir=server.data_dir))
    assert rotated.stdout.strip() == "k2"
    shown = await trio.to_thread.run_sync(
        lambda: run_cli("reveal", receipt, "--reason", "rotation check", data_dir=server.data_dir))
    assert json.loads(shown.stdout)["event"]["rawEmail"] == EMAIL


async def test_the_stored_idempotency_hash_is_keyed_and_outlives_a_key_rotation(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-128: the record held xxh3_128 of the event as sent: with the data file alone
    # (or a backup without the key file), the outbox's other fields and a guess of the
    # sealed phone number gave that hash back in 200 guesses.
    server = await started(nursery, tmp_path)
    who = {**identify("keyed"), "rawPhone": "+1 415 555 0199"}
    assert (await server.client.post("/v1/events", json=who, headers=ACME)).json()["accepted"] == 1
    key = idempotency.ledger_key("acme", "keyed")
    record = idempotency.decode(read_stored(server.data_dir, "idempotency", key) or b"")
    assert record.hash_form == idempotency.HASHED_KEYED
    # The attacker's guess, hashed as the previous versions did, finds nothing.
    context = IngestContext(client_id="acme", site_id="web", key_type="browser", production=True, now_ms=0)
    guessed = prepare_batch(json.dumps(who).encode(), context).accepted[0]
    assert guessed.hashed_event is not None
    unkeyed = unkeyed_event_hashes(guessed.hashed_event)
    assert record.content_hash not in {*unkeyed, guessed.content_hash}
    assert (await server.client.post("/v1/events", json=who, headers=ACME)).json()["duplicates"] == 1
    # The hash key comes from the oldest field key: a rotation leaves retries duplicates.
    await trio.to_thread.run_sync(lambda: run_cli("keys", "rotate-field-key", data_dir=server.data_dir))
    server.cancel.cancel()
    await trio.sleep(0.5)  # (its storage closed)
    (tmp_path / "again").mkdir()
    again = await start_server(nursery, tmp_path / "again", TENANTS, data_dir=str(server.data_dir))
    retry = await again.client.post("/v1/events", json=who, headers=ACME)
    assert (retry.json()["accepted"], retry.json()["duplicates"]) == (0, 1), retry.text
    changed = await again.client.post("/v1/events", json={**who, "rawPhone": "+1 415 555 0198"}, headers=ACME)
    assert changed.json()["error"] == "idempotency_conflict", changed.text
    # A record a version before the keyed hash stored (unkeyed, as written) still matches.
    earlier = idempotency.encode_fields((unkeyed[0], record.receipt_id, record.stored_ms, 1))
    await trio.to_thread.run_sync(lambda: rewrite_stored(server.data_dir, "idempotency", key, value=earlier))
    retry = await again.client.post("/v1/events", json=who, headers=ACME)
    assert (retry.json()["accepted"], retry.json()["duplicates"]) == (0, 1), retry.text
    changed = await again.client.post("/v1/events", json={**who, "rawPhone": "+1 415 555 0198"}, headers=ACME)
    assert changed.json()["error"] == "idempotency_conflict", changed.text


async def test_backup_and_restore_keep_sealed_values_revealable(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    response = await server.client.post("/v1/events", json=identify("kept"), headers=ACME)
    receipt = response.json()["receiptIds"][0]

    def cli(*args: str, data_dir: Path, check: bool = True):
        return run_cli(*args, data_dir=data_dir, check=check)

    plain, keyed = tmp_path / "plain-backup", tmp_path / "keyed-backup"
    await trio.to_thread.run_sync(lambda: cli("backup", str(plain), data_dir=server.data_dir))
    await trio.to_thread.run_sync(
        lambda: cli("backup", str(keyed), "--with-field-keys", data_dir=server.data_dir))
    assert not (plain / "field-keys.json").exists()
    assert stat.S_IMODE((keyed / "field-keys.json").stat().st_mode) == 0o600
    # A backup with its keys restores anywhere and still reveals.
    elsewhere = tmp_path / "elsewhere"
    await trio.to_thread.run_sync(lambda: cli("restore", str(keyed), data_dir=elsewhere))
    shown = await trio.to_thread.run_sync(
        lambda: cli("reveal", receipt, "--reason", "restore drill", data_dir=elsewhere))
    assert json.loads(shown.stdout)["event"]["rawEmail"] == EMAIL
    # Restoring a keyless backup over a directory keeps that directory's key file.
    await trio.to_thread.run_sync(lambda: cli("restore", str(plain), "--force", data_dir=elsewhere))
    shown = await trio.to_thread.run_sync(
        lambda: cli("reveal", receipt, "--reason", "second restore drill", data_dir=elsewhere))
    assert json.loads(shown.stdout)["event"]["rawEmail"] == EMAIL


async def test_one_decision_sent_to_two_properties_is_recorded_for_both(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The generated id was tenant-wide (consent:<visitor>:<timestamp>) while the
    # record is per property: a CMP syncing one denial to every property had it
    # swallowed as a duplicate at the second, which then stored identity values.
    server = await started(nursery, tmp_path)
    decision = {"visitorId": "v1", "timestamp": STAMP, "consent": {"analytics": True, "identityResolution": False}}
    for origin in ("https://a.com", "https://b.com"):
        headers = {"X-API-Key": MULTI, "Origin": origin}
        body = (await server.client.post("/v1/consent", json=decision, headers=headers)).json()
        assert (body["accepted"], body["duplicates"]) == (1, 0), (origin, body)
        body = (await server.client.post("/v1/events", json=identify(f"id-{origin[8]}"), headers=headers)).json()
        assert (body["accepted"], body["dropped"]) == (0, 1), (origin, body)
    # (a retry at either property is still a duplicate)
    again = await server.client.post("/v1/consent", json=decision, headers={"X-API-Key": MULTI, "Origin": "https://b.com"})
    assert again.json()["duplicates"] == 1
    assert [eid.rsplit(":", 1)[0] for eid in sorted(await stored_events(server))] == [
        f"consent:v1:{STAMP}:a", f"consent:v1:{STAMP}:b"
    ]


async def test_a_client_chosen_consent_id_sent_to_another_property_is_a_conflict(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-88: the id (an Idempotency-Key or _eid) is tenant-wide and the record per
    # property: the second property's decision was reported a duplicate, left unrecorded,
    # and an identify there was stored for a visitor who had denied it.
    server = await started(nursery, tmp_path)
    decision = {"visitorId": "vk", "consent": {"analytics": True, "identityResolution": False}}
    for extra, headers in (({}, {"Idempotency-Key": "ck-1"}), ({"_eid": "ce-1"}, {})):
        at_a = {"X-API-Key": MULTI, "Origin": "https://a.com", **headers}
        at_b = {**at_a, "Origin": "https://b.com"}
        first = await server.client.post("/v1/consent", json={**decision, **extra}, headers=at_a)
        assert first.json()["accepted"] == 1, first.text
        retry = await server.client.post("/v1/consent", json={**decision, **extra}, headers=at_a)
        assert retry.json()["duplicates"] == 1, retry.text
        elsewhere = await server.client.post("/v1/consent", json={**decision, **extra}, headers=at_b)
        assert (elsewhere.status_code, elsewhere.json()["error"]) == (409, "idempotency_conflict"), elsewhere.text
    assert len(await stored_events(server)) == 2
    # A record of the previous version hashed the request alone, without its property: it
    # matched the same id sent to any property (helper-91). Made so here, it is a 409 there too.
    old = {**decision, "_eid": "ce-old"}
    at_a = {"X-API-Key": MULTI, "Origin": "https://a.com"}
    assert (await server.client.post("/v1/consent", json=old, headers=at_a)).json()["accepted"] == 1
    key = idempotency.ledger_key("multi", "ce-old")
    record = idempotency.decode(read_stored(server.data_dir, "idempotency", key) or b"")
    request_alone = xxhash.xxh3_128_digest(content_identities(msgspec.json.decode(json.dumps(old), type=ConsentBody))[0])
    earlier = msgspec.msgpack.encode((request_alone, record.receipt_id, record.stored_ms))
    await trio.to_thread.run_sync(lambda: rewrite_stored(server.data_dir, "idempotency", key, value=earlier))
    at_b = {**at_a, "Origin": "https://b.com"}
    elsewhere = await server.client.post("/v1/consent", json=old, headers=at_b)
    assert (elsewhere.status_code, elsewhere.json()["error"]) == (409, "idempotency_conflict"), elsewhere.text


async def test_different_decisions_at_one_timestamp_are_each_recorded_and_the_later_wins(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-69 #2: the generated id was consent:<visitor>:<int(timestamp)>:<site>, blind to
    # content: a second, different decision with the same timestamp (or one differing in a
    # fraction of a millisecond) was a 409 idempotency_conflict, and lost.
    server = await started(nursery, tmp_path)

    def decision(identity: bool, at: float = STAMP, **extra: object) -> dict[str, object]:
        return {"visitorId": "tie1", "timestamp": at, "consent": {"analytics": True, "identityResolution": identity},
                **extra}

    async def send(body: dict[str, object]) -> tuple[int, int]:
        response = await server.client.post("/v1/consent", json=body, headers=ACME)
        assert response.status_code == 202, response.text
        return response.json()["accepted"], response.json()["duplicates"]

    async def identify_stored(eid: str) -> bool:
        body = (await server.client.post("/v1/events", json=identify(eid, visitorId="tie1"), headers=ACME)).json()
        return bool(body["accepted"])

    assert await send(decision(True)) == (1, 0)
    assert await send(decision(False)) == (1, 0)
    assert await send(decision(False)) == (0, 1)  # an exact retry is still a duplicate
    assert await send(decision(True)) == (0, 1)
    assert not await identify_stored("id-tie-1")  # the later arrival wins the tie
    assert await send(decision(True, sessionId="s2")) == (1, 0)
    assert await identify_stored("id-tie-2")
    assert await send(decision(False, STAMP + 0.25)) == (1, 0)
    assert await send(decision(True, STAMP + 0.75)) == (1, 0)
    ids = [eid for eid in await stored_events(server) if eid.startswith("consent:")]
    assert len(ids) == 5 and len(set(ids)) == 5


async def test_untimed_decisions_in_one_millisecond_are_each_recorded(nursery: trio.Nursery, tmp_path: Path) -> None:
    # Their id came from the time of receipt alone: a second, different decision
    # within the same millisecond was a 409 idempotency_conflict, and lost.
    server = await started(nursery, tmp_path)
    server.clock.fixed = STAMP / 1000
    for analytics, identity in ((True, True), (True, False), (True, False)):
        decision = {"visitorId": "v1", "consent": {"analytics": analytics, "identityResolution": identity}}
        response = await server.client.post("/v1/consent", json=decision, headers=ACME)
        assert response.status_code == 202 and response.json()["accepted"] == 1, response.text
    assert len(await stored_events(server)) == 3


async def _behind_a_held_writer(server: RunningServer, *requests: tuple[str, object]) -> list[dict[str, Any]]:
    """POST each (path, body) in turn while another process holds LMDB's writer lock, then release it.

    The requests are prepared (their consent records read) and wait in the
    writer's queue in this order; they then commit in one group.
    """
    holder = subprocess.Popen(  # noqa: ASYNC220 (starting it does not block; its exit is awaited below)
        [sys.executable, "-c", "import lmdb, sys\n"
         "env = lmdb.open(sys.argv[1], max_dbs=64)\ntxn = env.begin(write=True)\nprint('held', flush=True)\n"
         "sys.stdin.readline()\ntxn.abort()", str(server.data_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdin is not None and holder.stdout is not None
    assert await trio.to_thread.run_sync(holder.stdout.readline) == "held\n"
    answers: dict[int, httpx.Response] = {}

    async def post(position: int, path: str, body: object) -> None:
        answers[position] = await server.client.post(path, json=body, headers=ACME)

    async with trio.open_nursery() as posting:
        for position, (path, body) in enumerate(requests):
            posting.start_soon(post, position, path, body)
            await trio.sleep(0.3)  # prepared, and queued behind the held lock
        holder.stdin.write("\n")
        holder.stdin.flush()
    await trio.to_thread.run_sync(lambda: holder.wait(timeout=10))
    return [answers[position].json() for position in range(len(requests))]


def _decision(visitor: str, at: int, identity: bool) -> dict[str, object]:
    return {"visitorId": visitor, "timestamp": at, "consent": {"analytics": True, "identityResolution": identity}}


def _transition(eid: str, visitor: str, at: int, identity: bool) -> dict[str, object]:
    return {"type": "_consent_transition", "_eid": eid, "visitorId": visitor, "sessionId": "s1", "timestamp": at,
            "consent": {"analytics": True, "identityResolution": identity}}


async def test_an_identify_admitted_after_a_denial_committed_is_dropped(nursery: trio.Nursery, tmp_path: Path) -> None:
    # The request reads the visitor's consent record before admission: a denial
    # still in flight then committed first and the identify was stored anyway
    # (review helper-47: 12 of 200 concurrent pairs). Admission checks again.
    server = await started(nursery, tmp_path)
    denial, body = await _behind_a_held_writer(
        server,
        ("/v1/consent", _decision("v1", STAMP, False)),
        ("/v1/events", {"events": [identify("id-1"), identify("id-2", visitorId="v2")]}),
    )
    assert denial["accepted"] == 1
    assert (body["accepted"], body["dropped"], body["duplicates"]) == (1, 1, 0), body
    assert [(e["index"], e["reason"]) for e in body["errors"]] == [(0, "identity_consent_denied")], body
    assert len(body["receiptIds"]) == 1 and len(body["ledgerKeys"]) == 1
    stored = await stored_events(server)
    assert "id-1" not in stored and "id-2" in stored


async def test_the_recheck_weighs_the_requests_own_choice_by_time(nursery: trio.Nursery, tmp_path: Path) -> None:
    # Review helper-49: a request carrying any identity choice for the visitor
    # skipped the check, so an older grant in it let the identify through a
    # newer committed denial. And an in-batch repeat of the dropped identify was
    # reported as a stored duplicate with an empty receipt.
    server = await started(nursery, tmp_path)
    minute = 60_000
    now = int(time.time() * 1000)  # (not STAMP: past 5 minutes old, a slow suite's, a denial is re-dated)
    _, stale, newer = await _behind_a_held_writer(
        server,
        ("/v1/consent", _decision("v1", now - 2 * minute, False)),
        ("/v1/events", {"events": [_transition("grant-old", "v1", now - 3 * minute, True),
                                   identify("id-stale"), identify("id-stale")]}),
        ("/v1/events", {"events": [_transition("grant-new", "v1", now - minute, True), identify("id-newer")]}),
    )
    assert (stale["accepted"], stale["dropped"], stale["duplicates"]) == (1, 2, 0), stale
    assert [(e["index"], e["reason"]) for e in stale["errors"]] == [
        (1, "identity_consent_denied"), (2, "identity_consent_denied")
    ]
    assert stale["receiptIds"] == [stale["receiptIds"][0]] and stale["receiptIds"][0]
    assert (newer["accepted"], newer["dropped"]) == (2, 0), newer
    stored = await stored_events(server)
    assert "id-stale" not in stored and {"grant-old", "id-newer", "grant-new"} <= set(stored)


async def test_an_email_or_phone_in_clear_in_identity_is_refused_not_stored(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 2.3: identity carries hashed values. An address or an international number
    # in clear there was stored as sent, beside a sealed rawEmail (helper-75).
    server = await started(nursery, tmp_path)
    clear = identify("clear", identity={"phone": "+1 415 555 0177", "email": "henry.identity@ex.org",
                                        "crm": "12345678"})
    response = await server.client.post("/v1/events", json=clear, headers=ACME)
    assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
    assert [d["path"] for d in response.json()["details"]] == ["$.identity.email", "$.identity.phone"]
    # URL-encoded, as a campaign parameter copied from a link has them (helper-128: stored)
    encoded = identify("encoded", identity={"utm_term": "henry.identity%40ex.org",
                                            "campaign": {"to": "tel%3A%2B1%20415%20555%200177"},
                                            "form": "p=%2B1+415+555+0177",  # (`+` a space: helper-140)
                                            "uri": "+1%20415%20555%200177",  # (`+` itself: helper-141)
                                            "twice": "henry.identity%2540ex.org", "share": "100%25 off"})
    response = await server.client.post("/v1/events", json=encoded, headers=ACME)
    assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
    assert [d["path"] for d in response.json()["details"]] == [
        "$.identity.campaign.to", "$.identity.form", "$.identity.twice", "$.identity.uri", "$.identity.utm_term"]
    hashed = identify("hashed", identity={"phoneSha256": "a" * 64, "crm": "12345678", "gclid": "Cj0KCQ",
                                          "utm_content": "50%25%20off%20shoes", "ref": "%E2%9C%93"})
    response = await server.client.post("/v1/events", json=hashed, headers=ACME)
    assert response.json()["accepted"] == 1, response.text
    dump = json.dumps(await stored_events(server))
    assert "henry.identity" not in dump and "555 0177" not in dump and "0177" not in dump
    # A form's field names are stored as sent (its values sealed): one holding an address
    # or a number was stored in clear (helper-128). Refused without repeating it.
    for index, extra in enumerate(({"values": {"answer[MKRK_jane.roe@example.com]": "yes"}},
                                   {"values": {"a": "b"}, "raw_fields": json.dumps({"tel +1 415 555 0166": "text"})},
                                   {"values": {"a": "b"}, "files": [{"name": "cv.pdf", "field": "cv_of_x@ex.org"}]})):
        named = form(f"named{index}", "survey", {"a": "b"}, **{k: v for k, v in extra.items() if k != "values"})
        named["values"] = extra["values"]
        if "raw_fields" in extra:
            named["raw_fields"] = extra["raw_fields"]
        response = await server.client.post("/v1/events", json=named, headers=ACME)
        assert (response.status_code, response.json()["error"]) == (400, "validation_error"), response.text
        assert "MKRK" not in response.text and "0166" not in response.text and "ex.org" not in response.text
    dump = json.dumps(await stored_events(server))
    assert "MKRK" not in dump and "0166" not in dump and "cv_of_x" not in dump
    ordinary = form("named-fine", "survey", {"email": "x", "phone_number": "y", "answer[3]": "z"})
    assert (await server.client.post("/v1/events", json=ordinary, headers=ACME)).json()["accepted"] == 1
