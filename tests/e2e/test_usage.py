"""Usage metering end to end (issue 7): allowances, refusals, pooling, overage, rollover."""

from __future__ import annotations

import calendar
import json
import logging
import sys
import time
from pathlib import Path

import pytest
import trio

from tests.conftest import RunningServer, click, pageview, start_server
from tests.helpers import rewrite_stored, run_cli

FREE = "cs_live_free0000000"
FREE_TWIN = "cs_live_free0000001"
PAID = "cs_live_paid0000000"
ORIGIN = "https://shop.example"

TENANTS = {
    "keys": [
        {"key": FREE, "clientId": "freeco", "plan": "free", "rateLimit": 5000,
         "sites": [{"siteId": "a", "domains": ["shop.example"]}]},
        {"key": FREE_TWIN, "clientId": "freeco-eu", "billingAccount": "freeco", "plan": "free",
         "rateLimit": 5000, "sites": [{"siteId": "b", "domains": ["shop.example"]}]},
        {"key": PAID, "clientId": "paidco", "plan": "paid", "overage": True, "rateLimit": 5000,
         "sites": [{"siteId": "p", "domains": ["shop.example"]}],
         "contract": {"monthlyPageviews": 100, "pageviewCeiling": 150}},
    ]
}


def headers(key: str) -> dict[str, str]:
    return {"X-API-Key": key, "Origin": ORIGIN}


async def send(server: RunningServer, key: str, events: list[dict[str, object]]):
    return await server.client.post("/v1/events", json={"events": events}, headers=headers(key))


async def test_free_account_runs_out_and_is_refused_whole(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    # 4,975 pageviews through the main key and 25 through a second key of the same
    # billing account: both draw on the one pool of 5,000.
    async def fill(worker: int) -> None:
        for batch in range(worker, 199, 8):
            response = await send(server, FREE, [pageview(f"f{batch}-{i}") for i in range(25)])
            assert response.status_code == 202, response.text

    async with trio.open_nursery() as fillers:
        for worker in range(8):
            fillers.start_soon(fill, worker)
    last = await send(server, FREE_TWIN, [pageview(f"twin-{i}") for i in range(25)])
    assert last.status_code == 202
    assert last.headers["X-Service-Monthly-Used"] == "5000"
    assert last.headers["X-Service-Billing-Mode"] == "full"
    assert last.json()["billing"]["monthlyPageviews"]["used"] == 5000

    refused = await send(server, FREE, [click("c-extra"), pageview("one-too-many")])
    assert refused.status_code == 429
    body = refused.json()
    period = body["billingPeriod"]
    assert body == {
        "error": "usage_limit_exceeded",
        "message": body["message"],
        "reason": "included_limit_reached",
        "upgradeRequired": "paid",
        "billingPeriod": period,
        "used": 5000,
        "included": 5000,
        "safetyCeiling": 5000,
        "attempted": 1,
        "accepted": 0,
    }
    assert refused.headers["Retry-After"] == "3600"
    assert refused.headers["X-Service-Billing-Mode"] == "blocked"
    assert "X-Service-Budget-Type" not in refused.headers
    # the refused batch consumed nothing, and its click was not stored either
    replay = await send(server, FREE, [pageview("f0-0")])
    assert replay.json()["duplicates"] == 1
    assert replay.headers["X-Service-Monthly-Used"] == "5000"
    dump = run_cli("outbox", "dump", data_dir=server.data_dir).stdout
    assert "c-extra" not in dump
    rows = [json.loads(line) for line in run_cli("usage", "show", "--account", "freeco", data_dir=server.data_dir).stdout.splitlines()]
    assert {r["unit"]: r["used"] for r in rows} == {"pageview": 5000, "coverage": 0}


async def test_concurrent_requests_never_pass_the_allowance(nursery: trio.Nursery, tmp_path: Path) -> None:
    tenants = {"keys": [dict(TENANTS["keys"][0], contract={"monthlyPageviews": 40})]}
    server = await start_server(nursery, tmp_path, tenants)
    accepted = []

    async def one(n: int) -> None:
        response = await send(server, FREE, [pageview(f"k{n}-{i}") for i in range(3)])
        if response.status_code == 202:
            accepted.append(response.json()["accepted"])
        else:
            assert response.json()["error"] == "usage_limit_exceeded"

    async with trio.open_nursery() as many:
        for n in range(40):
            many.start_soon(one, n)
    assert sum(accepted) == 39  # 13 batches of 3 fit in 40, never more


async def test_paid_overage_meters_until_the_ceiling(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, tmp_path, TENANTS)
    for batch in range(4):
        response = await send(server, PAID, [pageview(f"p{batch}-{i}") for i in range(25)])
        assert response.headers["X-Service-Billing-Mode"] == "full"
    over = await send(server, PAID, [pageview(f"p9-{i}") for i in range(25)])
    assert over.status_code == 202
    assert over.headers["X-Service-Billing-Mode"] == "metered_overage"
    assert over.headers["X-Service-Budget-Ceiling"] == "150"
    assert over.json()["billing"]["monthlyPageviews"]["mode"] == "metered_overage"
    await send(server, PAID, [pageview(f"p10-{i}") for i in range(25)])
    stop = await send(server, PAID, [pageview("p11")])
    assert stop.status_code == 429
    assert stop.json()["reason"] == "safety_ceiling_reached"
    assert stop.json()["upgradeRequired"] is None
    period = stop.json()["billingPeriod"]
    invoice = [json.loads(line) for line in run_cli("usage", "invoice", "--period", period, data_dir=server.data_dir).stdout.splitlines()]
    pageview_line = next(line for line in invoice if line.get("unit") == "pageview")
    assert (pageview_line["overage"], pageview_line["blocks"], pageview_line["amount_usd"]) == (50, 1, 50)

    def report(command: str) -> list[dict[str, object]]:
        argv = ["usage", command] + (["--period", period] if command == "invoice" else ["--period", period])
        return [json.loads(line) for line in run_cli(*argv, data_dir=server.data_dir).stdout.splitlines()]

    def billed() -> tuple[object, ...]:
        line = next(line for line in report("invoice") if line.get("account") == "paidco"
                    and line.get("unit") == "pageview")
        return line["overage"], line["amount_usd"]

    # The overage served stays billed when the terms change afterwards (found by audit
    # helper-32: turning overage off, or moving the account's keys, dropped it).
    paid = dict(TENANTS["keys"][2])  # type: ignore[index]
    for changed in ({**paid, "overage": False}, {**paid, "contract": {"monthlyPageviews": 1000}},
                    {**paid, "billingAccount": "paidco-eu"}):
        path = tmp_path / "changed.json"
        path.write_text(json.dumps({"keys": [changed]}))
        run_cli("tenants", "import", str(path), data_dir=server.data_dir)
        assert billed() == (50, 50), changed
    shown = [row for row in report("show") if row["account"] == "paidco"]
    assert [(row["unit"], row["used"], row["mode"]) for row in shown] == [("pageview", 150, "unknown"),
                                                                          ("coverage", 0, "unknown")]


async def test_coverage_headers_and_the_accepted_event_ceiling(nursery: trio.Nursery, tmp_path: Path) -> None:
    tenants = {"keys": [dict(TENANTS["keys"][0], contract={"signalsCoverage": 2, "coverageCeiling": 3})]}
    server = await start_server(nursery, tmp_path, tenants)
    first = await send(server, FREE, [click("c1"), click("c2")])
    assert first.headers["X-Service-Signals-Coverage-Used"] == "2"
    # At the allowance it is still full (as the pageview mode is); past it, degraded.
    assert first.headers["X-Service-Signals-Coverage-Mode"] == "full"
    assert first.headers["X-Service-Signals-Coverage-Ceiling"] == "3"
    past = await send(server, FREE, [click("c3")])
    assert past.status_code == 202
    assert past.headers["X-Service-Signals-Coverage-Mode"] == "degraded"
    stop = await send(server, FREE, [click("c4")])
    assert stop.status_code == 429
    assert stop.json()["error"] == "accepted_event_safety_ceiling_reached"
    assert stop.headers["X-Service-Budget-Type"] == "accepted-events"
    # spec 7.2: the same shape as usage_limit_exceeded (helper-96: nothing pinned it)
    body = stop.json()
    assert body == {
        "error": "accepted_event_safety_ceiling_reached", "message": body["message"],
        "reason": "safety_ceiling_reached", "upgradeRequired": "paid", "billingPeriod": body["billingPeriod"],
        "used": 3, "included": 2, "safetyCeiling": 3, "attempted": 1, "accepted": 0,
    }, body
    assert (stop.headers["Retry-After"], stop.headers["X-Service-Billing-Mode"]) == ("3600", "blocked")
    assert "X-Service-Budget-Type" not in stop.headers.get("Access-Control-Expose-Headers", "")


async def test_period_rolls_over_at_the_utc_month_boundary(nursery: trio.Nursery, tmp_path: Path) -> None:
    tenants = {"keys": [dict(TENANTS["keys"][0], contract={"monthlyPageviews": 2})]}
    server = await start_server(nursery, tmp_path, tenants)
    end_of_month = calendar.timegm((2026, 11, 30, 23, 59, 59))
    server.clock.fixed = end_of_month + 0.5
    stamp = int(server.clock() * 1000)
    full = await send(server, FREE, [pageview("r1", timestamp=stamp), pageview("r2", timestamp=stamp)])
    assert full.headers["X-Service-Billing-Period"] == "2026-11"
    refused = await send(server, FREE, [pageview("r3", timestamp=stamp)])
    assert refused.status_code == 429
    server.clock.fixed = end_of_month + 1.0  # 2026-12-01T00:00:00Z
    fresh = await send(server, FREE, [pageview("r3", timestamp=stamp)])
    assert fresh.status_code == 202
    assert fresh.headers["X-Service-Billing-Period"] == "2026-12"
    assert fresh.headers["X-Service-Monthly-Used"] == "1"


async def test_a_contract_and_overage_belong_to_the_billing_account(nursery: trio.Nursery, tmp_path: Path) -> None:
    # The operator contract: `contract` and `overage` are the billing account's. A second key of
    # the account that carries neither still gets them (here a paid key with 100 included pageviews).
    twin = "cs_live_paid0000001"
    tenants = {"keys": [*TENANTS["keys"], {  # type: ignore[misc]
        "key": twin, "clientId": "paidco-eu", "billingAccount": "paidco", "plan": "paid", "rateLimit": 5000,
        "sites": [{"siteId": "q", "domains": ["shop.example"]}]}]}
    server = await start_server(nursery, tmp_path, tenants)
    response = await send(server, twin, [pageview("t1")])
    assert response.status_code == 202, response.text
    assert response.headers["X-Service-Monthly-Limit"] == "100"
    assert response.headers["X-Service-Budget-Ceiling"] == "150"  # the account's overage is on
    shown = [json.loads(line) for line in run_cli("usage", "show", "--account", "paidco",
                                                   data_dir=server.data_dir).stdout.splitlines()]
    assert {row["unit"]: row["included"] for row in shown}["pageview"] == 100
    # Two different contracts for one account in one file cannot be imported; nothing changes.
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps({"keys": [{**tenants["keys"][-1], "contract": {"monthlyPageviews": 7}},
                                          {**tenants["keys"][-2], "contract": {"monthlyPageviews": 8}}]}))
    refused = run_cli("tenants", "import", str(clash), data_dir=server.data_dir, check=False)
    assert refused.returncode == 2 and "different contracts" in refused.stderr
    assert (await send(server, twin, [pageview("t2")])).headers["X-Service-Monthly-Limit"] == "100"
    # The file's keys decide the account's terms, also for its keys the file does not name
    # (a rotated key's replacement exists only in storage): overage off, a new contract.
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps({"keys": [{**tenants["keys"][-2], "overage": False,
                                             "contract": {"monthlyPageviews": 200}}]}))
    run_cli("tenants", "import", str(changed), data_dir=server.data_dir)
    listed = {r["key"]: r for r in map(json.loads, run_cli("tenants", "list", data_dir=server.data_dir).stdout.splitlines())}
    assert listed[twin]["accountContract"] == {"monthlyPageviews": 200} and not listed[twin].get("accountOverage")


async def paid_key_server(
    nursery: trio.Nursery, tmp_path: Path, key: str, contract: dict[str, int]
) -> RunningServer:
    """A server with one paid key, overage off, on `contract`."""
    tenants = {"keys": [{"key": key, "clientId": key[8:], "plan": "paid", "rateLimit": 5000,
                         "sites": [{"siteId": "s", "domains": ["shop.example"]}], "contract": contract}]}
    return await start_server(nursery, tmp_path, tenants)


async def test_with_overage_off_a_higher_contract_ceiling_does_not_pass_the_allowance(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 3: with overage off, a batch that would exceed the allowance is refused (429, accepted 0);
    # 8.3: the Budget-Ceiling "equals the allowance with overage off".
    capped = "cs_live_capped00000"
    server = await paid_key_server(nursery, tmp_path, capped, {"monthlyPageviews": 5, "pageviewCeiling": 8})
    full = await send(server, capped, [pageview(f"c{i}") for i in range(5)])
    assert full.status_code == 202
    assert (full.headers["X-Service-Billing-Mode"], full.headers["X-Service-Budget-Ceiling"]) == ("full", "5")
    refused = await send(server, capped, [pageview("c5"), pageview("c6")])
    assert refused.status_code == 429
    assert (refused.json()["reason"], refused.json()["accepted"]) == ("included_limit_reached", 0)
    assert refused.headers["X-Service-Billing-Mode"] == "blocked"
    # The import says the ceiling does nothing here, instead of letting an operator believe it.
    note = run_cli("tenants", "import", str(tmp_path / "tenants.json"), data_dir=server.data_dir)
    assert "has a contract pageviewCeiling but overage off" in note.stderr


async def test_a_contract_ceiling_below_the_allowance_is_noted_by_import_and_serve(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The import accepted it silently, and the allowance could never be reached (review
    # helper-70 #2). Still accepted: `serve --tenants` re-imports the file at every start.
    low = "cs_live_lowceil0000"
    contract = {"monthlyPageviews": 20, "pageviewCeiling": 10, "signalsCoverage": 10, "coverageCeiling": 5}
    tenants = {"keys": [{"key": low, "clientId": "lowco", "plan": "paid", "overage": True, "rateLimit": 5000,
                         "sites": [{"siteId": "s", "domains": ["shop.example"]}], "contract": contract}]}
    with caplog.at_level(logging.WARNING, logger="collector"):
        server = await start_server(nursery, tmp_path, tenants)
    expected = [
        "billing account 'lowco' has a contract pageviewCeiling of 10, below its 20 included pageviews",
        "billing account 'lowco' has a contract coverageCeiling of 5, below its 10 included coverage units",
    ]
    logged = [r.getMessage() for r in caplog.records if "below its" in r.getMessage()]
    assert [len(logged), *(any(part in line for line in logged) for part in expected)] == [2, True, True], logged
    assert (await send(server, low, [pageview(f"w{i}") for i in range(10)])).status_code == 202
    stopped = await send(server, low, [pageview("w10")])
    assert (stopped.status_code, stopped.json()["reason"]) == (429, "safety_ceiling_reached")  # 10 of 20 used

    result = run_cli("tenants", "import", str(tmp_path / "tenants.json"), data_dir=server.data_dir)
    notes = result.stderr.splitlines()
    assert len(notes) == 2 and all(note.startswith("collector: note: ") for note in notes), notes
    assert all(part in note for part, note in zip(expected, notes, strict=True)), notes


async def test_signals_reads_degrade_at_a_coverage_ceiling_below_the_allowance(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 3: a read is degraded when coverage is exhausted "or safety ceiling reached".
    low = "cs_live_lowceil0000"
    server = await paid_key_server(nursery, tmp_path, low, {"signalsCoverage": 10, "coverageCeiling": 4})
    clicks = await send(server, low, [click(f"k{i}") for i in range(4)])
    assert clicks.headers["X-Service-Signals-Coverage-Used"] == "4"
    assert clicks.headers["X-Service-Signals-Coverage-Mode"] == "full"
    read = await server.client.get("/v1/signals/v1", params={"sessionId": "s1"}, headers=headers(low))
    assert read.status_code == 200
    assert read.json()["coverageMode"] == "degraded"
    assert read.headers["X-Service-Signals-Coverage-Used"] == "4"  # a degraded read spends nothing


async def test_a_billing_account_has_one_plan(nursery: trio.Nursery, tmp_path: Path) -> None:
    # A free and a paid key pool into one account: the account is paid (any key paid), so both
    # report the same terms, and the overage the paid key turned on is invoiced.
    free_key, paid_key = "cs_live_mixa0000000", "cs_live_mixb0000000"
    tenants = {"keys": [
        {"key": free_key, "clientId": "mix-a", "billingAccount": "mix", "plan": "free", "rateLimit": 5000,
         "sites": [{"siteId": "a", "domains": ["shop.example"]}], "contract": {"monthlyPageviews": 5}},
        {"key": paid_key, "clientId": "mix-b", "billingAccount": "mix", "plan": "paid", "overage": True,
         "rateLimit": 5000, "sites": [{"siteId": "b", "domains": ["shop.example"]}],
         "contract": {"monthlyPageviews": 5}},
    ]}
    server = await start_server(nursery, tmp_path, tenants)
    over = await send(server, paid_key, [pageview(f"m{i}") for i in range(8)])
    assert over.headers["X-Service-Billing-Mode"] == "metered_overage"
    other = await send(server, free_key, [click("m-click")])
    assert other.status_code == 202
    assert (other.headers["X-Service-Billing-Mode"], other.headers["X-Service-Budget-Ceiling"]) == (
        "metered_overage", "10")
    shown = [json.loads(line) for line in run_cli("usage", "show", "--account", "mix",
                                                   data_dir=server.data_dir).stdout.splitlines()]
    assert {row["unit"]: row["mode"] for row in shown}["pageview"] == "metered_overage"
    period = over.headers["X-Service-Billing-Period"]
    invoice = [json.loads(line) for line in run_cli("usage", "invoice", "--period", period,
                                                     data_dir=server.data_dir).stdout.splitlines()]
    line = next(row for row in invoice if row.get("account") == "mix" and row.get("unit") == "pageview")
    assert (line["overage"], line["amount_usd"]) == (3, 50)


async def test_an_unreadable_counter_is_503_even_when_nothing_is_admitted(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Spec 7.2: counters unreadable -> 503 usage_metering_unavailable, never a guessed usage figure.
    server = await start_server(nursery, tmp_path, TENANTS)
    first = await send(server, FREE, [pageview("u1")])
    period = first.headers["X-Service-Billing-Period"]
    # Another process writes the bad value (LMDB refuses a second open of the environment here).
    corrupt = (
        "import lmdb, sys\n"
        "env = lmdb.open(sys.argv[1], max_dbs=32)\n"
        "with env.begin(write=True) as txn:\n"
        "    txn.put(sys.argv[2].replace('/', '\\x00').encode(), b'\\x01\\x02\\x03', db=env.open_db(b'counters', txn=txn))\n"
    )
    await trio.run_process([sys.executable, "-c", corrupt, str(server.data_dir), f"freeco/{period}/coverage"])
    checkout = {"type": "form", "formId": "checkout", "action": "submit", "fieldCount": 1, "values": {"x": "y"}}
    dropped_only = await send(server, FREE, [pageview("u2", **checkout)])
    assert dropped_only.status_code == 503, dropped_only.text
    assert dropped_only.json()["error"] == "usage_metering_unavailable"
    assert dropped_only.headers["Retry-After"] == "5"


async def test_check_explains_usage_counted_before_a_billing_account_change(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The import records the move; check then notes the client's shortfall instead
    # of exiting 1 on a healthy directory (audit helper-32).
    server = await start_server(nursery, tmp_path, TENANTS, key_cache_ttl=0, key_negative_ttl=0)
    free = dict(TENANTS["keys"][0])  # type: ignore[index]
    assert (await send(server, FREE, [pageview("m1"), pageview("m2")])).status_code == 202
    for billing in ("freeco-moved", "freeco"):
        path = tmp_path / f"{billing}.json"
        path.write_text(json.dumps({"keys": [{**free, "billingAccount": billing}]}))
        run_cli("tenants", "import", str(path), data_dir=server.data_dir)
        assert (await send(server, FREE, [pageview(f"m-{billing}")])).status_code == 202
    result = run_cli("check", data_dir=server.data_dir, check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["problems"] == [], result.stdout
    assert any("its billing account changed in" in note for note in report["notes"]), report["notes"]


async def test_a_lowered_allowance_does_not_turn_served_units_into_overage(nursery: trio.Nursery, tmp_path: Path) -> None:
    # In a period after the one the overage counters began in, a period without
    # the counter served no overage: lowering the contract afterwards bills
    # nothing (review helper-37; it priced used - included).
    server = await start_server(nursery, tmp_path, TENANTS)  # serve marks the current period
    server.clock.fixed = calendar.timegm((2099, 1, 15, 12, 0, 0))
    stamp = int(server.clock() * 1000)
    served = await send(server, PAID, [pageview(f"l{i}", timestamp=stamp) for i in range(20)])
    assert served.headers["X-Service-Billing-Mode"] == "full"
    paid = dict(TENANTS["keys"][2])  # type: ignore[index]
    lowered = tmp_path / "lowered.json"
    lowered.write_text(json.dumps({"keys": [{**paid, "contract": {"monthlyPageviews": 5, "pageviewCeiling": 150}}]}))
    run_cli("tenants", "import", str(lowered), data_dir=server.data_dir)
    invoice = [json.loads(line) for line in
               run_cli("usage", "invoice", "--period", "2099-01", data_dir=server.data_dir).stdout.splitlines()]
    line = next(row for row in invoice if row.get("account") == "paidco" and row.get("unit") == "pageview")
    assert (line["used"], line["overage"], line["amount_usd"]) == (20, 0, 0), line


async def test_a_new_directory_bills_its_first_month_from_what_was_served(nursery: trio.Nursery, tmp_path: Path) -> None:
    # A fresh directory has no usage metered before its overage counters: its first
    # month is priced from them like any other, so terms changed afterwards do not
    # rewrite it (audit helper-42: it was priced as an upgrade month, used - included
    # under the new terms).
    server = await start_server(nursery, tmp_path, TENANTS, key_cache_ttl=0, key_negative_ttl=0)
    period = time.strftime("%Y-%m", time.gmtime(server.clock()))
    served = await send(server, PAID, [pageview(f"n{i}") for i in range(20)])
    assert served.headers["X-Service-Billing-Mode"] == "full", served.text
    paid = dict(TENANTS["keys"][2])  # type: ignore[index]
    lowered = tmp_path / "lowered.json"
    lowered.write_text(json.dumps({"keys": [{**paid, "contract": {"monthlyPageviews": 5, "pageviewCeiling": 150}}]}))
    run_cli("tenants", "import", str(lowered), data_dir=server.data_dir)
    invoice = [json.loads(line) for line in
               run_cli("usage", "invoice", "--period", period, data_dir=server.data_dir).stdout.splitlines()]
    line = next(row for row in invoice if row.get("account") == "paidco" and row.get("unit") == "pageview")
    assert (line["used"], line["included"], line["overage"], line["amount_usd"]) == (20, 5, 0, 0), line
    # Units admitted past the new allowance are served overage, counted from there.
    over = await send(server, PAID, [pageview("n-over")])
    assert over.headers["X-Service-Billing-Mode"] == "metered_overage", over.text
    invoice = [json.loads(line) for line in
               run_cli("usage", "invoice", "--period", period, data_dir=server.data_dir).stdout.splitlines()]
    line = next(row for row in invoice if row.get("account") == "paidco" and row.get("unit") == "pageview")
    assert (line["used"], line["overage"], line["amount_usd"]) == (21, 1, 50), line
    owed = next(row for row in invoice if row.get("account") == "paidco" and "account_total_usd" in row)
    assert owed == {"account": "paidco", "period": period, "account_total_usd": 50}
    assert invoice[-1] == {"period": period, "total_usd": 50}


async def test_an_unreadable_counter_is_named_and_never_billed_as_zero(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The server answers 503 for an account whose counter it cannot read; `usage invoice`
    # billed it 0 and `usage show` reported 0 used, exit 0 and silent (review helper-70 #1).
    other = "cs_live_other000000"
    tenants = {"keys": [
        TENANTS["keys"][0],
        {**TENANTS["keys"][2], "contract": {"monthlyPageviews": 5, "pageviewCeiling": 50}},  # type: ignore[dict-item]
        {"key": other, "clientId": "otherco", "plan": "paid", "overage": True, "rateLimit": 5000,
         "sites": [{"siteId": "o", "domains": ["shop.example"]}], "contract": {"monthlyPageviews": 5}},
    ]}
    server = await start_server(nursery, tmp_path, tenants)
    over = await send(server, PAID, [pageview(f"d{i}") for i in range(15)])
    assert over.headers["X-Service-Billing-Mode"] == "metered_overage", over.text
    assert (await send(server, other, [pageview(f"o{i}") for i in range(6)])).status_code == 202
    period = over.headers["X-Service-Billing-Period"]

    def cli(*argv: str) -> tuple[int, list[dict[str, object]], list[str]]:
        result = run_cli(*argv, data_dir=server.data_dir, check=False)
        assert "Traceback" not in result.stderr, result.stderr
        return result.returncode, [json.loads(line) for line in result.stdout.splitlines()], result.stderr.splitlines()

    def damage(kind: str) -> None:
        rewrite_stored(server.data_dir, "counters", f"paidco\x00{period}\x00{kind}".encode(), value=b"xyz")

    def named(kind: str, consequence: str) -> str:
        return (f"collector: usage counter paidco/{period}/{kind} does not decode, skipped:"
                f" its value is 3 bytes, not an 8-byte count; {consequence}")

    damage("pageview_overage")  # held 10
    status, out, err = cli("usage", "invoice", "--period", period)
    assert (status, err) == (1, [named("pageview_overage", "account 'paidco' is left out of the invoice")])
    assert [row.get("account") for row in out] == ["otherco"] * 3 + [None]  # nothing of paidco, not even $0
    assert out[-1] == {"period": period, "total_usd": 50}
    # show reads no overage counter, but names it: the service refuses the account's overage (helper-72)
    status, out, err = cli("usage", "show", "--account", "paidco")
    assert (status, [row["unit"] for row in out]) == (1, ["pageview", "coverage"])
    assert err == [named("pageview_overage", "the account's overage past its allowance is refused until it is repaired")]
    # Serving more overage it cannot count would never be billed: refused as metering trouble.
    refused = await send(server, PAID, [pageview("d-overage")])
    assert (refused.status_code, refused.json()["error"]) == (503, "usage_metering_unavailable"), refused.text
    assert f"usage counter paidco/{period}/pageview_overage is unreadable, refusing its writes" in [
        r.getMessage() for r in caplog.records]  # (the refusal named no counter, helper-74)
    assert cli("usage", "show", "--account", "paidco")[1][0]["used"] == 15  # nothing admitted

    damage("pageview")
    assert (await send(server, PAID, [pageview("d-more")])).status_code == 503
    status, out, err = cli("usage", "show", "--account", "paidco")
    assert (status, err) == (1, [named("pageview", "its row of account 'paidco' is left out"), named(
        "pageview_overage", "the account's overage past its allowance is refused until it is repaired")])
    assert [(row["unit"], row["used"]) for row in out] == [("coverage", 0)]
    status, out, err = cli("usage", "show")  # another account's damage is no reason to leave freeco out
    assert status == 1 and len(err) == 2 and {row["account"] for row in out} == {"freeco", "otherco", "paidco"}
    status, out, err = cli("usage", "invoice", "--period", period)
    assert status == 1 and len(err) == 2 and out[-1] == {"period": period, "total_usd": 50}
    assert cli("usage", "show", "--period", "2001-01")[0] == 0  # another period's counters are not read
    status, out, _ = cli("check")
    problems = out[0]["problems"]
    assert status == 1 and {f"usage counter paidco/{period}/{kind} is malformed"
                             for kind in ("pageview", "pageview_overage")} <= set(problems), problems


def test_usage_show_names_an_account_it_does_not_know(tmp_path: Path) -> None:
    # A misspelt --account printed nothing and exited 0, which reads as "used nothing".
    tenants_file = tmp_path / "tenants.json"
    tenants_file.write_text(json.dumps(TENANTS))
    data_dir = tmp_path / "data"
    run_cli("tenants", "import", str(tenants_file), data_dir=data_dir)

    known = run_cli("usage", "show", "--account", "freeco", data_dir=data_dir)
    assert {json.loads(line)["unit"] for line in known.stdout.splitlines()} == {"pageview", "coverage"}

    unknown = run_cli("usage", "show", "--account", "freeco-typo", "--period", "2026-11", data_dir=data_dir,
                      check=False)
    assert unknown.returncode == 2
    assert unknown.stdout == ""
    assert unknown.stderr.strip() == (
        "collector: no account 'freeco-typo': no key names it and it has no usage in 2026-11"
    )
    # An empty name is no account either (helper-126: it listed every account, exit 0).
    empty = run_cli("usage", "show", "--account", "", data_dir=data_dir, check=False)
    assert (empty.returncode, empty.stdout) == (2, ""), empty.stdout
    assert empty.stderr.startswith("collector: no account '': no key names it"), empty.stderr
