"""Shared fixtures: a real collector on 127.0.0.1 (port 0) over a real LMDB in a temp dir."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trio

from collector.app import serve
from collector.settings import load_settings

TENANTS = {
    "keys": [
        {
            "key": "cs_test_acme000000",
            "clientId": "acme",
            "name": "Acme",
            "plan": "free",
            "rateLimit": 100,
            "createdAt": "2026-11-01T00:00:00Z",
            "keyType": "browser",
            "sites": [{"siteId": "web", "name": "Acme web", "domains": ["acme.com"]}],
        },
        {
            "key": "cs_mob_live_acme000000",
            "clientId": "acme",
            "plan": "free",
            "rateLimit": 50,
            "keyType": "mobile",
            "sites": [{"siteId": "app", "name": "Acme app"}],
        },
        {
            "key": "cs_srv_live_acme000000",
            "clientId": "acme",
            "plan": "free",
            "rateLimit": 50,
            "keyType": "server",
            "sites": [{"siteId": "backend", "name": "Acme backend"}],
        },
        {
            "key": "cs_live_readonly0000",
            "clientId": "acme",
            "plan": "free",
            "keyType": "browser",
            "permissions": ["events:read"],
            "sites": [{"siteId": "web", "domains": ["acme.com"]}],
        },
        {
            "key": "cs_live_suspended000",
            "clientId": "gone",
            "plan": "free",
            "suspended": True,
            "sites": [{"siteId": "web", "domains": ["gone.com"]}],
        },
        {
            "key": "cs_live_paid00000000",
            "clientId": "bigco",
            "plan": "paid",
            "rateLimit": 5000,
            "sites": [{"siteId": "shop", "domains": ["bigco.com"]}],
        },
    ]
}

BROWSER_KEY = "cs_test_acme000000"
MOBILE_KEY = "cs_mob_live_acme000000"
SERVER_KEY = "cs_srv_live_acme000000"
PAID_KEY = "cs_live_paid00000000"


class MovableClock:
    """Wall clock seconds with an offset tests can move (no sleeping)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.fixed: float | None = None

    def __call__(self) -> float:
        return self.fixed if self.fixed is not None else time.time() + self.offset


@dataclass
class RunningServer:
    base_url: str
    data_dir: Path
    clock: MovableClock
    cancel: trio.CancelScope
    client: httpx.AsyncClient = field(init=False)


def write_tenants(path: Path, tenants: dict[str, object] | None = None) -> Path:
    path.write_text(json.dumps(tenants or TENANTS))
    return path


async def start_server(
    nursery: trio.Nursery,
    tmp_path: Path,
    tenants: dict[str, object] | None = None,
    *,
    steady: Callable[[], float] | None = None,
    clock: MovableClock | None = None,
    **overrides: object,
) -> RunningServer:
    data_dir = tmp_path / "data"
    tenants_file = write_tenants(tmp_path / "tenants.json", tenants)
    flags: dict[str, object] = {
        "data_dir": str(data_dir),
        "bind": "127.0.0.1:0",
        "tenants": str(tenants_file),
        "access_log": False,
    }
    flags.update(overrides)
    settings = load_settings(flags, environ={})
    clock = clock or MovableClock()
    cancel = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        with cancel:
            # (moving the test clock stands for time passing: the writer's ages follow it,
            # unless a test passes real time to check the guard against clock jumps)
            await serve(settings, clock=clock, steady=steady or clock, task_status=task_status)

    binds = await nursery.start(run)
    server = RunningServer(binds[0], data_dir, clock, cancel)
    server.client = httpx.AsyncClient(base_url=server.base_url, timeout=30)
    return server


@pytest.fixture
async def server(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[RunningServer]:
    running = await start_server(nursery, tmp_path)
    yield running
    await running.client.aclose()
    running.cancel.cancel()


@pytest.fixture
async def dev_server(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[RunningServer]:
    running = await start_server(nursery, tmp_path, env="development")
    yield running
    await running.client.aclose()
    running.cancel.cancel()


# One timestamp for the whole run, so the same helper call builds the same event
# (an exact replay) whenever a test calls it twice.
STAMP = int(time.time() * 1000)


def pageview(eid: str, **overrides: object) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "pageview",
        "_eid": eid,
        "visitorId": "v1",
        "sessionId": "s1",
        "timestamp": STAMP,
        "page": {"url": "https://acme.com/pricing", "path": "/pricing", "title": "Pricing"},
        "device": {"userAgent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0", "viewport": {"width": 1280, "height": 800}},
    }
    event.update(overrides)
    return event


def click(eid: str, **overrides: object) -> dict[str, object]:
    event = pageview(eid, type="click")
    event["element"] = {"selector": "button.buy", "text": "Buy", "x": 10, "y": 20}
    event.update(overrides)
    return event
