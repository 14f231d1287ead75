"""A storage failure's log line repeats at most once a minute, counting what it stood for."""

from __future__ import annotations

import logging

import pytest

from collector.logs import OncePerMinute
from storage.throttled_log import ThrottledLog


def test_a_burst_is_one_line_then_one_a_minute_with_its_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logged = ThrottledLog(logging.getLogger("test.throttled"), logging.ERROR, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="test.throttled"):
        for second in range(0, 130):  # a failure every second for over two minutes
            now[0] = float(second)
            logged("commit failed: %s", "No space left on device")
    assert [record.getMessage() for record in caplog.records] == [
        "commit failed: No space left on device",
        "commit failed: No space left on device (59 more like it since the last such line)",
        "commit failed: No space left on device (59 more like it since the last such line)",
    ]


def test_each_cause_is_throttled_apart(caplog: pytest.LogCaptureFixture) -> None:
    # one throttle for every cause let a burst of one hide another (review helper-45)
    logged = ThrottledLog(logging.getLogger("test.causes"), logging.ERROR, clock=lambda: 5.0)
    with caplog.at_level(logging.ERROR, logger="test.causes"):
        for _ in range(3):
            logged("storage unavailable: %s", "writer queue full", cause="busy")
        logged("storage unavailable: %s", "data.mdb was removed", cause="removed")
    assert [record.getMessage() for record in caplog.records] == [
        "storage unavailable: writer queue full", "storage unavailable: data.mdb was removed"]


def test_once_per_minute_holds_back_a_repeated_message_and_says_how_many() -> None:
    now = [0.0]
    held = OncePerMinute(clock=lambda: now[0])

    def passes(msg: str) -> str | None:
        record = logging.LogRecord("hypercorn.error", logging.ERROR, __file__, 1, msg, None, None)
        return record.getMessage() if held.filter(record) else None

    assert passes("Error in ASGI Framework") == "Error in ASGI Framework"
    assert passes("Error in ASGI Framework") is None
    assert passes("another") == "another"  # per message
    now[0] = 30.0
    assert passes("Error in ASGI Framework") is None
    now[0] = 61.0
    assert passes("Error in ASGI Framework") == (
        "Error in ASGI Framework (2 more like it since the last one were not logged)")
