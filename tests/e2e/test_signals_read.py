"""Visitor snapshots, GET /v1/signals/:visitorId, through the real server (spec 2.6, 4.2, 5, 7, 8).

Every case runs the real collector on 127.0.0.1, posts events to POST
/v1/events, waits (bounded) for the visitor projection to fold them and reads
the snapshot over HTTP. The contract is the signals contract: check order,
coverage metering, the full and the degraded snapshot, and the scores.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import RunningServer, pageview, start_server
from tests.helpers import rewrite_stored

FREE = "cs_live_sigfree00000"
PAID = "cs_live_sigpaid00000"
MOBILE = "cs_mob_live_sigapp0000"
SERVER = "cs_srv_live_sigsrv0000"
SUSPENDED = "cs_live_sigsusp00000"
MULTI = "cs_live_sigmulti0000"
SLOW = "cs_live_sigslow00000"
TINY = "cs_live_sigtiny00000"
OVERAGE = "cs_live_sigover00000"
NODOMAIN = "cs_live_signodom0000"
READONLY = "cs_live_sigread00000"
STRICT = "cs_live_sigstrict0000"

FREE_ORIGIN = {"Origin": "https://acme.com"}
PAID_ORIGIN = {"Origin": "https://bigco.com"}

TENANTS: dict[str, object] = {
    "keys": [
        {"key": FREE, "clientId": "acme", "plan": "free", "rateLimit": 100,
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": PAID, "clientId": "bigco", "plan": "paid", "rateLimit": 5000,
         "sites": [{"siteId": "shop", "domains": ["bigco.com"]}]},
        {"key": MOBILE, "clientId": "acme", "plan": "free", "rateLimit": 50, "keyType": "mobile",
         "sites": [{"siteId": "app"}]},
        {"key": SERVER, "clientId": "backend", "plan": "paid", "rateLimit": 1000, "keyType": "server",
         "sites": [{"siteId": "backend"}]},
        {"key": SUSPENDED, "clientId": "gone", "plan": "paid", "suspended": True,
         "sites": [{"siteId": "web", "domains": ["gone.com"]}]},
        {"key": MULTI, "clientId": "multi", "plan": "free", "rateLimit": 5000,
         "sites": [{"siteId": "main", "domains": ["multi.com"]},
                   {"siteId": "store", "domains": ["store.example"], "plan": "paid"}]},
        {"key": SLOW, "clientId": "slow", "plan": "free", "rateLimit": 0.1,
         "sites": [{"siteId": "web", "domains": ["slow.com"]}]},
        {"key": TINY, "clientId": "tiny", "plan": "free", "rateLimit": 100,
         "sites": [{"siteId": "tiny", "domains": ["tiny.com"]}],
         "contract": {"signalsCoverage": 3}},
        {"key": OVERAGE, "clientId": "over", "plan": "paid", "overage": True, "rateLimit": 1000,
         "sites": [{"siteId": "over", "domains": ["over.com"]}],
         "contract": {"signalsCoverage": 1, "coverageCeiling": 3}},
        {"key": NODOMAIN, "clientId": "nodom", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "nodom"}]},
        {"key": READONLY, "clientId": "acme", "plan": "free", "rateLimit": 100,
         "permissions": ["events:read"], "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": STRICT, "clientId": "strict", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "eu", "domains": ["strict.eu"], "strictConsent": True}]},
    ]
}

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
          " Chrome/131.0.0.0 Safari/537.36")
GPTBOT = ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; GPTBot/1.2;"
          " +https://openai.com/gptbot")
HEM = "a" * 64
COVERAGE_HEADERS = (
    "X-Service-Signals-Coverage-Period",
    "X-Service-Signals-Coverage-Limit",
    "X-Service-Signals-Coverage-Used",
    "X-Service-Signals-Coverage-Ceiling",
    "X-Service-Signals-Coverage-Mode",
)
RATE_HEADERS = (
    "X-RateLimit-Limit", "X-RateLimit-Burst-Limit", "X-RateLimit-Policy", "X-RateLimit-Scope",
    "X-RateLimit-Unit", "X-RateLimit-Remaining", "X-RateLimit-Burst-Remaining", "X-RateLimit-Reset",
)
SNAPSHOT_KEYS = {
    "visitorId", "siteId", "sessionId", "coverageMode", "pending", "stale", "behavioralClass",
    "bot", "scores", "activity", "engagement", "asOf",
}
ACTIVITY_KEYS = {
    "events", "pageviews", "clicks", "scrolls", "forms", "customs", "identifies", "rageClicks",
    "firstSeen", "lastSeen",
}


async def started(nursery: trio.Nursery, tmp_path: Path, **overrides: object) -> RunningServer:
    return await start_server(nursery, tmp_path, TENANTS, **overrides)


def device(user_agent: str = FIREFOX, **extra: object) -> dict[str, object]:
    return {"userAgent": user_agent, "viewport": {"width": 1280, "height": 800}, **extra}


def event(eid: str, kind: str, visitor: str, *, at: int | None = None, ua: str = FIREFOX,
          session: str = "s1", **extra: object) -> dict[str, object]:
    """One event of `kind` for `visitor`, with client timestamp `at` (ms)."""
    base = pageview(eid, visitorId=visitor, sessionId=session, device=device(ua),
                    timestamp=at if at is not None else int(time.time() * 1000))
    base["type"] = kind
    if kind == "click":
        base["element"] = {"selector": "button.buy", "text": "Buy", "x": 10, "y": 20}
    elif kind == "scroll":
        base.update(depth=25, timeOnPage=3.5)
    elif kind == "form":
        base.update(action="submit", formId="signup", fieldCount=2)
    elif kind == "custom":
        base.update(name="add_to_cart")
    elif kind == "identify":
        base.update(hem=HEM)
    base.update(extra)
    return base


async def post(server: RunningServer, key: str, events: list[dict[str, object]],
               **headers: str) -> httpx.Response:
    response = await server.client.post(
        "/v1/events", json={"events": events}, headers={"X-API-Key": key, **headers}
    )
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == len(events), response.text
    return response


async def folded(server: RunningServer) -> None:
    """Wait (bounded) until the visitor projection has folded every committed event."""
    deadline = trio.current_time() + 10
    while trio.current_time() < deadline:
        if "collector_visitor_projection_lag 0.0" in (await server.client.get("/metrics")).text:
            return
        await trio.sleep(0.05)
    raise AssertionError("the visitor projection did not catch up within 10 s")


async def read(server: RunningServer, visitor: str, *, key: str | None = None,
               session: str | None = "s1", query_key: str | None = None,
               method: str = "GET", **headers: str) -> httpx.Response:
    params = {}
    if session is not None:
        params["sessionId"] = session
    if query_key is not None:
        params["key"] = query_key
    sent = dict(headers)
    if key is not None:
        sent["X-API-Key"] = key
    return await server.client.request(method, f"/v1/signals/{visitor}", params=params, headers=sent)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict), body
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    assert response.headers.get("X-Request-ID"), dict(response.headers)
    return body


def used(response: httpx.Response) -> int:
    return int(response.headers["X-Service-Signals-Coverage-Used"])


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def now_ms(server: RunningServer) -> int:
    return int(server.clock() * 1000)


# --- the full snapshot -------------------------------------------------------------------------


async def test_full_snapshot_after_the_fold(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    t0 = int(time.time() * 1000)
    before = now_ms(server)
    events = [
        event("f-pv1", "pageview", "v-full", at=t0),
        event("f-pv2", "pageview", "v-full", at=t0 + 10_000),
        # clicks 5 s apart: no burst, no rage clicks
        event("f-c1", "click", "v-full", at=t0 + 20_000),
        event("f-c2", "click", "v-full", at=t0 + 25_000),
        event("f-c3", "click", "v-full", at=t0 + 30_000),
        event("f-sc", "scroll", "v-full", at=t0 + 35_000),
        event("f-fm", "form", "v-full", at=t0 + 40_000),
        event("f-cu", "custom", "v-full", at=t0 + 45_000),
        event("f-id", "identify", "v-full", at=t0 + 50_000),
    ]
    await post(server, PAID, events, **PAID_ORIGIN)
    await folded(server)
    response = await read(server, "v-full", key=PAID, session="s-full", **PAID_ORIGIN)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json()
    assert set(body) == SNAPSHOT_KEYS, body
    assert body["visitorId"] == "v-full"
    assert body["siteId"] == "shop"
    assert body["sessionId"] == "s-full"
    assert body["coverageMode"] == "full"
    assert body["pending"] is False
    assert body["stale"] is False
    assert body["behavioralClass"] == "human"
    assert body["bot"] == {"isBot": False, "category": "human", "score": 0}
    assert set(body["scores"]) == {"frustration", "conversionReadiness", "humanConfidence"}
    assert all(is_number(v) for v in body["scores"].values()), body["scores"]
    # 2 pageviews x 10 + 1 scroll milestone x 5 + 20 for a form + 30 for an identify
    assert body["scores"] == {"frustration": 0, "conversionReadiness": 75, "humanConfidence": 100}
    activity = body["activity"]
    assert set(activity) == ACTIVITY_KEYS, activity
    assert all(type(v) is int for v in activity.values()), activity
    assert {k: v for k, v in activity.items() if k not in ("firstSeen", "lastSeen")} == {
        "events": 9, "pageviews": 2, "clicks": 3, "scrolls": 1, "forms": 1, "customs": 1,
        "identifies": 1, "rageClicks": 0,
    }
    assert before - 1000 <= activity["firstSeen"] <= activity["lastSeen"] <= body["asOf"]
    assert type(body["asOf"]) is int and abs(body["asOf"] - now_ms(server)) < 60_000
    # the admitting group folded its own events as it committed: no catch-up pass ran
    metrics = (await server.client.get("/metrics")).text
    assert "collector_visitor_fold_at_commit_groups 1.0" in metrics, metrics
    assert "collector_visitor_fold_at_commit_events 9.0" in metrics, metrics
    assert "collector_visitor_projection_passes 0.0" in metrics, metrics


async def test_scroll_depth_and_time_on_page(nursery: trio.Nursery, tmp_path: Path) -> None:
    # Spec 2.3: the server derives scroll depth and time on page from the later
    # scroll events of the session; a page is a path within a session.
    server = await started(nursery, tmp_path)
    t0 = int(time.time() * 1000)

    def on(path: str, session: str = "s1") -> dict[str, object]:
        return {"page": {"url": f"https://bigco.com{path}", "path": path, "title": path}, "sessionId": session}

    await post(server, PAID, [
        event("e-pv1", "pageview", "reader", at=t0, **on("/a")),
        event("e-s1", "scroll", "reader", at=t0 + 3_000, depth=25, timeOnPage=3_000, **on("/a")),
        event("e-s2", "scroll", "reader", at=t0 + 9_000, depth=50, timeOnPage=9_000, **on("/a")),
    ], **PAID_ORIGIN)
    await folded(server)
    body = (await read(server, "reader", key=PAID, **PAID_ORIGIN)).json()
    assert body["engagement"] == {
        "scrollDepth": 50, "timeOnPageMs": 9_000, "averageScrollDepth": 50, "totalTimeOnPageMs": 9_000, "pages": 1,
    }
    # A second tab opens /b; the scroll of /a arriving later is still /a's, and /b's
    # scroll arriving before its pageview is /b's.
    await post(server, PAID, [event("e-s3", "scroll", "reader", at=t0 + 24_000, depth=25, timeOnPage=4_000,
                                    **on("/b", "s2"))], **PAID_ORIGIN)
    await post(server, PAID, [event("e-pv2", "pageview", "reader", at=t0 + 20_000, **on("/b", "s2"))],
               **PAID_ORIGIN)
    await post(server, PAID, [event("e-late", "scroll", "reader", at=t0 + 15_000, depth=90, timeOnPage=15_000,
                                    **on("/a"))], **PAID_ORIGIN)
    await folded(server)
    body = (await read(server, "reader", key=PAID, **PAID_ORIGIN)).json()
    assert body["engagement"] == {
        "scrollDepth": 25, "timeOnPageMs": 4_000, "averageScrollDepth": 57.5, "totalTimeOnPageMs": 19_000,
        "pages": 2,
    }
    assert body["activity"]["scrolls"] == 4


async def test_a_page_dated_ahead_of_the_server_clock_does_not_stay_current(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 2.2: a timestamp more than 5 minutes off is overridden. A pageview a year
    # ahead stayed the current page for good, its depth and time shown for every
    # later page (helper-135). It now counts as 5 minutes ahead of its receipt.
    server = await started(nursery, tmp_path)

    def on(path: str) -> dict[str, object]:
        return {"page": {"url": f"https://bigco.com{path}", "path": path, "title": path}}

    async def current(visitor: str) -> tuple[float, float]:
        await folded(server)
        engagement = (await read(server, visitor, key=PAID, **PAID_ORIGIN)).json()["engagement"]
        return engagement["scrollDepth"], engagement["timeOnPageMs"]

    async def page(visitor: str, eid: str, path: str, at: int, depth: int) -> None:
        await post(server, PAID, [
            event(f"{eid}-pv", "pageview", visitor, at=at, **on(path)),
            event(f"{eid}-s", "scroll", visitor, at=at, depth=depth, timeOnPage=depth * 100, **on(path)),
        ], **PAID_ORIGIN)

    await post(server, PAID, [event("e-future", "pageview", "clock", at=now_ms(server) + 365 * 86_400_000,
                                    **on("/future"))], **PAID_ORIGIN)
    await page("clock", "p0", "/p0", now_ms(server), 75)
    assert await current("clock") == (0, 0)  # (within its 5 minutes, the page ahead is current)
    server.clock.offset += 6 * 60  # six minutes on
    await page("clock", "p1", "/p1", now_ms(server), 50)
    assert await current("clock") == (50, 5_000)
    # A clock 5 minutes and a half fast: its page that arrived late (within the skew then)
    # does not outrank its next one, dated further ahead (helper-137).
    await page("fast", "a", "/a", now_ms(server) + 270_000, 25)
    await page("fast", "b", "/b", now_ms(server) + 360_000, 75)
    assert await current("fast") == (75, 7_500)
    # Pages of one request far ahead count at the same time: the last one is current.
    at = now_ms(server) + 86_400_000
    await post(server, PAID, [
        event("f1", "pageview", "batch", at=at, **on("/f1")),
        event("f1s", "scroll", "batch", at=at, depth=25, timeOnPage=1_000, **on("/f1")),
        event("f2", "pageview", "batch", at=at, **on("/f2")),
    ], **PAID_ORIGIN)
    assert await current("batch") == (0, 0)


async def test_crawler_visitor_is_a_bot(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event(f"g{i}", "pageview", "crawler-1", ua=GPTBOT) for i in range(3)],
               **PAID_ORIGIN)
    await folded(server)
    response = await read(server, "crawler-1", key=PAID, **PAID_ORIGIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pending"] is False and body["coverageMode"] == "full"
    assert body["bot"] == {"isBot": True, "category": "ai_crawler", "score": 100}
    assert body["behavioralClass"] == "bot"
    # website visitor: humanConfidence = 100 - bot.score; bots score 0 readiness
    assert body["scores"] == {"frustration": 0, "conversionReadiness": 0, "humanConfidence": 0}
    assert body["activity"]["events"] == 3 and body["activity"]["pageviews"] == 3


async def test_a_quarter_bot_events_is_suspicious(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    events = [event(f"p{i}", "pageview", "person-1", ua=CHROME) for i in range(3)]
    # a platform contradiction: this one event is judged automation
    stealth = event("p-odd", "pageview", "person-1", ua=CHROME)
    stealth["device"] = device(CHROME, platform="iPhone")
    await post(server, PAID, [*events, stealth], **PAID_ORIGIN)
    await folded(server)
    body = (await read(server, "person-1", key=PAID, **PAID_ORIGIN)).json()
    # majority human, bot.score 1 of 4 = 25: at least 25 is suspicious
    assert body["bot"] == {"isBot": False, "category": "human", "score": 25}
    assert body["behavioralClass"] == "suspicious"
    assert body["scores"]["humanConfidence"] == 75
    assert body["scores"]["conversionReadiness"] == 40  # 4 pageviews, capped at 4 x 10


async def test_native_visitor_has_neutral_human_confidence(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    app_page = {"path": "HomeScreen", "title": "Home"}
    events = [pageview(f"m{i}", visitorId="app-user", sessionId="s1", page=app_page, device={},
                       timestamp=int(time.time() * 1000)) for i in range(2)]
    await post(server, MOBILE, events)
    await folded(server)
    # a mobile key may travel in ?key= and skips the domain gate
    response = await read(server, "app-user", query_key=MOBILE, Origin="https://evil.example")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["siteId"] == "app"
    assert body["bot"] == {"isBot": False, "category": "human", "score": 0}
    assert body["behavioralClass"] == "human"
    assert body["scores"]["humanConfidence"] == 50
    assert body["scores"]["conversionReadiness"] == 20
    assert body["activity"]["pageviews"] == 2


async def test_unknown_visitor_once_folded_is_not_pending(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    await post(server, FREE, [event("known", "pageview", "known-1")], **FREE_ORIGIN)
    await folded(server)
    response = await read(server, "nobody-here", key=FREE, session="s9", **FREE_ORIGIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "activity" not in body
    assert body == {
        "visitorId": "nobody-here", "siteId": "web", "sessionId": "s9", "coverageMode": "full",
        "pending": False, "stale": False, "behavioralClass": "unknown",
        "bot": {"isBot": False, "category": "unknown", "score": 0},
        "scores": {"frustration": 0, "conversionReadiness": 0, "humanConfidence": 50},
        "asOf": body["asOf"],
    }
    assert type(body["asOf"]) is int
    # the same visitor id under another property of another account is not this one
    other = await read(server, "known-1", key=PAID, **PAID_ORIGIN)
    assert other.json()["behavioralClass"] == "unknown" and "activity" not in other.json()


async def test_a_visitor_the_projection_makes_no_record_for_is_not_pending_forever(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-69 #1: a visitor with consent decisions only, or with every event dropped by
    # strict consent, read pending: true on every (billed) read although the fold had
    # caught up.
    server = await started(nursery, tmp_path)
    strict = {"X-API-Key": STRICT, "Origin": "https://strict.eu"}
    dropped = await server.client.post("/v1/events", json={"events": [event("d1", "pageview", "v-dropped")]},
                                       headers=strict)
    assert (dropped.status_code, dropped.json()["accepted"], dropped.json()["dropped"]) == (202, 0, 1)
    for visitor in ("v-dropped", "v-consent-only"):
        decision = {"visitorId": visitor, "consent": {"analytics": False}}
        assert (await server.client.post("/v1/consent", json=decision, headers=strict)).status_code == 202
    await folded(server)
    for visitor in ("v-dropped", "v-consent-only"):
        body = (await read(server, visitor, key=STRICT, Origin="https://strict.eu")).json()
        assert (body["coverageMode"], body["pending"], body["behavioralClass"]) == ("full", False, "unknown"), body


async def test_pending_until_every_committed_event_is_folded(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event("pend0", "pageview", "v-pend")], **PAID_ORIGIN)
    await folded(server)
    for n in range(1, 6):
        # read at once after the 202: the group folded its events before it committed
        await post(server, PAID, [event(f"pend{n}", "pageview", "v-pend")], **PAID_ORIGIN)
        body = (await read(server, "v-pend", key=PAID, **PAID_ORIGIN)).json()
        assert body["pending"] is False and body["activity"]["pageviews"] == n + 1, body
    await folded(server)
    body = (await read(server, "v-pend", key=PAID, **PAID_ORIGIN)).json()
    assert body["pending"] is False and body["activity"]["pageviews"] == 6


async def test_stale_after_the_idle_window(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event("old", "pageview", "idle-1")], **PAID_ORIGIN)
    await folded(server)
    fresh = (await read(server, "idle-1", key=PAID, **PAID_ORIGIN)).json()
    assert fresh["stale"] is False
    server.clock.offset = 31 * 60  # the last event is now 31 minutes old
    later = (await read(server, "idle-1", key=PAID, **PAID_ORIGIN)).json()
    assert later["stale"] is True
    assert later["pending"] is False and later["activity"]["pageviews"] == 1
    assert later["asOf"] - later["activity"]["lastSeen"] > 30 * 60 * 1000


async def test_url_encoded_visitor_id(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event("sp", "pageview", "a b")], **PAID_ORIGIN)
    await folded(server)
    body = (await read(server, "a%20b", key=PAID, **PAID_ORIGIN)).json()
    assert body["visitorId"] == "a b"
    assert body["activity"]["pageviews"] == 1
    # 128 characters after decoding (384 on the wire) is within the limit; 129 is not
    ok = await read(server, "%41" * 128, key=PAID, **PAID_ORIGIN)
    assert ok.status_code == 200, ok.text
    assert ok.json()["visitorId"] == "A" * 128
    assert_error(await read(server, "%41" * 129, key=PAID, **PAID_ORIGIN), 400, "validation_error")


# --- rage clicks and frustration ---------------------------------------------------------------


async def test_rage_clicks_and_frustration(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    t0 = int(time.time() * 1000)
    burst = [event(f"r{i}", "click", "rager", at=t0 + 200 * i) for i in range(5)]
    await post(server, FREE, burst, **FREE_ORIGIN)
    await folded(server)
    body = (await read(server, "rager", key=FREE, **FREE_ORIGIN)).json()
    assert body["activity"]["clicks"] == 5
    assert body["activity"]["rageClicks"] == 3  # the third, fourth and fifth click of the burst
    assert body["scores"]["frustration"] > 0
    assert body["scores"]["frustration"] == 100  # min(100, round(100 x 3 / 5 x 2))
    assert body["behavioralClass"] == "human"


async def test_frustration_formula_and_bursts_across_requests(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await started(nursery, tmp_path)
    t0 = int(time.time() * 1000)
    # a burst of three split over two requests (and two folds): one rage click
    await post(server, FREE, [event("b0", "click", "mixed", at=t0), event("b1", "click", "mixed", at=t0 + 300)],
               **FREE_ORIGIN)
    await folded(server)
    await post(server, FREE, [event("b2", "click", "mixed", at=t0 + 600)], **FREE_ORIGIN)
    # then seven clicks 2 s apart: each starts a new burst, none is a rage click
    await post(server, FREE, [event(f"s{i}", "click", "mixed", at=t0 + 2_600 + 2_000 * i) for i in range(7)],
               **FREE_ORIGIN)
    await folded(server)
    body = (await read(server, "mixed", key=FREE, **FREE_ORIGIN)).json()
    assert (body["activity"]["clicks"], body["activity"]["rageClicks"]) == (10, 1)
    assert body["scores"]["frustration"] == 20  # round(100 x 1 / 10 x 2)


# --- coverage metering -------------------------------------------------------------------------


async def test_coverage_headers_and_rate_headers(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    response = await read(server, "v1", key=FREE, **FREE_ORIGIN, **{"X-Request-ID": "req-42"})
    assert response.status_code == 200, response.text
    for name in (*COVERAGE_HEADERS, *RATE_HEADERS):
        assert name in response.headers, name
    assert response.headers["X-Service-Signals-Coverage-Period"] == time.strftime("%Y-%m", time.gmtime())
    assert response.headers["X-Service-Signals-Coverage-Limit"] == "25000"  # Explore coverage
    assert response.headers["X-Service-Signals-Coverage-Mode"] == "full"
    assert response.headers["X-RateLimit-Scope"] == "signals-read"
    assert response.headers["X-RateLimit-Unit"] == "requests"
    assert response.headers["X-RateLimit-Limit"] == "600"  # Explore: 10 reads/s
    assert response.headers["X-RateLimit-Policy"] == "600;w=60;burst=2"
    assert response.headers["X-Request-ID"] == "req-42"
    assert response.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert {h.lower() for h in (*COVERAGE_HEADERS, *RATE_HEADERS)} <= exposed
    paid = await read(server, "v1", key=PAID, **PAID_ORIGIN)
    assert paid.headers["X-RateLimit-Limit"] == "300000"  # Pro: 5,000 reads/s
    assert paid.headers["X-Service-Signals-Coverage-Limit"] == "250000"
    # no Origin (a key without domains): no CORS headers, still the usage headers
    bare = await read(server, "v1", key=NODOMAIN)
    assert bare.status_code == 200, bare.text
    assert "Access-Control-Allow-Origin" not in bare.headers
    assert bare.headers["X-Service-Signals-Coverage-Used"] == "1"
    assert bare.headers["X-RateLimit-Limit"] == "60000"  # Pro rate clamped by rateLimit 1000
    # a free mobile key: the lower of its cap (half the package rate, floor 50) and Explore's 10 reads/s
    mobile = await read(server, "v1", key=MOBILE)
    assert mobile.status_code == 200, mobile.text
    assert mobile.headers["X-RateLimit-Limit"] == "600"


async def test_each_read_with_a_session_uses_one_unit(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event("c1", "click", "v-meter"), event("pv", "pageview", "v-meter")],
               **PAID_ORIGIN)
    await folded(server)
    first = await read(server, "v-meter", key=PAID, session="s1", **PAID_ORIGIN)
    assert first.status_code == 200
    start = used(first)
    assert start == 2  # the click (one non-pageview event) and this read
    counts = []
    for _ in range(3):
        response = await read(server, "v-meter", key=PAID, session="s1", **PAID_ORIGIN)
        assert response.status_code == 200 and response.json()["coverageMode"] == "full"
        counts.append(used(response))
    assert counts == [start + 1, start + 2, start + 3]
    # paid without sessionId: 200, one unit per rate partition (one here)
    unsessioned = await read(server, "v-meter", key=PAID, session=None, **PAID_ORIGIN)
    assert unsessioned.status_code == 200, unsessioned.text
    assert unsessioned.json()["coverageMode"] == "full"
    assert unsessioned.json()["activity"]["clicks"] == 1
    assert used(unsessioned) == start + 4


async def test_free_plan_needs_a_session_id(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    first = await read(server, "v1", key=FREE, **FREE_ORIGIN)
    assert used(first) == 1
    refused = await read(server, "v1", key=FREE, session=None, **FREE_ORIGIN)
    assert_error(refused, 400, "session_id_required")
    again = await read(server, "v1", key=FREE, **FREE_ORIGIN)
    assert used(again) == 2  # the refused read used no unit
    # the plan is the matched property's: a paid property of a free key reads without one
    store = await read(server, "v1", key=MULTI, session=None, Origin="https://store.example")
    assert store.status_code == 200, store.text
    assert store.json()["siteId"] == "store"
    assert store.headers["X-RateLimit-Limit"] == "300000"  # the property's Pro read rate
    main = await read(server, "v1", key=MULTI, session=None, Origin="https://multi.com")
    assert_error(main, 400, "session_id_required")
    assert main.headers["X-RateLimit-Limit"] == "600"


async def test_exhausted_coverage_degrades(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    origin = {"Origin": "https://tiny.com"}
    await post(server, TINY, [event("t1", "pageview", "v-tiny"), event("t2", "pageview", "v-tiny")], **origin)
    await folded(server)
    reads = [await read(server, "v-tiny", key=TINY, **origin) for _ in range(5)]
    assert [r.status_code for r in reads] == [200] * 5
    assert [r.json()["coverageMode"] for r in reads] == ["full", "full", "full", "degraded", "degraded"]
    assert [used(r) for r in reads] == [1, 2, 3, 3, 3]
    assert {r.headers["X-Service-Signals-Coverage-Limit"] for r in reads} == {"3"}
    assert reads[0].headers["X-Service-Signals-Coverage-Mode"] == "full"
    assert reads[0].json()["activity"]["pageviews"] == 2
    for degraded in reads[3:]:
        assert degraded.headers["X-Service-Signals-Coverage-Mode"] == "degraded"
        assert degraded.headers["Cache-Control"] == "no-store"
        body = degraded.json()
        assert body == {
            "visitorId": "v-tiny", "siteId": "tiny", "sessionId": "s1", "coverageMode": "degraded",
            "pending": False, "stale": False, "behavioralClass": "suspicious",
            "bot": {"isBot": False, "category": "unknown", "score": 0},
            "scores": {"frustration": 0, "conversionReadiness": 0, "humanConfidence": 50},
            "asOf": body["asOf"],
        }
        assert type(body["asOf"]) is int


async def test_paid_overage_reads_full_up_to_the_ceiling(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    origin = {"Origin": "https://over.com"}
    reads = [await read(server, "v-over", key=OVERAGE, **origin) for _ in range(5)]
    assert [r.status_code for r in reads] == [200] * 5
    # 1 unit included, ceiling 3 with overage on
    assert [r.json()["coverageMode"] for r in reads] == ["full", "full", "full", "degraded", "degraded"]
    assert [used(r) for r in reads] == [1, 2, 3, 3, 3]


async def test_a_read_that_would_serve_overage_it_cannot_count_is_degraded(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A damaged overage counter was left as it was and the overage served
    # went unbilled; within the allowance it is not read at all.
    caplog.set_level(logging.WARNING, logger="collector.signals")
    server = await started(nursery, tmp_path)
    origin = {"Origin": "https://over.com"}
    period = time.strftime("%Y-%m", time.gmtime())
    rewrite_stored(server.data_dir, "counters", f"over\x00{period}\x00coverage_overage".encode(), value=b"xyz")
    reads = [await read(server, "v-over", key=OVERAGE, **origin) for _ in range(2)]
    assert [r.json()["coverageMode"] for r in reads] == ["full", "degraded"]
    assert used(reads[0]) == 1 and "X-Service-Signals-Coverage-Used" not in reads[1].headers
    # The log names the damaged counter, not the healthy usage counter (helper-72).
    assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()] == [
        f"usage counter over/{period}/coverage_overage is unreadable, answering degraded"]


async def busy_reads(nursery: trio.Nursery, tmp_path: Path) -> tuple[RunningServer, list[httpx.Response]]:
    """Thirty reads beside thirty 25-event writes, with a writer queue of one: some find it full."""
    server = await started(nursery, tmp_path, writer_max_queue=1)
    reads: list[httpx.Response] = []

    async def ingest(n: int) -> None:
        await server.client.post(
            "/v1/events", json={"events": [event(f"q{n}-{i}", "pageview", "busy") for i in range(25)]},
            headers={"X-API-Key": PAID, **PAID_ORIGIN},
        )

    async def one_read() -> None:
        reads.append(await read(server, "busy", key=PAID, **PAID_ORIGIN))

    async with trio.open_nursery() as many:
        for n in range(30):
            many.start_soon(ingest, n)
            many.start_soon(one_read)
    return server, reads


async def test_metering_trouble_degrades_and_never_fails(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="collector.signals")
    server, reads = await busy_reads(nursery, tmp_path)
    assert [r.status_code for r in reads] == [200] * 30, [r.text for r in reads if r.status_code != 200]
    modes = [r.json()["coverageMode"] for r in reads]
    assert set(modes) <= {"full", "degraded"}
    assert "degraded" in modes, "the writer never refused a metering write"
    for response in reads:
        if response.json()["coverageMode"] == "degraded":
            assert "activity" not in response.json()
            assert response.json()["behavioralClass"] == "suspicious"
            assert response.headers["X-Service-Signals-Coverage-Mode"] == "degraded"
    final = await read(server, "busy", key=PAID, **PAID_ORIGIN)
    assert used(final) == modes.count("full") + 1  # degraded reads used no unit
    # One line for the burst, not one a read (helper-66 saw 78 for 300 reads).
    lines = [r for r in caplog.records if "coverage metering unavailable" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


async def test_metering_trouble_keeps_the_coverage_headers_it_knows(nursery: trio.Nursery, tmp_path: Path) -> None:
    _, reads = await busy_reads(nursery, tmp_path)
    assert "degraded" in [r.json()["coverageMode"] for r in reads]
    for response in reads:
        # Every 200 carries the coverage set; when metering failed, the counter
        # is unknown and Used is left out rather than guessed (README).
        failed = response.json()["coverageMode"] == "degraded"
        expected = [name for name in COVERAGE_HEADERS if not (failed and name.endswith("-Used"))]
        missing = [name for name in expected if name not in response.headers]
        assert not missing, (response.json()["coverageMode"], missing, dict(response.headers))
        if failed:
            assert "X-Service-Signals-Coverage-Used" not in response.headers
            assert response.headers["X-Service-Signals-Coverage-Mode"] == "degraded"


# --- authentication, gate, scope ---------------------------------------------------------------


async def test_key_errors(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "v1", **FREE_ORIGIN), 401, "missing_api_key")
    assert_error(await read(server, "v1", key="cs_live_nosuchkey000", **FREE_ORIGIN), 401, "invalid_api_key")
    assert_error(await read(server, "v1", query_key="cs_live_nosuchkey000", **FREE_ORIGIN), 401,
                 "invalid_api_key")
    # a server key never travels in the URL
    assert_error(await read(server, "v1", query_key=SERVER), 401, "missing_api_key")
    in_header = await read(server, "v1", key=SERVER, session=None)
    assert in_header.status_code == 200, in_header.text
    assert in_header.json()["siteId"] == "backend"
    # a website key may travel in ?key=
    website = await read(server, "v1", query_key=FREE, **FREE_ORIGIN)
    assert website.status_code == 200, website.text
    assert website.json()["siteId"] == "web"
    # no scope is needed for the snapshot read
    scoped = await read(server, "v1", key=READONLY, **FREE_ORIGIN)
    assert scoped.status_code == 200, scoped.text


async def test_suspended_account(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "v1", key=SUSPENDED, Origin="https://gone.com"), 403, "account_suspended")
    # suspension is checked before the domain gate
    assert_error(await read(server, "v1", key=SUSPENDED, Origin="https://evil.example"), 403,
                 "account_suspended")


async def test_domain_gate(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "v1", key=FREE, Origin="https://evilacme.com"), 403, "domain_not_allowed")
    assert_error(await read(server, "v1", key=FREE, Origin="https://acme.com.evil.io"), 403,
                 "domain_not_allowed")
    assert_error(await read(server, "v1", key=FREE), 403, "origin_required")
    assert_error(await read(server, "v1", query_key=FREE), 403, "origin_required")
    allowed = [
        {"Origin": "https://www.acme.com"},
        {"Referer": "https://blog.acme.com/post?x=1"},
        {"Origin": "http://localhost:3000"},
        {"Origin": "http://127.0.0.1:8080"},
    ]
    for headers in allowed:
        response = await read(server, "v1", key=FREE, **headers)
        assert response.status_code == 200, (headers, response.text)
        assert response.json()["siteId"] == "web"
    # a key without domains needs no Origin
    assert (await read(server, "v1", key=NODOMAIN)).status_code == 200


async def test_site_scope(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "v1", key=MULTI, Origin="http://localhost"), 403, "site_scope_ambiguous")
    main = await read(server, "v1", key=MULTI, Origin="https://www.multi.com")
    assert main.status_code == 200 and main.json()["siteId"] == "main"
    # events of one property are not visible through another
    await post(server, MULTI, [event("m1", "pageview", "shared-v")], Origin="https://multi.com")
    await folded(server)
    on_main = (await read(server, "shared-v", key=MULTI, Origin="https://multi.com")).json()
    on_store = (await read(server, "shared-v", key=MULTI, Origin="https://store.example")).json()
    assert on_main["activity"]["pageviews"] == 1
    assert on_store["behavioralClass"] == "unknown" and "activity" not in on_store


async def test_rate_limit(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    server.clock.fixed = 1_800_000_000.0  # the start of a minute window
    origin = {"Origin": "https://slow.com"}
    # rateLimit 0.1/s clamps the Explore read rate: 6 a minute, a burst of 12
    statuses = [(await read(server, "v1", key=SLOW, **origin)).status_code for _ in range(12)]
    assert statuses == [200] * 12
    refused = await read(server, "v1", key=SLOW, **origin)
    body = assert_error(refused, 429, "rate_limit_exceeded")
    assert body["retryAfter"] == 60
    assert refused.headers["Retry-After"] == "60"
    assert refused.headers["X-RateLimit-Scope"] == "signals-read"
    assert refused.headers["X-RateLimit-Limit"] == "6"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    assert refused.headers["X-RateLimit-Burst-Remaining"] == "0"
    # the rate check comes before the visitorId check
    assert_error(await read(server, "x" * 129, key=SLOW, **origin), 429, "rate_limit_exceeded")
    # reads have their own bucket: ingest still passes
    ingest = await server.client.post(
        "/v1/events", json=event("after", "pageview", "v1", at=int(server.clock() * 1000)),
        headers={"X-API-Key": SLOW, **origin},
    )
    assert ingest.status_code == 202, ingest.text
    assert ingest.headers["X-RateLimit-Scope"] == "ingest"
    server.clock.fixed += 60
    assert (await read(server, "v1", key=SLOW, **origin)).status_code == 200


# --- validation, methods, stream ---------------------------------------------------------------


async def test_validation(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert (await read(server, "v" * 128, key=PAID, **PAID_ORIGIN)).status_code == 200
    assert_error(await read(server, "v" * 129, key=PAID, **PAID_ORIGIN), 400, "validation_error")
    assert (await read(server, "v1", key=PAID, session="s" * 128, **PAID_ORIGIN)).status_code == 200
    assert_error(await read(server, "v1", key=PAID, session="s" * 129, **PAID_ORIGIN), 400,
                 "validation_error")
    # validation comes before the free plan's sessionId rule
    assert_error(await read(server, "v" * 129, key=FREE, session=None, **FREE_ORIGIN), 400,
                 "validation_error")
    assert_error(await read(server, "v1", key=FREE, session="s" * 129, **FREE_ORIGIN), 400,
                 "validation_error")
    # no visitorId segment at all is not this route
    assert_error(await read(server, "", key=PAID, **PAID_ORIGIN), 404, "not_found")
    # the gate comes before validation
    assert_error(await read(server, "v" * 129, key=FREE, Origin="https://evil.example"), 403,
                 "domain_not_allowed")


async def test_an_undecodable_visitor_id_is_checked_after_key_gate_and_rate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # %FF is not percent-encoded UTF-8: the visitorId check refuses it, in its place in the order
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "%FF", key=PAID, **PAID_ORIGIN), 400, "validation_error")
    assert_error(await read(server, "%FF", key=PAID, Origin="https://evil.example"), 403,
                 "domain_not_allowed")
    assert_error(await read(server, "%FF", **PAID_ORIGIN), 401, "missing_api_key")
    assert_error(await read(server, "%FF", key="cs_live_nosuchkey000", **PAID_ORIGIN), 401,
                 "invalid_api_key")
    assert_error(await read(server, "%FF", key=SUSPENDED, Origin="https://gone.com"), 403,
                 "account_suspended")
    # so is a sessionId's %FF (helper-87: it became U+FFFD, was echoed and billed)
    odd = await server.client.get("/v1/signals/v1?sessionId=%FF", headers={"X-API-Key": PAID, **PAID_ORIGIN})
    assert "must be percent-encoded UTF-8" in assert_error(odd, 400, "validation_error")["message"]
    sent = await server.client.get("/v1/signals/v1?sessionId=%EF%BF%BD", headers={"X-API-Key": PAID, **PAID_ORIGIN})
    assert sent.status_code == 200, sent.text  # (U+FFFD itself, percent-encoded as UTF-8, is an id)


async def test_methods(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    assert_error(await read(server, "v1", key=PAID, method="POST", **PAID_ORIGIN), 405, "method_not_allowed")
    assert_error(await read(server, "v1", key=PAID, method="DELETE", **PAID_ORIGIN), 405,
                 "method_not_allowed")
    # the method is checked first: no key still answers 405
    assert_error(await read(server, "v1", method="POST"), 405, "method_not_allowed")
    head = await read(server, "v1", key=PAID, method="HEAD", **PAID_ORIGIN)
    assert head.status_code == 405
    preflight = await server.client.options(
        "/v1/signals/v1",
        headers={"Origin": "https://acme.com", "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "x-api-key"},
    )
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    assert "GET" in [m.strip() for m in preflight.headers["Access-Control-Allow-Methods"].split(",")]
    assert "x-api-key" in preflight.headers["Access-Control-Allow-Headers"].lower()
    # as on the write routes, a key named in the URL applies its domain gate to the preflight
    refused = await server.client.options(f"/v1/signals/v1?key={FREE}", headers={"Origin": "https://evilacme.com"})
    assert refused.status_code == 403
    assert "Access-Control-Allow-Methods" not in refused.headers


async def test_stream_over_plain_http(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    response = await server.client.get(
        "/v1/signals/v1/stream", params={"sessionId": "s1"}, headers={"X-API-Key": FREE, **FREE_ORIGIN}
    )
    body = assert_error(response, 426, "upgrade_required")
    # (helper-135: the message said "send an Upgrade request", whose answer is a 404)
    assert "does not serve it yet" in body["message"], body
    # the path decides the route before the method does
    posted = await server.client.post("/v1/signals/v1/stream", headers={"X-API-Key": FREE, **FREE_ORIGIN})
    assert_error(posted, 426, "upgrade_required")


async def test_paths_that_are_other_routes_are_404(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    headers = {"X-API-Key": PAID, **PAID_ORIGIN}
    # spec 4.2's direct identity API (not built) is not a snapshot read of visitor "batch"
    assert_error(await server.client.post("/v1/signals/batch", headers=headers), 404, "not_found")
    assert_error(await server.client.get("/v1/signals/a/b", headers=headers), 404, "not_found")
    # an encoded slash is not the route's separator: no read of visitor "2Fv9"
    assert_error(await server.client.get("/v1/signals%2Fv9", headers=headers), 404, "not_found")
    # and GET of visitor "batch" is just a read
    assert (await read(server, "batch", key=PAID, **PAID_ORIGIN)).status_code == 200


async def test_a_wild_client_clock_is_stored_and_read(nursery: trio.Nursery, tmp_path: Path) -> None:
    # A timestamp far outside the skew window is replaced by the server's time
    # and accepted; the client's value does not fit the record's event time and
    # is kept as unknown (it used to fail the whole group's transaction).
    server = await started(nursery, tmp_path)
    await post(server, PAID, [event("wild-1", "click", "wild", at=10**20),
                              event("wild-2", "click", "wild", at=-(10**20))], **PAID_ORIGIN)
    await folded(server)
    snap = (await read(server, "wild", key=PAID, **PAID_ORIGIN)).json()
    assert snap["activity"]["clicks"] == 2 and snap["activity"]["rageClicks"] == 0


async def test_paid_read_without_session_uses_a_unit_per_partition(tmp_path: Path) -> None:
    from tests.conftest import PAID_KEY
    from tests.e2e.test_workers import Workers

    workers = Workers(tmp_path, 2)
    try:
        async with httpx.AsyncClient(base_url=workers.url, timeout=30) as client:
            headers = {"X-API-Key": PAID_KEY, "Origin": "https://bigco.com"}
            first = await client.get("/v1/signals/v1", params={"sessionId": "s1"}, headers=headers)
            assert first.status_code == 200, first.text
            assert used(first) == 1
            bare = await client.get("/v1/signals/v1", headers=headers)
            assert bare.status_code == 200, bare.text
            assert used(bare) == 3  # one unit for each of the two rate partitions
            again = await client.get("/v1/signals/v1", params={"sessionId": "s1"}, headers=headers)
            assert used(again) == 4
    finally:
        assert workers.stop() == 0
