"""Domain gate, site scope, CORS and request-rate buckets through the real server (issue 3)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.conftest import BROWSER_KEY, MOBILE_KEY, RunningServer, pageview, start_server
from tests.helpers import outbox_dump

MULTI = "cs_live_multi0000000"
SLOW = "cs_live_slow00000000"
TENANTS = {
    "keys": [
        {"key": BROWSER_KEY, "clientId": "acme", "plan": "free", "rateLimit": 100,
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": MOBILE_KEY, "clientId": "acme", "plan": "free", "rateLimit": 50, "keyType": "mobile",
         "sites": [{"siteId": "app"}]},
        {"key": MULTI, "clientId": "multi", "plan": "paid", "rateLimit": 100,
         "sites": [{"siteId": "main", "domains": ["multi.com"]},
                   {"siteId": "shop", "domains": ["shop.example.co.uk"]}]},
        {"key": SLOW, "clientId": "slow", "plan": "free", "rateLimit": 1,
         "sites": [{"siteId": "web", "domains": ["slow.com"]}]},
    ]
}
EXPOSED = {
    "x-service-billing-period", "x-service-monthly-limit", "x-service-monthly-used",
    "x-service-billing-mode", "x-service-budget-ceiling", "x-service-signals-coverage-period",
    "x-service-signals-coverage-limit", "x-service-signals-coverage-used",
    "x-service-signals-coverage-ceiling", "x-service-signals-coverage-mode",
    "x-service-signals-coverage-reserved-units", "retry-after", "x-ratelimit-limit",
    "x-ratelimit-burst-limit", "x-ratelimit-policy", "x-ratelimit-scope", "x-ratelimit-unit",
    "x-ratelimit-remaining", "x-ratelimit-burst-remaining", "x-ratelimit-reset", "x-request-id",
}


async def post(server: RunningServer, key: str, eid: str, **headers: str):
    return await server.client.post("/v1/events", json=pageview(eid), headers={"X-API-Key": key, **headers})


async def test_domain_rules(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    cases = [
        ({"Origin": "https://acme.com"}, 202),
        ({"Origin": "https://www.shop.acme.com"}, 202),
        ({"Referer": "https://blog.acme.com/posts/1?x=y"}, 202),
        ({"Origin": "https://evilacme.com"}, 403),
        ({"Origin": "https://acme.com.evil.io"}, 403),
        ({}, 403),
        ({"Origin": "http://localhost:3000"}, 202),
        ({"Origin": "http://127.0.0.1:8080"}, 202),
        ({"Origin": "http://[::1]:5173"}, 202),
    ]
    for index, (headers, status) in enumerate(cases):
        response = await post(server, BROWSER_KEY, f"d{index}", **headers)
        assert response.status_code == status, (headers, response.text)
    assert (await post(server, BROWSER_KEY, "x", Origin="https://evilacme.com")).json()["error"] == "domain_not_allowed"
    # a host longer than DNS allows is not repeated back whole (helper-136: 40 KB of it)
    refused = (await post(server, BROWSER_KEY, "x", Origin="https://" + "a" * 8_000 + ".com")).json()
    assert refused["error"] == "domain_not_allowed" and len(refused["message"]) < 400, refused["message"][:80]
    assert (await post(server, BROWSER_KEY, "y")).json()["error"] == "origin_required"
    stored = await outbox_dump(server.data_dir)
    assert {row["siteId"] for row in stored} == {"web"}


async def test_an_ip_address_domain_matches_itself_only(nursery: trio.Nursery, tmp_path: Path) -> None:
    # The suffix list gave "10.0.0.1" the root "0.1", so 192.168.0.1 and 8.8.0.1
    # passed the gate; a bracketed IPv6 domain was accepted but never matched.
    lan, v6 = "cs_live_lan000000000", "cs_live_ipv600000000"
    tenants = {"keys": [
        {"key": lan, "clientId": "lan", "sites": [{"siteId": "lan", "domains": ["10.0.0.1"]}]},
        {"key": v6, "clientId": "lan", "sites": [{"siteId": "v6", "domains": ["[2001:DB8:0::1]"]}]},
    ]}
    server = await start_server(nursery, tmp_path, tenants)
    cases = [
        (lan, "http://10.0.0.1:8080", 202), (lan, "http://192.168.0.1", 403), (lan, "http://8.8.0.1", 403),
        (lan, "http://x.0.1", 403), (v6, "http://[2001:db8::1]", 202), (v6, "http://[2001:db8::2]", 403),
    ]
    for index, (key, origin, status) in enumerate(cases):
        response = await post(server, key, f"ip{index}", Origin=origin)
        assert response.status_code == status, (origin, response.text)
    assert {row["siteId"] for row in await outbox_dump(server.data_dir)} == {"lan", "v6"}


async def test_mobile_keys_skip_the_gate(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    event = pageview("m", page={"path": "Home", "title": "Home"}, device={})
    response = await server.client.post(
        "/v1/events", json=event, headers={"X-API-Key": MOBILE_KEY, "Origin": "https://evil.com"}
    )
    assert response.status_code == 202, response.text


async def test_site_scope_binds_and_refuses_ambiguity(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    assert (await post(server, MULTI, "a", Origin="https://example.co.uk")).status_code == 202
    assert (await post(server, MULTI, "b", Origin="https://multi.com")).status_code == 202
    ambiguous = await post(server, MULTI, "c", Origin="http://localhost")
    assert ambiguous.status_code == 403
    assert ambiguous.json()["error"] == "site_scope_ambiguous"
    edge = await server.client.post(
        "/v1/edge/pageview",
        json={"_eid": "e", "url": "http://localhost/", "visitorId": "v", "sessionId": "s"},
        headers={"X-API-Key": MULTI, "Origin": "http://localhost"},
    )
    assert edge.json()["error"] == "site_scope_ambiguous"
    assert [row["siteId"] for row in await outbox_dump(server.data_dir)] == ["shop", "main"]


async def test_edge_pageviews_bind_by_page_url_without_the_browser_gate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 5.5 rule 1 gates browser-facing writes; an edge worker sends no Origin, so
    # its site is bound from the page URL (rule 5), and an unmatched URL is ambiguous.
    server = await start_server(nursery, tmp_path, TENANTS)

    async def edge(eid: str, url: str, **headers: str):
        body = {"_eid": eid, "url": url, "visitorId": "v", "sessionId": "s", "userAgent": "Mozilla/5.0"}
        return await server.client.post("/v1/edge/pageview", json=body, headers={"X-API-Key": MULTI, **headers})

    assert (await edge("m", "https://www.multi.com/pricing")).status_code == 202
    assert (await edge("s", "https://blog.example.co.uk/post")).status_code == 202
    unmatched = await edge("x", "https://elsewhere.org/")
    assert (unmatched.status_code, unmatched.json()["error"]) == (403, "site_scope_ambiguous")
    # A forwarded Origin, when the worker sends one, decides over the URL.
    assert (await edge("o", "https://elsewhere.org/", Origin="https://multi.com")).status_code == 202
    single = await server.client.post(
        "/v1/edge/pageview",
        json={"_eid": "one", "url": "https://anything.example/", "visitorId": "v", "sessionId": "s"},
        headers={"X-API-Key": BROWSER_KEY},
    )
    assert single.status_code == 202  # a single-property key binds automatically
    assert [row["siteId"] for row in await outbox_dump(server.data_dir)] == ["main", "shop", "main", "web"]


async def test_a_browser_page_posting_edge_pageviews_meets_the_domain_gate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The public website key in ?key= must not let any site write pageviews here.
    server = await start_server(nursery, tmp_path, TENANTS)
    body = {"_eid": "ev", "url": "https://evil.com/", "visitorId": "v", "sessionId": "s", "userAgent": "Mozilla/5.0"}
    for headers, error in (({"Origin": "https://evil.com"}, "domain_not_allowed"),
                           ({"Referer": "https://evil.com/page"}, "domain_not_allowed"),
                           ({"Origin": "null"}, "origin_required"),  # a sandboxed frame
                           ({"Origin": "acme.com"}, "origin_required")):  # no scheme: names no host
        response = await server.client.post(
            f"/v1/edge/pageview?key={BROWSER_KEY}", content=json.dumps(body),
            headers={"Content-Type": "text/plain", **headers})
        assert (response.status_code, response.json()["error"]) == (403, error), headers
        if error == "origin_required":  # (helper-87: it said no Origin was sent)
            assert "names a host" in response.json()["message"], response.text
    own = await server.client.post(f"/v1/edge/pageview?key={BROWSER_KEY}", json={**body, "_eid": "own"},
                                   headers={"Origin": "https://www.acme.com"})
    assert own.status_code == 202, own.text
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["own"]


async def test_international_domains_match_the_punycode_browsers_send(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    key = "cs_live_idn000000000"
    server = await start_server(nursery, tmp_path, {"keys": [
        {"key": key, "clientId": "idn", "plan": "free",
         "sites": [{"siteId": "web", "domains": ["münchen.de", "xn--bcher-kva.example", "straße.de"]}]}]})
    for index, origin in enumerate(("https://xn--mnchen-3ya.de", "https://www.xn--mnchen-3ya.de",
                                    "https://bücher.example", "https://shop.xn--bcher-kva.example")):
        response = await server.client.post("/v1/events", json=pageview(f"i{index}"),
                                            headers={"X-API-Key": key, "Origin": origin.encode()})  # UTF-8 on the wire
        assert response.status_code == 202, (origin, response.text)
    other = await post(server, key, "o", Origin="https://xn--mnchen-4ya.de")
    assert other.json()["error"] == "domain_not_allowed"
    # UTS 46 as browsers: ß stays ß (xn--strae-oqa.de); strasse.de is another site.
    assert (await post(server, key, "sz", Origin="https://xn--strae-oqa.de")).status_code == 202
    assert (await post(server, key, "ss", Origin="https://strasse.de")).json()["error"] == "domain_not_allowed"


async def test_cors_preflight_and_exposed_headers(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    preflight = await server.client.options(
        "/v1/events",
        headers={"Origin": "https://acme.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type,x-api-key,idempotency-key"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert {"content-type", "x-api-key", "idempotency-key", "content-encoding"} <= set(allowed.split(", "))
    refused = await server.client.options(
        f"/v1/events?key={BROWSER_KEY}", headers={"Origin": "https://evilacme.com"}
    )
    assert refused.status_code == 403
    assert "Access-Control-Allow-Methods" not in refused.headers
    assert "Access-Control-Allow-Origin" not in refused.headers

    response = await post(server, BROWSER_KEY, "c1", Origin="https://acme.com")
    assert response.headers["Access-Control-Allow-Origin"] == "https://acme.com"
    exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert exposed == EXPOSED
    assert "x-service-budget-type" not in exposed
    for name in ("X-Service-Billing-Period", "X-Service-Signals-Coverage-Mode", "X-RateLimit-Reset"):
        assert name in response.headers


async def test_send_beacon_with_key_in_query(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    response = await server.client.post(
        f"/v1/events?key={BROWSER_KEY}",
        content=json.dumps(pageview("beacon")),
        headers={"Content-Type": "text/plain;charset=UTF-8", "Origin": "https://acme.com"},
    )
    assert response.status_code == 202, response.text


async def test_rate_bucket_runs_out(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    server.clock.fixed = 1_800_000_000.0  # the start of a minute window
    statuses = []
    last = None
    for n in range(121):
        last = await post(server, SLOW, f"r{n}", Origin="https://slow.com")
        statuses.append(last.status_code)
    assert statuses[:120] == [202] * 120
    assert statuses[120] == 429
    assert last is not None
    body = last.json()
    assert body["error"] == "rate_limit_exceeded" and body["retryAfter"] == 60
    assert last.headers["Retry-After"] == "60"
    assert last.headers["X-RateLimit-Remaining"] == "0"
    assert last.headers["X-RateLimit-Burst-Remaining"] == "0"
    assert last.headers["X-RateLimit-Policy"] == "60;w=60;burst=2"
    assert last.headers["X-RateLimit-Scope"] == "ingest"
    assert len(await outbox_dump(server.data_dir)) == 120
    server.clock.fixed += 60
    assert (await post(server, SLOW, "next", Origin="https://slow.com")).status_code == 202


async def test_a_refusal_after_authentication_carries_the_rate_headers(nursery: trio.Nursery, tmp_path: Path) -> None:
    # Spec 8.2: rate headers on every authenticated response; the gate's refusals take nothing.
    server = await start_server(nursery, tmp_path, TENANTS)
    server.clock.fixed = 1_800_000_000.0
    first = await post(server, SLOW, "ok1", Origin="https://slow.com")
    assert first.headers["X-RateLimit-Remaining"] == "59"
    for headers, error in (({"Origin": "https://evil.com"}, "domain_not_allowed"), ({}, "origin_required")):
        refused = await post(server, SLOW, "no", **headers)
        assert refused.json()["error"] == error
        assert refused.headers["X-RateLimit-Limit"] == "60" and refused.headers["X-RateLimit-Scope"] == "ingest"
        assert refused.headers["X-RateLimit-Remaining"] == "59"  # peeked, not spent
        assert "Retry-After" not in refused.headers
    unknown = await post(server, "cs_live_nope00000000", "x", Origin="https://slow.com")
    assert unknown.status_code == 401 and "X-RateLimit-Limit" not in unknown.headers  # not authenticated
    assert (await post(server, SLOW, "ok2", Origin="https://slow.com")).headers["X-RateLimit-Remaining"] == "58"
