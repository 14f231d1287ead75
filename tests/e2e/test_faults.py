"""Storage faults and back-pressure through the real server: 503 with nothing half-stored."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.conftest import BROWSER_KEY, MOBILE_KEY, TENANTS, pageview, start_server, write_tenants
from tests.helpers import outbox_dump, run_cli

H = {"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com"}


async def test_full_storage_answers_503_and_keeps_serving(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, map_size_mb=1, max_map_size_mb=1)
    acknowledged = 0
    big_label = "x" * 4000
    statuses = []
    for batch in range(120):
        events = [pageview(f"b{batch}-{i}", type="custom", name="n", label=big_label) for i in range(25)]
        response = await server.client.post("/v1/events", json={"events": events}, headers=H)
        statuses.append(response.status_code)
        if response.status_code == 202:
            acknowledged += response.json()["accepted"]
        else:
            assert response.status_code == 503
            assert response.json()["error"] == "storage_unavailable"
            assert response.headers["Retry-After"]
            break
    assert statuses[-1] == 503, "the 1 MB map never filled"
    assert (await server.client.get("/healthz")).status_code == 200
    stored = await outbox_dump(server.data_dir)
    assert len(stored) == acknowledged  # whole batches only, nothing half-stored
    # a small batch that fits the pages left still goes through: the process keeps serving
    # (helper-96: this accepted a 503 too)
    small = await server.client.post("/v1/events", json=pageview("tiny"), headers=H)
    assert (small.status_code, small.json()["accepted"]) == (202, 1), small.text
    assert len(await outbox_dump(server.data_dir)) == acknowledged + 1


async def test_full_writer_queue_refuses_at_once(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, writer_max_queue=1)
    statuses: list[int] = []

    async def one(n: int) -> None:
        response = await server.client.post(
            "/v1/events", json={"events": [pageview(f"q{n}-{i}") for i in range(25)]}, headers=H
        )
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.json()["error"] == "storage_unavailable"
            assert response.headers["Retry-After"] == "1"

    async with trio.open_nursery() as many:
        for n in range(40):
            many.start_soon(one, n)
    assert 202 in statuses and 503 in statuses
    assert set(statuses) <= {202, 503}
    assert len(await outbox_dump(server.data_dir)) == 25 * statuses.count(202)


async def test_revocation_reaches_the_server_through_its_cache(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, key_cache_ttl=0, key_negative_ttl=0)
    event = pageview("m1", page={"path": "Home", "title": "Home"}, device={})
    headers = {"X-API-Key": MOBILE_KEY}
    assert (await server.client.post("/v1/events", json=event, headers=headers)).status_code == 202
    new_key = run_cli("keys", "rotate", MOBILE_KEY, data_dir=server.data_dir).stdout.strip()
    old = await server.client.post("/v1/events", json=event, headers=headers)
    assert old.status_code == 401 and old.json()["error"] == "invalid_api_key"
    fresh = await server.client.post("/v1/events", json=event, headers={"X-API-Key": new_key})
    assert fresh.status_code == 202 and fresh.json()["duplicates"] == 1


async def test_suspending_a_rotated_key_reaches_its_replacement(nursery: trio.Nursery, tmp_path: Path) -> None:
    # The file names the old key; its replacement (random, unnamed) kept serving
    # after the file suspended the account (found by audit helper-29).
    server = await start_server(nursery, tmp_path, key_cache_ttl=0, key_negative_ttl=0)
    event = pageview("s1", page={"path": "Home", "title": "Home"}, device={})
    new_key = run_cli("keys", "rotate", MOBILE_KEY, data_dir=server.data_dir).stdout.strip()
    assert (await server.client.post("/v1/events", json=event, headers={"X-API-Key": new_key})).status_code == 202
    keys = [{**record, "suspended": True} if record["key"] == MOBILE_KEY else record
            for record in TENANTS["keys"]]  # type: ignore[attr-defined]
    suspended = write_tenants(tmp_path / "suspended.json", {"keys": keys})
    run_cli("tenants", "import", str(suspended), data_dir=server.data_dir)
    for key, headers in ((new_key, {}), (BROWSER_KEY, {"Origin": "https://acme.com"})):  # the whole account
        refused = await server.client.post("/v1/events", json=pageview("s2"), headers={"X-API-Key": key, **headers})
        assert (refused.status_code, refused.json()["error"]) == (403, "account_suspended"), key


async def test_metrics_show_group_commit_and_meters(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path)

    async def one(n: int) -> None:
        await server.client.post("/v1/events", json=pageview(f"g{n}"), headers=H)

    async with trio.open_nursery() as many:
        for n in range(50):
            many.start_soon(one, n)
    text = (await server.client.get("/metrics")).text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    # 50 admissions, plus the retention sweep the server runs at start-up and
    # the visitor projection's fold jobs (it polls while the requests commit;
    # one may be committed but not yet counted by the projection's task)
    folds = values["collector_visitor_projection_passes"]
    assert 50 + folds <= values["collector_writer_requests_committed"] <= 52 + folds
    # grouped: fewer transactions than jobs (how many fewer depends on timing)
    assert values["collector_writer_transactions"] < values["collector_writer_requests_committed"]
    assert values['collector_events_total{outcome="accepted"}'] == 50
    # helper-95: these were kept and never shown (one key read, then the cache; 50 rate checks)
    assert (values["collector_key_cache_misses_total"], values["collector_key_cache_hits_total"]) == (1, 49)
    assert (values["collector_rate_checks_total"], values["collector_rate_refusals_total"]) == (50, 0)
    assert values["collector_retention_sweeps_total"] >= 1 and values["collector_retention_failures_total"] == 0
    assert any(
        k.startswith('collector_meter_used_units{account="acme"') and 'unit="pageview"' in k and v == 50
        for k, v in values.items()
    )
    assert 'collector_requests_total{route="/v1/events",status="202"} 50.0' in text
    assert values["collector_outbox_entries"] == 50
    assert values["collector_commit_group_size_count"] >= 1
    assert values["collector_commit_seconds_count"] >= 1


async def test_serve_settles_a_suspension_recorded_by_an_older_version(nursery: trio.Nursery, tmp_path: Path) -> None:
    # An older version's import suspended the key it named only; serve now gives the
    # account's other keys the suspension as it starts (audit helper-35).
    import json as _json

    from collector.tenants_admin import import_tenants, list_records
    from storage.env import Storage
    from storage.keys import put_keys

    storage = Storage(tmp_path / "data")
    try:
        import_tenants(storage, _json.dumps(TENANTS).encode())
        records = list_records(storage)
        put_keys(storage, [
            (r.key, _json.dumps({"key": r.key, "clientId": r.clientId, "keyType": str(r.key_type),
                                 "sites": [{"siteId": s.siteId, "domains": list(s.domains)} for s in r.sites],
                                 "suspended": r.key == MOBILE_KEY}).encode())
            for r in records
        ])
    finally:
        storage.close()
    server = await start_server(nursery, tmp_path, {"keys": []}, key_cache_ttl=0)  # an import of nothing
    refused = await server.client.post("/v1/events", json=pageview("s1"),
                                       headers={"X-API-Key": BROWSER_KEY, "Origin": "https://acme.com"})
    assert (refused.status_code, refused.json()["error"]) == (403, "account_suspended"), refused.text


async def test_metrics_are_served_only_to_the_networks_in_metrics_from(nursery: trio.Nursery, tmp_path: Path) -> None:
    # helper-101: /metrics names every billing account and its usage, on the listener
    # anyone posts events to.
    server = await start_server(nursery, tmp_path, metrics_from=["10.0.0.0/8"], trusted_proxies=["127.0.0.1/32"])
    refused = await server.client.get("/metrics")
    assert (refused.status_code, refused.json()["error"]) == (404, "not_found"), refused.text
    assert "metrics_from" in refused.json()["message"] and "collector_" not in refused.text
    # behind a trusted proxy, the client it names decides
    assert (await server.client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})).status_code == 404
    inside = await server.client.get("/metrics", headers={"X-Forwarded-For": "10.1.2.3"})
    assert inside.status_code == 200 and "collector_requests_total" in inside.text
    assert (await server.client.get("/healthz")).status_code == 200  # (the other operational routes stay open)
    # a fetch a web page made is no scraper's, even from inside: a DNS-rebinding page read it
    # same-origin through a visitor's browser (helper-122); a URL typed into one is fine
    inside_ip = {"X-Forwarded-For": "10.1.2.3"}
    for site in ("same-origin", "cross-site", "same-site"):
        page = await server.client.get("/metrics", headers={**inside_ip, "Sec-Fetch-Site": site})
        assert page.status_code == 404 and "collector_" not in page.text, site
    typed = await server.client.get("/metrics", headers={**inside_ip, "Sec-Fetch-Site": "none"})
    assert typed.status_code == 200
