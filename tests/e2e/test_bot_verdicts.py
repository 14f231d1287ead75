"""Bot verdicts on stored events and the meter they decide, through the real server (issue 6).

Every stored event carries `bot.isBot` and `bot.category`; bot pageviews
draw on Signals Coverage, not on the human pageview allowance (spec 6.2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from collector.settings import SettingsError, load_settings
from tests.conftest import RunningServer, pageview, start_server
from tests.helpers import outbox_dump

WEB = "cs_live_botweb000000"
MOBILE = "cs_mob_live_botapp0000"
TENANTS = {
    "keys": [
        {"key": WEB, "clientId": "acme", "plan": "paid", "rateLimit": 1000,
         "sites": [{"siteId": "web", "domains": ["acme.com"]}]},
        {"key": MOBILE, "clientId": "acme", "plan": "paid", "rateLimit": 1000, "keyType": "mobile",
         "sites": [{"siteId": "app"}]},
    ]
}
CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
          " Chrome/131.0.0.0 Safari/537.36")
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
GPTBOT = ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; GPTBot/1.2;"
          " +https://openai.com/gptbot")
PERPLEXITY_USER = ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; Perplexity-User/1.0;"
                   " +https://perplexity.ai/perplexity-user)")
WEB_HEADERS = {"X-API-Key": WEB, "Origin": "https://acme.com"}


def device(user_agent: str, **extra: object) -> dict[str, object]:
    return {"userAgent": user_agent, "viewport": {"width": 1280, "height": 800}, **extra}


async def started(nursery: trio.Nursery, tmp_path: Path) -> RunningServer:
    cidrs = tmp_path / "datacenters.txt"
    cidrs.write_text("# a hosting provider\n203.0.113.0/24\n2001:db8:dc::/48  # v6 range\n")
    return await start_server(nursery, tmp_path, TENANTS, datacenter_cidrs_file=str(cidrs),
                              trusted_proxies=["127.0.0.1/32"])


async def verdicts(server: RunningServer) -> dict[str, tuple[bool, str]]:
    rows = await outbox_dump(server.data_dir)
    return {str(r["eid"]): (r["event"]["bot"]["isBot"], r["event"]["bot"]["category"])  # type: ignore[index]
            for r in rows}


async def test_verdicts_and_the_meter_they_decide(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    batch = {"events": [
        pageview("human", device=device(CHROME)),
        pageview("firefox", device=device(FIREFOX, platform="Linux x86_64")),
        pageview("gptbot", device=device(GPTBOT)),
        pageview("answer", device=device(PERPLEXITY_USER)),
        pageview("curl", device=device("curl/8.5.0")),
        pageview("headless", device=device(CHROME.replace("Chrome/", "HeadlessChrome/"))),
        pageview("webdriver", device=device(CHROME, automation={"webdriver": True})),
        pageview("stealth", device=device(CHROME, platform="iPhone")),
    ]}
    response = await server.client.post("/v1/events", json=batch, headers=WEB_HEADERS)
    assert response.status_code == 202, response.text
    # Two human pageviews draw on the pageview allowance; six bot pageviews on coverage.
    assert response.headers["X-Service-Monthly-Used"] == "2"
    assert response.headers["X-Service-Signals-Coverage-Used"] == "6"
    assert await verdicts(server) == {
        "human": (False, "human"), "firefox": (False, "human"), "gptbot": (True, "ai_crawler"),
        "answer": (True, "answer_engine"), "curl": (True, "tool"), "headless": (True, "automation"),
        "webdriver": (True, "automation"), "stealth": (True, "automation"),
    }
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_events_bot_total{category="ai_crawler"} 1.0' in metrics
    assert 'collector_events_bot_total{category="automation"} 3.0' in metrics


VSCODE = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Code/1.95.3"
          " Chrome/128.0.6613.186 Electron/32.2.1 Safari/537.36")


async def test_user_agents_read_as_written_by_people_and_by_libraries(nursery: trio.Nursery, tmp_path: Path) -> None:
    # helper-80: VS Code was automation; these bots and libraries were human pageviews.
    server = await started(nursery, tmp_path)
    batch = {"events": [
        pageview("vscode", device=device(VSCODE)),
        pageview("feed", device=device("FeedFetcher-Google; (+http://www.google.com/feedfetcher.html)")),
        pageview("requests", device=device("Python-Requests/2.32")),
        pageview("spaced-curl", device=device(" curl/8.5.0")),
        pageview("dash", device=device("-")),
        pageview("alamofire", device=device("AcmeApp/1.0 (com.acme.app; build:3; iOS 17.4.0) Alamofire/5.9.1")),
        pageview("cypress", device=device(CHROME.replace("Safari/", "Cypress/13.15.0 Safari/"))),
        pageview("label", device=device(CHROME, automation={"signals": ["HeadlessChrome"]})),
    ]}
    response = await server.client.post("/v1/events", json=batch, headers=WEB_HEADERS)
    assert response.status_code == 202, response.text
    assert response.headers["X-Service-Monthly-Used"] == "1"
    assert await verdicts(server) == {
        "vscode": (False, "human"), "feed": (True, "crawler"), "requests": (True, "tool"),
        "spaced-curl": (True, "tool"), "dash": (True, "tool"), "alamofire": (True, "tool"),
        "cypress": (True, "automation"), "label": (True, "automation"),
    }
    blank = await server.client.post("/v1/events", json=pageview("blank", device=device("   ")), headers=WEB_HEADERS)
    assert (blank.status_code, blank.json()["details"][0]["path"]) == (400, "$.device.userAgent"), blank.text


async def test_an_edge_pageviews_user_agent_is_the_bodys_unless_blank_then_the_headers(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await started(nursery, tmp_path)
    edge = {"visitorId": "v", "sessionId": "s", "url": "https://acme.com/"}
    blank = await server.client.post("/v1/edge/pageview", json={**edge, "_eid": "blank", "userAgent": "  "},
                                     headers={**WEB_HEADERS, "User-Agent": "curl/8.5.0"})
    assert blank.json()["accepted"] == 1, blank.text
    # A UTF-8 User-Agent header is stored as its characters, not read as Latin-1.
    utf8 = await server.client.post("/v1/edge/pageview", json={**edge, "_eid": "utf8"},
                                    headers={**WEB_HEADERS, "User-Agent": (CHROME + " 日").encode()})
    assert utf8.json()["accepted"] == 1, utf8.text
    long = await server.client.post("/v1/edge/pageview", json={**edge, "_eid": "long"},
                                    headers={**WEB_HEADERS, "User-Agent": "a" * 513})
    assert (long.status_code, long.json()["details"][0]["path"]) == (400, "User-Agent"), long.text
    assert "User-Agent header" in long.json()["message"]
    native = await server.client.post("/v1/edge/pageview", json={**edge, "_eid": "native"},
                                      headers={"X-API-Key": MOBILE, "User-Agent": ""})
    assert native.json()["accepted"] == 1, native.text
    rows = {str(r["eid"]): r["event"] for r in await outbox_dump(server.data_dir)}
    assert (rows["blank"]["device"]["userAgent"], rows["blank"]["bot"]["category"]) == (  # type: ignore[index]
        "curl/8.5.0", "tool")
    assert rows["utf8"]["device"]["userAgent"] == CHROME + " 日"  # type: ignore[index]
    assert "userAgent" not in rows["native"]["device"]  # type: ignore[operator]


async def test_request_headers_and_addresses(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)

    async def post(eid: str, user_agent: str, **headers: str) -> None:
        event = pageview(eid, device=device(user_agent))
        response = await server.client.post("/v1/events", json=event, headers={**WEB_HEADERS, **headers})
        assert response.status_code == 202, response.text

    # Chrome over plain http sends no client hints; a beacon sends few headers: neither misfires.
    await post("chrome-http", CHROME, **{"User-Agent": CHROME})
    await post("beacon", FIREFOX)
    await post("chrome-hints", CHROME, **{"User-Agent": CHROME, "Sec-CH-UA": '"Chromium";v="131"',
                                          "Sec-CH-UA-Mobile": "?0", "Sec-CH-UA-Platform": '"Windows"'})
    # Contradictions: Chromium client hints with a Firefox UA; a Firefox header with a Chrome event.
    await post("hints-vs-firefox", FIREFOX, **{"Sec-CH-UA": '"Chromium";v="131", "Google Chrome";v="131"'})
    await post("header-family", CHROME, **{"User-Agent": FIREFOX})
    # A headless browser's own header, whatever its event says (helper-138: stored as a person).
    await post("header-headless", CHROME, **{"User-Agent": CHROME.replace("Chrome/", "HeadlessChrome/")})
    # Behind the trusted proxy (127.0.0.1) the visitor's address comes from X-Forwarded-For.
    await post("datacenter", CHROME, **{"X-Forwarded-For": "198.51.100.9, 203.0.113.40"})
    await post("residential", CHROME, **{"X-Forwarded-For": "198.51.100.9"})
    # A forged left-most hop cannot hide the real last hop.
    await post("forged", CHROME, **{"X-Forwarded-For": "203.0.113.1, 198.51.100.10"})
    # Entries with a port, as some balancers write them.
    await post("dc-port", CHROME, **{"X-Forwarded-For": "203.0.113.40:8080"})
    await post("dc-v6-port", CHROME, **{"X-Forwarded-For": "[2001:db8:dc::40]:443"})
    assert await verdicts(server) == {
        "chrome-http": (False, "human"), "beacon": (False, "human"), "chrome-hints": (False, "human"),
        "hints-vs-firefox": (True, "automation"), "header-family": (True, "automation"),
        "header-headless": (True, "automation"),
        "datacenter": (True, "datacenter"), "residential": (False, "human"), "forged": (False, "human"),
        "dc-port": (True, "datacenter"), "dc-v6-port": (True, "datacenter"),
    }


async def test_an_edge_pageview_is_judged_by_its_visitor_not_by_the_edge_worker(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The edge worker's connection (here from a listed hosting range) and its own
    # headers said "datacenter" and "automation" of every human pageview it relayed
    # (helper-68). A worker the operator trusts (trusted_proxies: here it connects
    # from 127.0.0.1 itself) vouches for its visitor's clientIp; anyone else is
    # judged as on /v1/events, whatever clientIp it claims (helpers 71 and 72).
    server = await started(nursery, tmp_path)
    worker = {"X-API-Key": WEB, "User-Agent": FIREFOX, "Sec-CH-UA": '"Chromium";v="131"'}
    stranger = {"X-API-Key": WEB, "X-Forwarded-For": "203.0.113.5"}  # a listed address, not a trusted relay

    async def edge(eid: str, headers: dict[str, str] = worker, **fields: str) -> None:
        body = {"_eid": eid, "visitorId": "v", "sessionId": "s", "url": "https://acme.com/", "userAgent": CHROME}
        response = await server.client.post("/v1/edge/pageview", json={**body, **fields}, headers=headers)
        assert response.status_code == 202, response.text

    await edge("edge-residential", clientIp="198.51.100.9")
    await edge("edge-datacenter", clientIp="203.0.113.40")
    await edge("edge-dc-v6", clientIp="2001:db8:dc::40")
    await edge("edge-crawler", clientIp="198.51.100.9", userAgent=GPTBOT)
    await edge("edge-no-address")  # the relay's own address is not its visitor's
    await edge("stranger-claims", stranger, clientIp="198.51.100.9")
    await edge("stranger", stranger)
    browser = {**worker, "Origin": "https://acme.com"}
    await edge("edge-browser", browser, userAgent=FIREFOX)  # Chromium hints with a Firefox agent
    assert await verdicts(server) == {
        "edge-residential": (False, "human"), "edge-datacenter": (True, "datacenter"),
        "edge-dc-v6": (True, "datacenter"), "edge-crawler": (True, "ai_crawler"),
        "edge-no-address": (False, "human"), "stranger-claims": (True, "datacenter"),
        "stranger": (True, "datacenter"), "edge-browser": (True, "automation"),
    }
    rows = await outbox_dump(server.data_dir)
    assert all("clientIp" not in str(row["event"]) and "198.51.100.9" not in str(row["event"]) for row in rows)
    chain = "203.0.113.195, 198.51.100.17, 192.0.2.44, 10.1.2.3"  # an X-Forwarded-For, not one address
    for bad_ip in ("nope", "2001:db8:dc::5%1", chain, 123, ["198.51.100.9"]):  # (a scope id names a local link)
        bad = await server.client.post("/v1/edge/pageview", headers=worker, json={
            "_eid": "edge-bad-ip", "visitorId": "v", "sessionId": "s", "url": "https://acme.com/", "clientIp": bad_ip})
        assert (bad.status_code, bad.json()["error"]) == (400, "validation_error"), bad.text
        assert bad.json()["details"] == [
            {"path": "$.clientIp", "message": "not an IPv4 or IPv6 address (one address, as a string)"}]
    # From a sender that is no trusted relay clientIp is ignored: a malformed one (an edge
    # worker forwarding a missing header as "") lost the pageview (helpers 85 and 86).
    for index, bad_ip in enumerate(("", "unknown", "203.0.113.5:443", chain, 123, True, {}, ["198.51.100.9"])):
        fine = await server.client.post("/v1/edge/pageview", headers=stranger, json={
            "_eid": f"stranger-bad-ip-{index}", "visitorId": "v", "sessionId": "s", "url": "https://acme.com/",
            "clientIp": bad_ip})
        assert fine.json()["accepted"] == 1, fine.text


async def test_native_clients_are_exempt_except_from_automation(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await started(nursery, tmp_path)
    headers = {"X-API-Key": MOBILE, "X-Forwarded-For": "203.0.113.7"}
    app_page = {"path": "HomeScreen", "title": "Home"}
    events = {"events": [
        pageview("okhttp", page=app_page, device={"userAgent": "okhttp/4.12.0"}),
        pageview("driven", page=app_page, device={"automation": {"webdriver": True}}),
        pageview("scored", page=app_page, device={"automation": {"score": 95}}),
    ]}
    response = await server.client.post("/v1/events", json=events, headers=headers)
    assert response.status_code == 202, response.text
    assert await verdicts(server) == {
        "okhttp": (False, "human"), "driven": (True, "automation"), "scored": (True, "automation"),
    }


def test_a_bad_datacenter_file_stops_start_up(tmp_path: Path) -> None:
    from collector.app import bot_classifier, trusted_proxies

    bad = tmp_path / "bad.txt"
    bad.write_text("203.0.113.0/24\nnot-a-network\n")
    with pytest.raises(SettingsError, match="bad.txt:2"):
        bot_classifier(load_settings({"datacenter_cidrs_file": str(bad)}, environ={}))
    with pytest.raises(SettingsError, match="trusted_proxies"):
        trusted_proxies(load_settings({"trusted_proxies": ["10.0.0.0/33"]}, environ={}))


async def test_visitor_verdicts_from_the_projection(nursery: trio.Nursery, tmp_path: Path) -> None:
    from tests.helpers import run_cli

    server = await started(nursery, tmp_path)
    events = [pageview(f"c{i}", visitorId="crawler-1", device=device(GPTBOT)) for i in range(3)]
    events += [pageview(f"p{i}", visitorId="person-1", device=device(CHROME)) for i in range(3)]
    # One misjudged event (a platform contradiction) does not make the person a bot.
    events.append(pageview("p-odd", visitorId="person-1", device=device(CHROME, platform="iPhone")))
    response = await server.client.post("/v1/events", json={"events": events}, headers=WEB_HEADERS)
    assert response.json()["accepted"] == 7
    # The projection tails the outbox in the background: wait (bounded) until it caught up.
    for _ in range(200):
        if "collector_visitor_projection_lag 0.0" in (await server.client.get("/metrics")).text:
            break
        await trio.sleep(0.05)
    else:
        raise AssertionError("the visitor projection did not catch up within 10 s")

    def show(visitor: str) -> dict[str, object]:
        import json

        out = run_cli("visitors", "show", visitor, "--client", "acme", data_dir=server.data_dir).stdout
        return json.loads(out)

    crawler = await trio.to_thread.run_sync(show, "crawler-1")
    person = await trio.to_thread.run_sync(show, "person-1")
    assert crawler["bot"] == {"isBot": True, "category": "ai_crawler"} and crawler["events"] == 3
    assert person["bot"] == {"isBot": False, "category": "human"}
    assert (person["events"], person["botEvents"]) == (4, 1)
    assert sum(person["eventTypes"].values()) == 4 and person["rageClicks"] == 0  # type: ignore[union-attr]
