"""ConnectionGuard: a failing connection is counted every time and logged at most once a minute."""

from __future__ import annotations

import logging

import pytest
import trio

from collector.http.connections import ConnectionGuard


async def test_failures_are_counted_and_the_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    counted: list[str] = []

    async def failing(stream: object) -> None:
        async with trio.open_nursery() as nursery:  # hypercorn's task groups wrap what they raise
            nursery.start_soon(_raise_key_error)

    guard = ConnectionGuard(failing, counted.append, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="collector.http"):
        for step in (0, 10, 10, 45):  # t = 1000, 1010, 1020, 1065
            now[0] += step
            await guard(None)  # type: ignore[arg-type]
    assert counted == ["KeyError"] * 4
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "(0 more since" in messages[0] and "(2 more since" in messages[1]
    # where it failed, but not the message: hypercorn's carry the request, headers and all
    logged = caplog.records[0].fields["exc"]  # type: ignore[attr-defined]
    assert "_raise_key_error" in logged and logged.endswith("builtins.KeyError (its message is not logged:"
                                                           " it may hold the request)")
    assert "cs_srv_live_secret" not in logged and caplog.records[0].exc_info is None


async def test_cancellation_is_not_swallowed() -> None:
    async def waits(stream: object) -> None:
        await trio.sleep_forever()

    guard = ConnectionGuard(waits, lambda name: None)
    with trio.move_on_after(0.01) as scope:
        await guard(None)  # type: ignore[arg-type]
    assert scope.cancelled_caught


async def _raise_key_error() -> None:
    raise KeyError(1)
