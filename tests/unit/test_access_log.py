"""The access log never writes a card number a client put in X-Request-ID."""

from __future__ import annotations

import json
import logging
import time

import pytest

from collector.http import access_log
from collector.http.asgi import Request
from collector.http.drain import Drain
from collector.http.unrouted import UnroutedAnswers
from collector.log_sink import stderr_sink
from collector.metrics import Metrics


def _logged_id(header: bytes, capfd: pytest.CaptureFixture[str]) -> str:
    request = Request({"method": "GET", "path": "/v1/signals/v", "headers": [(b"x-request-id", header)]})
    access_log.log_request(request, "/v1/signals/:visitorId", 200, None, "acme", time.perf_counter())
    access_log.flush()
    assert stderr_sink().flush(5)
    return str(json.loads(capfd.readouterr().err.splitlines()[-1])["requestId"])


def test_a_card_in_the_request_id_is_redacted_however_it_is_spaced(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(access_log.access, "level", logging.INFO)  # as `serve` configures it
    for header in (b"4111111111111111", "4111\u00a01111\u00a01111\u00a01111".encode()):
        assert _logged_id(header, capfd) == "[holds a payment card number]", header
    assert _logged_id(b"req-2024-000123", capfd) == "req-2024-000123"


def test_a_request_id_is_logged_as_the_utf8_sent_without_c1_controls(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # "é" was logged as "Ã©", and U+009B (CSI, which terminals obey) raw (audit helper-39)
    monkeypatch.setattr(access_log.access, "level", logging.INFO)
    assert _logged_id("café-1".encode(), capfd) == "café-1"
    assert _logged_id("x\u009b31m-y".encode(), capfd) == "x\ufffd31m-y"
    # and DEL, and the line breaks str.splitlines cuts a record at (helper-109)
    assert _logged_id("a\u2028b\u2029c\x7fd".encode(), capfd) == "a\ufffdb\ufffdc\ufffdd"


async def test_a_request_refused_as_the_server_closes_is_logged(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The 503 of a request that races the final close wrote no access line (stop 17's note).
    monkeypatch.setattr(access_log.access, "level", logging.INFO)

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("a closing server passes nothing on")

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    metrics = Metrics()
    drain = Drain(app, unrouted=UnroutedAnswers(metrics, access_log=True))
    drain.start_draining()
    drain.closing = True
    scope = {"type": "http", "method": "POST", "path": "/v1/events",
             "headers": [(b"x-request-id", b"r-1"), (b"origin", b"https://acme.com")]}
    await drain(scope, receive, send)
    access_log.flush()
    assert stderr_sink().flush(5)
    line = json.loads(capfd.readouterr().err.splitlines()[-1])
    assert (line["route"], line["status"], line["error"], line["requestId"]) == (
        "shutdown", 503, "service_unavailable", "r-1")
    head = sent[0]
    assert head["status"] == 503
    headers = {bytes(k).lower(): bytes(v) for k, v in head["headers"]}  # type: ignore[attr-defined]
    assert headers[b"x-request-id"] == b"r-1" and headers[b"connection"] == b"close"
    # readable by the browser script that sent it (helper-56)
    assert headers[b"access-control-allow-origin"] == b"https://acme.com"
    assert b"Retry-After" in headers[b"access-control-expose-headers"]
    # and counted, as every request answered (it was logged only)
    assert b'collector_requests_total{route="shutdown",status="503"} 1.0' in metrics.render()


def test_the_method_is_logged_short_and_without_c1_controls() -> None:
    # helper-113: h11 takes a method of any length and HTTP/2 any characters: a
    # 6,000-character method made a 6 KiB access line, torn under --workers
    assert access_log._loggable_method("POST") == "POST"
    assert access_log._loggable_method("A" * 6000) == "A" * 32
    assert access_log._loggable_method("G\x7fT\x9b") == "G\ufffdT\ufffd"
