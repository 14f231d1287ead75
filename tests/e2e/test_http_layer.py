"""Transport-level misbehaviour through the real server: one connection's failure is that connection's."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
import trio
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    ExtensionFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    WindowUpdateFrame,
)

from collector.http import access_log, h2_protocol
from collector.log_sink import stderr_sink
from tests.conftest import BROWSER_KEY, RunningServer, pageview, start_server
from tests.helpers import h2_client, outbox_dump


def _h2_body_after_the_answer(base_url: str) -> list[str]:
    """HTTP/2 with prior knowledge: a POST whose body arrives after the server answered it
    (401), then another request on the same connection; what the client saw, in order.

    hypercorn 0.18 raises KeyError for a DATA frame on a stream it has closed: that
    exception once stopped the whole server, then ended the connection with every
    other stream on it (helper-99); RFC 9113 8.1 lets the body come.
    """
    seen: list[str] = []
    with h2_client(base_url, timeout=5) as (sock, conn):
        sock.sendall(conn.data_to_send())
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [
            (":method", "POST"), (":path", "/v1/events"), (":scheme", "http"), (":authority", "x"),
            ("x-api-key", "cs_live_nosuchkey000"), ("content-type", "application/json"),
        ])  # fmt: skip
        sock.sendall(conn.data_to_send())

        def read_until(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 5
            while not done() and time.monotonic() < deadline:
                for event in conn.receive_data(sock.recv(65536)):
                    if isinstance(event, h2.events.ResponseReceived):
                        seen.append("status " + dict(event.headers)[b":status"].decode())
                    elif isinstance(event, h2.events.StreamReset):
                        seen.append(f"reset {event.stream_id}")
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        seen.append("goaway")
                sock.sendall(conn.data_to_send())

        read_until(lambda: bool(seen))
        time.sleep(0.5)  # hypercorn forgets the stream soon after answering it
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            conn.send_data(stream, b'{"events":[]}', end_stream=True)
        later = conn.get_next_available_stream_id()
        conn.send_headers(later, [(":method", "GET"), (":path", "/healthz"), (":scheme", "http"),
                                  (":authority", "x")], end_stream=True)
        sock.sendall(conn.data_to_send())
        read_until(lambda: len([item for item in seen if item.startswith("status ")]) >= 2)
    return seen


async def test_a_late_http2_body_is_dropped_and_the_connection_goes_on(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_server(nursery, tmp_path)
    for _ in range(3):
        seen = await trio.to_thread.run_sync(_h2_body_after_the_answer, server.base_url)
        assert [item for item in seen if item.startswith("status ")] == ["status 401", "status 200"], seen
        assert "goaway" not in seen, seen
    assert "collector_connection_failures_total" not in (await server.client.get("/metrics")).text.replace(
        "# HELP collector_connection_failures_total", "").replace("# TYPE collector_connection_failures_total", "")


def _raw_request(base_url: str, path: str, host: str, method: str = "GET") -> bytes:
    """Everything the server sends until it closes the connection (Connection: close)."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):  # a server that keeps the connection open times out here
            answer += chunk
    return answer


async def test_operational_routes_take_any_host_close_when_asked_and_answer_head(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As Quart routes: a 64-character DNS label or an empty one made werkzeug's
    # URL adapter raise (a 500, an empty body, a traceback in the log), and the
    # connection stayed open after a response that said Connection: close.
    server = await start_server(nursery, tmp_path)
    for path in ("/healthz", "/readyz", "/metrics"):
        for host in ("a" * 64, "a..b", "collector.example"):
            answer = await trio.to_thread.run_sync(_raw_request, server.base_url, path, host)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.lower().startswith(b"http/1.1 200"), (path, host, answer[:200])
            assert b"\r\nx-request-id: " in head.lower() and body
        answer = await trio.to_thread.run_sync(_raw_request, server.base_url, path, "x", "HEAD")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.lower().startswith(b"http/1.1 200") and b"content-length: " in head.lower()
        assert body == b""
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
# A POST head promising a 1,000-byte body.
EVENTS_HEAD_1000 = (
    f"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: {BROWSER_KEY}\r\n"
    "Origin: https://acme.com\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
).encode()


async def _read_response(stream: trio.SocketStream) -> bytes:
    """One /healthz response (its JSON body ends with '}'), or what came before EOF."""
    answer = b""
    while not answer.endswith(b"}"):
        chunk = await stream.receive_some()
        if not chunk:
            return answer + b"<EOF>"
        answer += chunk
    return answer


async def _read_until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection (at most 5 s)."""
    answer = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


async def _open(server: RunningServer) -> trio.SocketStream:
    url = urlsplit(server.base_url)
    assert url.hostname and url.port
    return await trio.open_tcp_stream(url.hostname, url.port)


async def _served(stream: trio.SocketStream) -> None:
    """One GET /healthz on the connection, answered 200."""
    await stream.send_all(HEALTH)
    assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")


async def test_an_idle_keep_alive_connection_outlives_the_read_timeout(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # hypercorn's read_timeout also timed out idle reads, then held the connection
    # without reading until keep_alive_timeout: a request sent in between hung and
    # got a reset (with the defaults, any request after 31-75 s of quiet).
    server = await start_server(nursery, tmp_path, read_timeout=1, keep_alive_timeout=4)
    async with await _open(server) as stream:
        await _served(stream)
        await trio.sleep(2)  # idle past read_timeout, within keep_alive_timeout
        with trio.fail_after(2):
            await _served(stream)
        with trio.fail_after(6):  # keep_alive_timeout closes it once idle again
            assert await stream.receive_some() == b""
    # an empty line after a request (skipped, RFC 9112 2.2) leaves it idle too (helper-120:
    # it counted as a request head begun, and was cut at read_timeout)
    async with await _open(server) as stream:
        await stream.send_all(HEALTH + b"\r\n")
        assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")
        await trio.sleep(2)
        with trio.fail_after(2):
            await _served(stream)


async def test_a_connection_closes_when_its_client_does_or_a_request_stalls(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_server(nursery, tmp_path, read_timeout=1, keep_alive_timeout=30)
    # The client half-closes after a response: the server's side closes at once,
    # not after keep_alive_timeout (it sat in CLOSE-WAIT until then).
    async with await _open(server) as stream:
        await _served(stream)
        await stream.send_eof()
        with trio.fail_after(3):
            assert await stream.receive_some() == b""
    # A request whose body stalls longer than read_timeout: the connection closes
    # and nothing is stored.
    async with await _open(server) as stream:
        await stream.send_all(EVENTS_HEAD_1000 + b"{")
        with trio.fail_after(4):
            assert await stream.receive_some() == b""
    assert await outbox_dump(server.data_dir) == []


@pytest.fixture
def access_lines(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[], list[dict[str, Any]]]:
    """The access lines written so far (the log at INFO, as `serve` configures it)."""
    monkeypatch.setattr(logging.getLogger("collector.access"), "level", logging.INFO)

    def read() -> list[dict[str, Any]]:
        access_log.flush()  # (lines wait up to 0.25 s in a batch)
        assert stderr_sink().flush(5)
        return [json.loads(line) for line in capfd.readouterr().err.splitlines() if '"msg":"request"' in line]

    return read


async def test_a_body_trickled_within_each_read_timeout_is_cut_at_the_request_timeout(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-78: a byte every 25 s kept a request (and its buffered body) open without end.
    server = await start_server(nursery, tmp_path, read_timeout=1, request_timeout=2, access_log=True)
    async with await _open(server) as stream:
        await stream.send_all(EVENTS_HEAD_1000)
        closed = False
        with trio.move_on_after(15):
            for _ in range(60):  # a byte every 0.25 s: each read well within read_timeout
                await trio.sleep(0.25)
                try:
                    await stream.send_all(b" ")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    closed = True
                    break
                with trio.move_on_after(0.01):
                    if await stream.receive_some() == b"":
                        closed = True
                        break
        assert closed, "the trickled request was never cut"
    assert await outbox_dump(server.data_dir) == []
    # logged as the server's timeout, not as a client that left (helper-85)
    cut = [line for line in access_lines() if line["route"] == "/v1/events"]
    assert [(line["status"], line["error"]) for line in cut] == [(408, "request_timeout")], cut


async def test_a_request_head_sent_in_part_or_a_line_at_a_time_is_cut_like_a_body(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-85: the connection counted as idle until the head was whole, so a head
    # never finished, or trickled a line at a time, was held for keep_alive_timeout.
    server = await start_server(nursery, tmp_path, read_timeout=1, request_timeout=3, keep_alive_timeout=60)
    async with await _open(server) as stream:
        await stream.send_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        with trio.fail_after(5):
            assert await stream.receive_some() == b""
    async with await _open(server) as stream:
        cut = False
        with trio.move_on_after(20):
            await stream.send_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
            for n in range(40):  # a line every 0.5 s: each within read_timeout
                await trio.sleep(0.5)
                try:
                    await stream.send_all(f"X-Line-{n}: {n}\r\n".encode())
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    cut = True
                    break
        assert cut, "a head trickled a line at a time was never cut"


async def test_a_pipelined_request_sent_in_part_is_cut_at_the_read_timeout(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-86: part of a second request read with the first counted as idle again
    # once the first was answered, and was held for keep_alive_timeout.
    server = await start_server(nursery, tmp_path, read_timeout=1, request_timeout=3, keep_alive_timeout=60)
    async with await _open(server) as stream:
        await stream.send_all(HEALTH + b"GET /healthz HTTP/1.1\r\nHo")
        assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")
        with trio.fail_after(5):
            assert await stream.receive_some() == b""


def _h2_status(sock: socket.socket, conn: h2.connection.H2Connection) -> str:
    """The status of the first answer on an HTTP/2 connection ("closed" if it ends first)."""
    while data := sock.recv(65536):
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                return dict(event.headers)[b":status"].decode()
        sock.sendall(conn.data_to_send())
    return "closed"


def _h2_request_after(base_url: str, wait: float) -> str:
    """HTTP/2 with prior knowledge: the preface, `wait` seconds of nothing, then GET /healthz."""
    with h2_client(base_url, timeout=5) as (sock, conn):
        sock.sendall(conn.data_to_send())
        time.sleep(wait)
        conn.send_headers(1, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                          end_stream=True)
        sock.sendall(conn.data_to_send())
        return _h2_status(sock, conn)


async def test_an_http2_connection_waits_for_its_first_request_like_an_idle_one(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-86: the preface counted as the start of a request head, and the
    # connection was cut at read_timeout before its first request.
    server = await start_server(nursery, tmp_path, read_timeout=1, keep_alive_timeout=30)
    assert await trio.to_thread.run_sync(_h2_request_after, server.base_url, 2.5) == "200"


def _hold_the_write_lock(data_dir: Path, seconds: float) -> subprocess.Popen[str]:
    """A process holding LMDB's write lock on `data_dir` for `seconds` (started once it holds it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import lmdb, sys, time\n"
         "env = lmdb.open(sys.argv[1], max_dbs=64)\ntxn = env.begin(write=True)\nprint('held', flush=True)\n"
         f"time.sleep({seconds})", str(data_dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


async def test_an_answer_slower_than_the_read_timeout_is_sent_and_the_connection_kept(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-90: read_timeout ran while the server was answering a request that had all
    # arrived (the client sends nothing then): a commit slower than it cut the
    # connection, and past read_timeout + request_timeout the event was stored unanswered.
    server = await start_server(nursery, tmp_path, read_timeout=1, request_timeout=2, access_log=True)
    holder = await trio.to_thread.run_sync(_hold_the_write_lock, server.data_dir, 3.5)
    try:
        body = json.dumps(pageview("slow-commit")).encode()
        async with await _open(server) as stream:
            await stream.send_all(EVENTS_HEAD_1000.replace(b"Content-Length: 1000", b"Content-Length: %d" % len(body))
                                  .replace(b"Host: x\r\n", b"Host: x\r\nX-Request-ID: slow-1\r\n") + body)
            with trio.fail_after(10):
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                    answer += await stream.receive_some()
            assert answer.startswith(b"HTTP/1.1 202"), answer[:300]
            await _served(stream)  # the same connection, after 3.5 s of waiting
    finally:
        await trio.to_thread.run_sync(lambda: holder.wait(timeout=10))
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["slow-commit"]
    assert [(line["requestId"], line["status"]) for line in access_lines() if line["route"] == "/v1/events"] == [
        ("slow-1", 202)]


def _h2_stall(base_url: str, how: str) -> float | None:
    """Seconds until the server closes an HTTP/2 connection the client stalls (None: open after 10 s).

    `body`: a POST whose body stops after 20 of its 100 bytes (`pings`: and then a
    PING every 0.3 s; `flood`: PINGs as fast as the answers come); `window`: a
    client window of zero, so the answer to a GET /metrics cannot be sent.
    """
    settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0} if how == "window" else {}
    with h2_client(base_url, timeout=10, settings=settings) as (sock, conn):
        head = [(":authority", "x"), (":scheme", "http")]
        if how in ("body", "pings", "flood"):
            conn.send_headers(1, [(":method", "POST"), (":path", "/v1/events"), *head,
                                  ("x-api-key", BROWSER_KEY), ("origin", "https://acme.com"), ("content-length", "100")])
            conn.send_data(1, b"x" * 20)
        else:
            conn.send_headers(1, [(":method", "GET"), (":path", "/metrics"), *head], end_stream=True)
        sock.sendall(conn.data_to_send())
        started = time.monotonic()
        if how == "pings":
            sock.settimeout(0.3)
        try:
            while how == "flood" and time.monotonic() - started < 10:
                conn.ping(b"12345678")  # (one outstanding at a time: a read never waits for long)
                sock.sendall(conn.data_to_send())
                data = sock.recv(65536)
                if not data or any(isinstance(e, h2.events.ConnectionTerminated) for e in conn.receive_data(data)):
                    return time.monotonic() - started
            while True:
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    if time.monotonic() - started >= 10:
                        raise
                    conn.ping(b"12345678")
                    sock.sendall(conn.data_to_send())
                    continue
                if not data:
                    break
                conn.receive_data(data)
                sock.sendall(conn.data_to_send())  # (acknowledges settings; grants no window)
        except (TimeoutError, OSError):
            return None if time.monotonic() - started >= 10 else time.monotonic() - started
        return time.monotonic() - started


def _h2_post(base_url: str, body: bytes, refused_first: bool = False) -> str:
    """The status of one whole HTTP/2 POST /v1/events; `refused_first`: after a request
    on the same connection refused before its body (Expect: 100-continue, a bad key)."""
    with h2_client(base_url, timeout=20) as (sock, conn):
        head = [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"), (":scheme", "http")]
        if refused_first:
            conn.send_headers(1, [*head, ("x-api-key", "cs_live_nosuchkey000"), ("expect", "100-continue"),
                                  ("content-length", "100000")])  # (over 64 KiB: refused at once, not read first)
            sock.sendall(conn.data_to_send())
            assert _h2_status(sock, conn) == "401"
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [*head, ("x-api-key", BROWSER_KEY), ("origin", "https://acme.com"),
                                   ("content-type", "application/json"), ("content-length", str(len(body)))])
        conn.send_data(stream, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        return _h2_status(sock, conn)


def _h2_slow_answer_read_through_a_small_window(base_url: str, body: bytes) -> bytes | None:
    """POST `body` with a client window of 8 bytes, wait a second once the answer's head
    has come, then widen the window: the whole answer body (None: cut first)."""
    settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 8}
    with h2_client(base_url, timeout=15, settings=settings) as (sock, conn):
        conn.send_headers(1, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"), (":scheme", "http"),
                              ("x-api-key", BROWSER_KEY), ("origin", "https://acme.com"),
                              ("content-type", "application/json"), ("content-length", str(len(body)))])
        conn.send_data(1, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        answer, widened = b"", False
        while data := sock.recv(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    answer += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    return answer
            if answer and not widened:
                time.sleep(1)  # held up by this client for a second, well within request_timeout
                conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
                widened = True
            sock.sendall(conn.data_to_send())
        return None


async def test_an_http2_answer_slow_on_the_server_side_is_not_cut_when_its_client_then_holds_it_up(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-102: request_timeout for a held-up stream ran from when the stream opened,
    # so a commit that waited 3 s for LMDB's write lock, then a small client window,
    # cut the connection at once: the server's slowness was counted against the client.
    server = await start_server(nursery, tmp_path, read_timeout=30, request_timeout=2)
    holder = await trio.to_thread.run_sync(_hold_the_write_lock, server.data_dir, 3)
    try:
        body = json.dumps(pageview("held-after-slow")).encode()
        answer = await trio.to_thread.run_sync(_h2_slow_answer_read_through_a_small_window, server.base_url, body)
    finally:
        await trio.to_thread.run_sync(lambda: holder.wait(timeout=10))
    assert answer is not None and json.loads(answer)["accepted"] == 1


def _h2_posts_around_goaway(base_url: str, bodies: list[bytes], client_goaway_before: int | None) -> dict[str, Any]:
    """POST each of `bodies` on its own stream, all in one write (with the client's own
    GOAWAY before body number `client_goaway_before`), and read until the server
    closes: each stream's status or reset code, and the last stream ids of the
    server's GOAWAY frames."""
    with h2_client(base_url, timeout=10) as (sock, conn):
        # (h2 itself drops its side of a connection on GOAWAY, as the server's did: the
        # frame is noted here and the connection kept, as a browser keeps it)
        goaways: list[int] = []
        conn._frame_dispatch_table[GoAwayFrame] = lambda frame: (goaways.append(frame.last_stream_id), ([], []))[1]
        for n, body in enumerate(bodies):
            if n == client_goaway_before:
                conn.close_connection()
                conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN  # (sends on, as above)
            stream = 1 + 2 * n
            conn.send_headers(stream, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"),
                                       (":scheme", "http"), ("x-api-key", BROWSER_KEY), ("origin", "https://acme.com"),
                                       ("content-type", "application/json"), ("content-length", str(len(body)))])
            conn.send_data(stream, body, end_stream=True)
        if client_goaway_before == len(bodies):
            conn.close_connection()
            conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        sock.sendall(conn.data_to_send())
        outcome: dict[str, Any] = {}
        bodies: dict[int, bytes] = {}
        ended: list[int] = []
        while data := sock.recv(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    outcome[str(event.stream_id)] = dict(event.headers)[b":status"].decode()
                elif isinstance(event, h2.events.StreamReset):
                    outcome[str(event.stream_id)] = event.error_code
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended.append(event.stream_id)
            with contextlib.suppress(BrokenPipeError):  # (window updates after the server closed)
                sock.sendall(conn.data_to_send())
        outcome["goaway"] = goaways
        # every answer whole: its body to the end, END_STREAM sent (helper-110: the last
        # one's end was cut off when the connection closed)
        answered = sorted(int(stream) for stream, status in outcome.items() if status == "202")
        assert sorted(ended) == answered, (ended, answered)
        assert all(json.loads(bodies[stream])["success"] for stream in answered)
        return outcome


async def test_http2_goaway_lets_the_streams_already_open_finish(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-99: a client's GOAWAY ended the connection at once and its streams in flight
    # lost their answers; and at keep_alive_max_requests hypercorn's GOAWAY promised the
    # last stream an answer that h2 then refused to send: stored, never answered, the
    # client left waiting.
    server = await start_server(nursery, tmp_path, keep_alive_max_requests=2, access_log=True)
    bodies = [json.dumps(pageview(f"goaway-{n}")).encode() for n in range(4)]
    past_max = await trio.to_thread.run_sync(_h2_posts_around_goaway, server.base_url, bodies, None)
    # The third request passed the maximum of 2: GOAWAY named the last stream taken (7:
    # the four came in one read), each was answered, then the connection closed.
    assert past_max == {"1": "202", "3": "202", "5": "202", "7": "202", "goaway": [7, 7]}, past_max
    assert len(await outbox_dump(server.data_dir)) == 4

    # The client's GOAWAY after two streams: both answered; a third opened after it
    # anyway is refused unprocessed (REFUSED_STREAM: safe to retry), and not stored.
    bodies = [json.dumps(pageview(f"client-goaway-{n}")).encode() for n in range(3)]
    client_went = await trio.to_thread.run_sync(_h2_posts_around_goaway, server.base_url, bodies, 2)
    assert client_went == {"1": "202", "3": "202", "5": h2.errors.ErrorCodes.REFUSED_STREAM, "goaway": [3]}, client_went
    stored = sorted(str(row["eid"]) for row in await outbox_dump(server.data_dir))
    assert stored == ["client-goaway-0", "client-goaway-1", "goaway-0", "goaway-1", "goaway-2", "goaway-3"]
    assert [line["status"] for line in access_lines() if line["route"] == "/v1/events"] == [202] * 6


def _h2_rapid_reset(base_url: str, streams: int, made: bool = False) -> tuple[int | None, int]:
    """Open and at once reset `streams` streams (GET /healthz) in one write, then read
    until the server closes: the error code of its GOAWAY (None: none came) and how
    many answers came. `made`: the server is made to reset each stream (a POST whose
    body never comes, then a WINDOW_UPDATE overflowing its window: "MadeYouReset")."""
    with h2_client(base_url, timeout=10) as (sock, conn):
        frames = b""
        for _ in range(streams):
            stream = conn.get_next_available_stream_id()
            if made:
                conn.send_headers(stream, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"),
                                           (":scheme", "http"), ("x-api-key", BROWSER_KEY)])
                overflow = WindowUpdateFrame(stream)
                overflow.window_increment = 2**31 - 1
                frames += conn.data_to_send() + overflow.serialize()
                conn.streams.pop(stream, None)  # (the client's h2 would refuse the server's RST_STREAM)
            else:
                conn.send_headers(stream, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"),
                                           (":scheme", "http")], end_stream=True)
                conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
        sock.sendall(frames + conn.data_to_send())
        goaway, answers = None, 0
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        goaway = event.error_code
                    elif isinstance(event, h2.events.ResponseReceived):
                        answers += 1
                if goaway is not None:
                    break
        return goaway, answers


@pytest.fixture
def fresh_reset_allowances() -> Iterator[None]:
    # (allowances are per client address in this process: every test server here is 127.0.0.1)
    h2_protocol._resets_left.clear()
    yield
    h2_protocol._resets_left.clear()


async def test_an_http2_client_resetting_streams_as_fast_as_it_opens_them_is_cut_off(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # "Rapid reset" (CVE-2023-44487): each stream opened and reset started a route and
    # cancelled it; one connection kept a core busy (49,600 streams in 3 s: 3.4 s of CPU).
    server = await start_server(nursery, tmp_path, keep_alive_timeout=2)
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 150)
    assert goaway == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    # the allowance is the address's: a new connection does not start afresh ...
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 3)
    assert goaway == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    # ... but it is served, and a few resets a second are every client's
    assert await trio.to_thread.run_sync(_h2_post, server.base_url, json.dumps(pageview("after-resets")).encode()) == "202"
    await trio.sleep(1.2)  # (ten more a second)
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 5)
    assert goaway in (None, h2.errors.ErrorCodes.NO_ERROR)  # (closed idle after keep_alive_timeout)


async def test_an_http2_client_making_the_server_reset_its_streams_is_cut_off(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # "MadeYouReset" (CVE-2025-8671): streams the server itself reset, for a WINDOW_UPDATE
    # overflowing each one's window, cancelled a started route each and were not counted:
    # 20,000 in 8 s took 6.6 s of CPU (helper-116).
    server = await start_server(nursery, tmp_path, keep_alive_timeout=2)
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 150, True)
    assert goaway == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    await trio.sleep(1.2)  # a few a second are anyone's
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 5, True)
    assert goaway in (None, h2.errors.ErrorCodes.NO_ERROR)


def _h2_goaway_after(base_url: str, frames: Callable[[h2.connection.H2Connection], bytes]) -> int | None:
    """Send what `frames` makes (after the preface), then read: the server's GOAWAY code
    (None: the connection closed without one, or stayed open 5 s)."""
    with h2_client(base_url, timeout=5) as (sock, conn):
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(conn.data_to_send() + frames(conn))
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while data := sock.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        return event.error_code
    return None


def _get_then_data_after_end(conn: h2.connection.H2Connection) -> bytes:
    out = b""
    for _ in range(150):  # each stream ended, then DATA on it: h2 resets it itself, with no event
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"),
                                   (":scheme", "http")], end_stream=True)
        out += conn.data_to_send() + DataFrame(stream, data=b"x").serialize()
        conn.streams.pop(stream, None)
    return out


async def test_http2_floods_of_frames_that_open_no_stream_or_make_the_server_reset_are_cut_off(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # helper-118: PING, SETTINGS, WINDOW_UPDATE, empty DATA or unknown frames kept a core
    # busy from one connection; DATA after END_STREAM made h2 reset each stream with no
    # event, so the reset allowance never saw it.
    server = await start_server(nursery, tmp_path, keep_alive_timeout=2)
    pings = await trio.to_thread.run_sync(
        _h2_goaway_after, server.base_url, lambda conn: PingFrame(0, opaque_data=b"12345678").serialize() * 2000)
    assert pings == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    unknown = ExtensionFrame(0x20, 0, body=b"")
    assert await trio.to_thread.run_sync(
        _h2_goaway_after, server.base_url, lambda conn: unknown.serialize() * 2000) == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    # a few of them are anyone's: served, then closed idle
    assert await trio.to_thread.run_sync(
        _h2_goaway_after, server.base_url, lambda conn: PingFrame(0, opaque_data=b"12345678").serialize() * 50
    ) in (None, h2.errors.ErrorCodes.NO_ERROR)
    made = await trio.to_thread.run_sync(_h2_goaway_after, server.base_url, _get_then_data_after_end)
    assert made == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    # RST_STREAM on a stream long closed opens nothing either (helper-120: 1.9M in 6 s)
    def get_then_resets(conn: h2.connection.H2Connection) -> bytes:
        conn.send_headers(1, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                          end_stream=True)
        return conn.data_to_send() + RstStreamFrame(1, error_code=8).serialize() * 2000

    h2_protocol._resets_left.clear()  # (the one real reset among them must not be what cuts it)
    rsts = await trio.to_thread.run_sync(_h2_goaway_after, server.base_url, get_then_resets)
    assert rsts == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def _h2_window_back_after_a_refused_body(base_url: str) -> int:
    """A POST with no key (refused at once), then its body: how much connection window
    the server gives back, within 2 s, for the part sent after it reset the stream."""
    with h2_client(base_url, timeout=2) as (sock, conn):
        conn.send_headers(1, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"), (":scheme", "http"),
                              ("content-type", "application/json"), ("content-length", "64000")])
        sock.sendall(conn.data_to_send())
        given_back, reset = 0, False
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):  # its answer all sent: DATA now
                        conn.send_data(1, b"x" * 1_000)  # makes the server reset the stream (NO_ERROR)
                    elif isinstance(event, h2.events.StreamReset) and not reset:
                        # more of the body, sent before the client heard: h2 takes it with no
                        # event (the stream is closed), and owes its window back
                        reset = True
                        sock.sendall(DataFrame(1, data=b"x" * 16_000).serialize() * 3)
                    elif isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0 and reset:
                        given_back += event.delta
                sock.sendall(conn.data_to_send())
        return given_back


async def test_a_refused_http2_body_gives_its_window_back(nursery: trio.Nursery, tmp_path: Path) -> None:
    # helper-120: h2 acknowledged the refused stream's late DATA, but its WINDOW_UPDATE waited
    # for an event that never came: an upload beside it ran out of window and was cut, 408.
    server = await start_server(nursery, tmp_path)
    assert await trio.to_thread.run_sync(_h2_window_back_after_a_refused_body, server.base_url) >= 32_000


def _h2_refused_bodies_in_small_frames_then_get(base_url: str) -> str | None:
    """Ten POSTs with no key (refused before their bodies are read), each body 30,000
    bytes in 1,024-byte DATA frames as flow control allows, then a GET on the same
    connection: its status (None: the connection froze)."""
    with h2_client(base_url, timeout=5) as (sock, conn):
        events: list[h2.events.Event] = []

        def read() -> None:
            data = sock.recv(65536)
            if not data:
                raise ConnectionResetError
            events.extend(conn.receive_data(data))
            sock.sendall(conn.data_to_send())

        with contextlib.suppress(TimeoutError, ConnectionResetError, h2.exceptions.ProtocolError):
            left = {}
            for n in range(10):  # all ten opened, then their bodies side by side
                conn.send_headers(1 + 2 * n, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"),
                                              (":scheme", "http"), ("content-length", "30000")])
                left[1 + 2 * n] = 30_000
            while any(left.values()):
                for stream in left:
                    while left[stream] and conn.local_flow_control_window(stream) >= 1024:
                        try:
                            conn.send_data(stream, b"x" * 1024 if left[stream] > 1024 else b"x" * left[stream],
                                           end_stream=left[stream] <= 1024)
                        except h2.exceptions.StreamClosedError:  # (reset once answered)
                            left[stream] = 0
                            break
                        left[stream] = max(0, left[stream] - 1024)
                sock.sendall(conn.data_to_send())
                if any(left.values()):
                    read()
            conn.send_headers(21, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                              end_stream=True)
            sock.sendall(conn.data_to_send())
            while True:
                for event in events:
                    if isinstance(event, h2.events.ResponseReceived) and event.stream_id == 21:
                        return dict(event.headers)[b":status"].decode()
                read()
    return None


def test_bodies_refused_before_they_are_read_do_not_freeze_an_http2_connection(tmp_path: Path) -> None:
    # helper-123: a refusal never reads its body, and hypercorn's 10-item queue for it filled
    # with small DATA frames: the connection's only reader waited on it for ever (every stream,
    # PING and WINDOW_UPDATE with it, past every timeout and after the client left). (A server
    # process of its own: in this one, the client's thread and the server share the GIL, and
    # the server's reader never got ahead of its routes.)
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--demo", "--env", "development", "--bind", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "data"), "--no-access-log"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("listening on ")[1].strip()
        assert _h2_refused_bodies_in_small_frames_then_get(url) == "200"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _h2_sequential_gets(base_url: str, requests: int, path: str, *, window: int | None = None,
                        chained: bool = False) -> int:
    """Sequential GETs on one connection, each DATA acknowledged as it comes (a
    WINDOW_UPDATE every half window): how many were answered in full. `window`: the
    client's stream window; `chained`: each HEADERS depends on the stream before it
    (answered by then)."""
    settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window} if window else None
    answered = 0
    with h2_client(base_url, timeout=10, settings=settings) as (sock, conn), contextlib.suppress(
        ConnectionResetError, BrokenPipeError, TimeoutError, h2.exceptions.ProtocolError
    ):
        for n in range(requests):
            stream = 1 + 2 * n
            priority = {"priority_weight": 16, "priority_depends_on": max(0, stream - 2), "priority_exclusive": True}
            conn.send_headers(stream, [(":method", "GET"), (":path", path), (":authority", "x"), (":scheme", "http")],
                              end_stream=True, **(priority if chained else {}))
            sock.sendall(conn.data_to_send())
            done = False
            while not done:
                data = sock.recv(65536)
                if not data:
                    return answered
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return answered
                    done = done or (isinstance(event, h2.events.StreamEnded) and event.stream_id == stream)
                sock.sendall(conn.data_to_send())
            answered += 1
    return answered


async def test_window_updates_a_download_needs_are_not_a_flood(nursery: trio.Nursery, tmp_path: Path) -> None:
    # helper-123: the WINDOW_UPDATEs a client owes for the server's DATA were counted against
    # the allowance, and h2load with 64 KB windows was cut downloading /metrics
    server = await start_server(nursery, tmp_path)
    assert await trio.to_thread.run_sync(partial(_h2_sequential_gets, server.base_url, 100, "/metrics", window=1024)) == 100


def _h2_unfinished_header_block(base_url: str) -> float | None:
    """HEADERS without END_HEADERS and a CONTINUATION, then silence: seconds until the
    server closes (None: still open after 8 s)."""
    with h2_client(base_url, timeout=8) as (sock, conn):
        headers = HeadersFrame(1, data=b"\x82\x86\x84")  # :method GET, :scheme http, :path /
        block = ContinuationFrame(1, data=b"\x40\x01a\x01b")  # a: b, and no END_HEADERS
        sock.sendall(conn.data_to_send() + headers.serialize() + block.serialize())
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while sock.recv(65536):
                pass
            return time.monotonic() - started
    return None


async def test_an_unfinished_http2_header_block_is_cut_at_the_read_timeout(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-118: the connection counted as idle until END_HEADERS, and was held for
    # keep_alive_timeout (75 s) with up to 1 MB of frames buffered.
    server = await start_server(nursery, tmp_path, read_timeout=1, keep_alive_timeout=30)
    closed_after = await trio.to_thread.run_sync(_h2_unfinished_header_block, server.base_url)
    assert closed_after is not None and closed_after < 4, closed_after


def _h2_priority_for_ended_streams(base_url: str, count: int) -> str | None:
    """`count` PRIORITY frames for streams that ended, then a GET: its status (None: the
    connection was lost)."""
    with h2_client(base_url, timeout=10) as (sock, conn):
        out = conn.data_to_send()
        for stream in range(101, 101 + 2 * count, 2):  # ids a client may name (RFC 9113 5.3.4)
            out += PriorityFrame(stream, depends_on=0, stream_weight=15).serialize()
        sock.sendall(out)
        return _h2_status_after_get(sock, conn, 101 + 2 * count)


def _h2_status_after_get(sock: socket.socket, conn: h2.connection.H2Connection, stream: int) -> str | None:
    conn.send_headers(stream, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                      end_stream=True)
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        sock.sendall(conn.data_to_send())
        while data := sock.recv(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    return dict(event.headers)[b":status"].decode()
    return None


async def test_priority_for_streams_the_server_is_not_sending_on_is_let_be(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # helper-118: hypercorn put each in its priority tree, and the 1,000th ended the
    # connection (TooManyStreamsError) with every stream on it.
    monkeypatch.setattr(h2_protocol, "CONTROL_FRAMES_BURST", 10_000)  # (as if sent slowly)
    server = await start_server(nursery, tmp_path)
    assert await trio.to_thread.run_sync(_h2_priority_for_ended_streams, server.base_url, 1100) == "200"
    # nor is a parent that ended put back (helper-120: each stream depending on the one before)
    assert await trio.to_thread.run_sync(partial(_h2_sequential_gets, server.base_url, 1100, "/healthz", chained=True)) == 1100


def _h2_reset_then_silent(base_url: str) -> float | None:
    """Half a POST's body, RST_STREAM, then silence: seconds until the server closes
    (None: still open after 10 s)."""
    with h2_client(base_url, timeout=10) as (sock, conn):
        conn.send_headers(1, [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"), (":scheme", "http"),
                              ("x-api-key", BROWSER_KEY), ("origin", "https://acme.com"), ("content-length", "100")])
        conn.send_data(1, b"x" * 20)
        sock.sendall(conn.data_to_send())
        time.sleep(0.3)  # (its route is waiting for the rest of the body)
        conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        sock.sendall(conn.data_to_send())
        started = time.monotonic()
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return None
        except ConnectionResetError:
            pass
        return time.monotonic() - started


async def test_an_http2_connection_whose_last_stream_was_reset_is_closed_when_idle(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # helper-110: hypercorn let a reset stream go without saying the connection was
    # idle: it stayed open past keep_alive_timeout (200 s and counting), and held a drain.
    server = await start_server(nursery, tmp_path, keep_alive_timeout=1, read_timeout=30, request_timeout=60)
    closed_after = await trio.to_thread.run_sync(_h2_reset_then_silent, server.base_url)
    assert closed_after is not None and closed_after < 4, closed_after


def _h2_reset_after(base_url: str, how: str) -> float | None:
    """`goaway`: a POST's headers, the client's GOAWAY, then RST_STREAM; `answering`: a
    GET /metrics whose answer a 100-byte window holds back, reset once it began. Seconds
    until the server closes (None: still open after 10 s)."""
    settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100} if how == "answering" else {}
    with h2_client(base_url, timeout=10, settings=settings) as (sock, conn):
        goaways: list[int] = []
        conn._frame_dispatch_table[GoAwayFrame] = lambda frame: (goaways.append(frame.error_code), ([], []))[1]
        head = [(":authority", "x"), (":scheme", "http")]
        if how == "goaway":
            conn.send_headers(1, [(":method", "POST"), (":path", "/v1/events"), *head, ("x-api-key", BROWSER_KEY),
                                  ("origin", "https://acme.com"), ("content-length", "100")])
            sock.sendall(conn.data_to_send())
            time.sleep(0.3)  # (its route is waiting for the body)
            conn.close_connection()
            conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        else:
            conn.send_headers(1, [(":method", "GET"), (":path", "/metrics"), *head], end_stream=True)
            sock.sendall(conn.data_to_send())
            while not any(isinstance(e, h2.events.DataReceived) for e in conn.receive_data(sock.recv(65536))):
                pass
        conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        sock.sendall(conn.data_to_send())
        started = time.monotonic()
        try:
            while data := sock.recv(65536):
                conn.receive_data(data)
        except TimeoutError:
            return None
        except ConnectionResetError:
            pass
        assert h2.errors.ErrorCodes.PROTOCOL_ERROR not in goaways, goaways
        return time.monotonic() - started


async def test_an_http2_stream_reset_once_its_answer_began_or_after_goaway_holds_nothing_open(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # helper-113: hypercorn kept a reset stream's send buffer for ever. After a GOAWAY the
    # connection then never closed; a stream reset once its answer began held its route,
    # and a SIGTERM drain for the whole graceful_timeout.
    server = await start_server(nursery, tmp_path, keep_alive_timeout=1, read_timeout=30, request_timeout=60)
    after_goaway = await trio.to_thread.run_sync(_h2_reset_after, server.base_url, "goaway")
    assert after_goaway is not None and after_goaway < 0.5, after_goaway  # (closed at once, not when idle)
    answering = await trio.to_thread.run_sync(_h2_reset_after, server.base_url, "answering")
    assert answering is not None and answering < 4, answering


async def test_a_trusted_proxy_has_no_reset_allowance_of_its_own(
    nursery: trio.Nursery, tmp_path: Path, fresh_reset_allowances: None
) -> None:
    # helper-113: behind an HTTP/2 load balancer, its visitors' cancellations were counted
    # as one client's, and every visitor's connection was cut.
    server = await start_server(nursery, tmp_path, keep_alive_timeout=1, trusted_proxies=["127.0.0.1/32"])
    goaway, _ = await trio.to_thread.run_sync(_h2_rapid_reset, server.base_url, 150)
    assert goaway in (None, h2.errors.ErrorCodes.NO_ERROR)


async def test_an_http2_client_that_stalls_is_cut_at_the_read_timeout(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-93: with HTTP/2 reads unbounded, part of a body or a window of zero held
    # the connection and its handler for ever (150 s and counting).
    server = await start_server(
        nursery, tmp_path, read_timeout=1, request_timeout=3, keep_alive_timeout=60, access_log=True
    )
    for how in ("body", "window"):
        closed_after = await trio.to_thread.run_sync(_h2_stall, server.base_url, how)
        assert closed_after is not None and closed_after < 3, (how, closed_after)
    # PINGs are data, but the stalled request is still bounded by request_timeout, even
    # when a read never waits (helper-99: a PING a millisecond was never looked at; such
    # a flood is now cut sooner still, past its allowance of frames that open no stream)
    closed_after = await trio.to_thread.run_sync(_h2_stall, server.base_url, "pings")
    assert closed_after is not None and 3 <= closed_after < 6, closed_after
    closed_after = await trio.to_thread.run_sync(_h2_stall, server.base_url, "flood")
    assert closed_after is not None and closed_after < 6, closed_after
    # each logged: the body cut for being slow (408, not 499: the server cut it), and
    # the answer the window held back (it had no line at all)
    lines: list[tuple[str, int]] = []
    for _ in range(50):  # (a route writes its line once it hears of the close)
        lines += [(line["route"], line["status"]) for line in access_lines()]
        if len(lines) >= 4:
            break
        await trio.sleep(0.1)
    # (the PING flood's connection ends at the flood allowance, GOAWAY ENHANCE_YOUR_CALM:
    # its request then reads as one whose connection went, 499)
    assert sorted(lines) == [("/metrics", 200), *[("/v1/events", 408)] * 2, ("/v1/events", 499)], lines
    # and their places under max_connections are free at once (helper-97: for request_timeout)
    assert "collector_connections_open 1.0" in (await server.client.get("/metrics")).text  # (this one)
    # while a client that waits for a slow answer (its requests all sent) is not cut,
    # though an earlier stream of it was refused before its body (helper-99: h2 keeps
    # such a stream half-closed, and it counted as a body still arriving)
    holder = await trio.to_thread.run_sync(_hold_the_write_lock, server.data_dir, 3)
    try:
        body = json.dumps(pageview("h2-slow")).encode()
        assert await trio.to_thread.run_sync(_h2_post, server.base_url, body, True) == "202"
    finally:
        await trio.to_thread.run_sync(lambda: holder.wait(timeout=10))


async def test_a_client_that_reads_nothing_is_cut_off_at_the_request_timeout(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-78: 2,000 pipelined requests and no reading held the connection (and the
    # answers waiting to be sent) for as long as the client stayed.
    server = await start_server(nursery, tmp_path, request_timeout=2, keep_alive_timeout=60)
    sent = answered = 0
    async with await _open(server) as stream:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        try:
            with trio.move_on_after(3):  # until the server stops reading: its answers fill both buffers
                for _ in range(5000):
                    sent += 10  # (the last ten may be cut mid-send: at most ten unanswered)
                    await stream.send_all(request * 10)
            await trio.sleep(4)  # past request_timeout with a write blocked
            tail = b""
            with trio.fail_after(20):  # what was sent drains, then the connection ends
                while data := await stream.receive_some(1 << 20):
                    answered += (tail + data).count(b"HTTP/1.1 200")
                    tail = data[-16:]
                    answered -= tail.count(b"HTTP/1.1 200")  # (counted with the next read)
            answered += tail.count(b"HTTP/1.1 200")
        except trio.BrokenResourceError:
            pass  # a reset: the server closed with our requests unread
    # Cut off: requests it had not read stay unanswered (helper-96: with no timeout
    # at all this test passed; the server answered every one over 50 s).
    assert answered < sent - 10, (answered, sent)
    assert (await server.client.get("/healthz")).status_code == 200


def _h2_request_then_close(base_url: str) -> None:
    with h2_client(base_url, timeout=5) as (sock, conn):
        conn.send_headers(1, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                          end_stream=True)
        sock.sendall(conn.data_to_send())


async def test_an_http2_client_that_closes_at_once_gives_its_connection_back(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-83: its answer waited forever for a stream buffer no one drained; with
    # max_connections every later client got 503 for good.
    server = await start_server(nursery, tmp_path, max_connections=8, request_timeout=1)
    for _ in range(8):
        await trio.to_thread.run_sync(_h2_request_then_close, server.base_url)
    await trio.sleep(3)  # past request_timeout
    async with await _open(server) as stream:
        with trio.fail_after(5):
            await _served(stream)
    assert "collector_connections_open 1.0" in (await server.client.get("/metrics")).text


def _h2_refusal(base_url: str) -> tuple[int, int, bytes] | None:
    """A prior-knowledge HTTP/2 GET; the server's GOAWAY (code, last stream, debug data)."""
    with h2_client(base_url) as (sock, conn):
        conn.send_headers(1, [(":method", "GET"), (":path", "/healthz"), (":authority", "x"), (":scheme", "http")],
                          end_stream=True)
        sock.sendall(conn.data_to_send())
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        return event.error_code, event.last_stream_id, event.additional_data
    return None


async def test_connections_over_a_cap_are_told_503_at_once(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-78: one client's idle connections took every descriptor and locked everyone out.
    server = await start_server(nursery, tmp_path, max_connections=6, max_connections_per_client=3, access_log=True)
    held = [await _open(server) for _ in range(3)]
    try:
        await _served(held[0])  # (each is served; they stay open)
        async with await _open(server) as fourth:
            # its X-Request-ID echoed, and CORS so that a browser SDK reads the 503 and its Retry-After
            await fourth.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: mine-1\r\n"
                                  b"Origin: https://acme.com\r\n\r\n")
            with trio.fail_after(5):
                answer = await _read_response(fourth)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"x-request-id: mine-1\r\n" in head and b"retry-after: 5" in head and b"connection: close" in head
        assert b"Access-Control-Allow-Origin: https://acme.com" in head
        assert json.loads(body)["error"] == "service_unavailable"
        assert b"as many connections as one client may" in body
        # a prior-knowledge HTTP/2 client gets HTTP/2's refusal (helper-114: an HTTP/1.1 503
        # was a broken connection to it)
        assert await trio.to_thread.run_sync(_h2_refusal, server.base_url) == (
            h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, 0, b"this address holds as many connections as one client may:"
            b" retry shortly")
        await held.pop().aclose()
        await trio.sleep(0.1)
        async with await _open(server) as again:  # a slot came back
            await _served(again)
    finally:
        for stream in held:
            await stream.aclose()
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_connections_refused_total{cap="per_client"} 2.0' in metrics
    refused = [line for line in access_lines() if line["route"] == "connection_cap"]
    assert [(line["status"], line["method"]) for line in refused] == [(503, "GET"), (503, "PRI")]
    assert refused[0]["requestId"] == "mine-1"
    assert 'collector_requests_total{route="connection_cap",status="503"} 2.0' in metrics
    assert "collector_connections_max 6.0" in metrics


async def test_an_empty_line_before_a_request_line_is_skipped(nursery: trio.Nursery, tmp_path: Path) -> None:
    # RFC 9112 2.2: a server SHOULD ignore at least one empty line before a request
    # line. A client ending a body with an extra CRLF had its next request refused 400.
    server = await start_server(nursery, tmp_path)
    async with await _open(server) as stream:
        await stream.send_all(b"\r\n" + HEALTH)  # at the connection's start
        assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")
        await stream.send_all(b"\r\n\n" + HEALTH)  # between requests, one of them a bare LF
        assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")
        await stream.send_all(b"\r")  # an empty line split over two reads
        await trio.sleep(0.2)
        await stream.send_all(b"\n" + HEALTH)
        assert (await _read_response(stream)).startswith(b"HTTP/1.1 200")
    async with await _open(server) as stream:  # a few, not any number
        await stream.send_all(b"\r\n" * 3 + HEALTH)
        assert (await _read_until_closed(stream)).startswith(b"HTTP/1.1 400")
    async with await _open(server) as stream:  # counted per request, not per read (helper-120)
        for _ in range(3):
            await stream.send_all(b"\r\n")
            await trio.sleep(0.1)
        await stream.send_all(HEALTH)
        assert (await _read_until_closed(stream)).startswith(b"HTTP/1.1 400")


async def test_a_websocket_handshake_hypercorn_refuses_is_answered_and_its_connection_closed(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-136: a handshake without Sec-WebSocket-Key (or of another version, or over
    # HTTP/1.0) got a bare 400 and its connection stayed open past every timeout, taking
    # one of its address's connections and holding a drain to graceful_timeout.
    server = await start_server(nursery, tmp_path, access_log=True, keep_alive_timeout=30)
    upgrade = b"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nOrigin: https://acme.com\r\n"
    sent = [
        b"GET /live/ws HTTP/1.1\r\n" + upgrade + b"Sec-WebSocket-Version: 13\r\n\r\n",
        b"GET /live/ws HTTP/1.1\r\n" + upgrade + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 8\r\nX-Request-ID: ws-old\r\n\r\n",
        b"GET /live/ws HTTP/1.0\r\n" + upgrade + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n",
    ]
    for request in sent:
        async with await _open(server) as stream:
            await stream.send_all(request)
            answer = await _read_until_closed(stream)  # (closed within 5 s, not at keep_alive_timeout)
        head, _, body = answer.partition(b"\r\n\r\n")
        head = head.lower()
        assert head.startswith(b"http/1.1 400"), answer[:300]
        assert b"\r\nx-request-id: " in head and b"\r\nconnection: close" in head, head
        assert b"\r\naccess-control-allow-origin: https://acme.com" in head, head
        assert json.loads(body)["error"] == "bad_request", body
        assert (b"\r\nx-request-id: ws-old\r\n" in head) == (b"ws-old" in request), head
    lines = [line for line in access_lines() if line["route"] == "http_parser"]
    assert [(line["status"], line["error"]) for line in lines] == [(400, "bad_request")] * 3, lines
    assert "ws-old" in [line.get("requestId") for line in lines], lines
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_requests_total{route="http_parser",status="400"} 3.0' in metrics


async def test_the_http_parsers_refusals_carry_the_error_body_an_id_and_an_access_line(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # h11 answered what it could not parse with a bare status: no body, no X-Request-ID, no log line.
    server = await start_server(nursery, tmp_path, access_log=True)
    sent = {
        b"GARBAGE\r\n\r\n": (400, "bad_request"),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n": (400, "bad_request"),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n": (431, "request_head_too_large"),
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n": (501, "unsupported_transfer_encoding"),
    }
    for request, (status, code) in sent.items():
        async with await _open(server) as stream:
            await stream.send_all(request)
            answer = await _read_until_closed(stream)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d" % status), answer[:200]
        assert b"\r\nx-request-id: " in head and b"\r\nconnection: close" in head
        assert json.loads(body)["error"] == code
    parser_lines = [line for line in access_lines() if line["route"] == "http_parser"]
    assert [(line["status"], line["error"]) for line in parser_lines] == list(sent.values())
    metrics = (await server.client.get("/metrics")).text  # counted as every request answered
    assert 'collector_requests_total{route="http_parser",status="400"} 2.0' in metrics
    assert 'collector_requests_total{route="http_parser",status="431"} 1.0' in metrics
    # A body whose chunked framing breaks mid-request: its X-Request-ID echoed, nothing stored.
    events = json.dumps([pageview("e-broken-chunks")]).encode()
    async with await _open(server) as stream:
        await stream.send_all(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: " + BROWSER_KEY.encode()
            + b"\r\nOrigin: https://acme.com\r\nContent-Type: application/json\r\nX-Request-ID: broken-1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(events) + events + b"\r\nnot-a-size\r\n\r\n"
        )
        answer = await _read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 400") and b"\r\nx-request-id: broken-1\r\n" in answer, answer[:300]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "bad_request"
    # A browser script reads these only with CORS, as every route's answers (helper-117): a
    # head the parser read, and one refused unparsed for its size whose Origin had arrived.
    assert b"\r\naccess-control-allow-origin: https://acme.com\r\n" in answer.lower()
    async with await _open(server) as stream:
        await stream.send_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nOrigin: https://acme.com\r\n"
                              b"X-Request-ID: " + b"r" * 70_000 + b"\r\n\r\n")
        answer = await _read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 431") and b"\r\naccess-control-allow-origin: https://acme.com\r\n" in answer.lower()
    # Chromium sends a page's own headers before Origin: refused before its Origin came, a
    # 431 is still readable, by any origin without credentials (helper-122)
    async with await _open(server) as stream:
        await stream.send_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Request-ID: " + b"r" * 70_000
                              + b"\r\nOrigin: https://acme.com\r\n\r\n")
        answer = await _read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 431") and b"\r\naccess-control-allow-origin: *\r\n" in answer.lower()
    assert b"access-control-allow-credentials" not in answer.lower()
    # The route's access line says what was answered, under the id answered (helper-90: it
    # said 499 client_closed, and a minted id differed from the one the client got).
    async with await _open(server) as stream:
        await stream.send_all(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: " + BROWSER_KEY.encode()
            + b"\r\nOrigin: https://acme.com\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(events) + events + b"\r\nnot-a-size\r\n\r\n"
        )
        minted = (await _read_until_closed(stream)).partition(b"\r\nx-request-id: ")[2].partition(b"\r\n")[0]
    routed: list[tuple[int, str, str]] = []
    for _ in range(50):  # (the route writes its line once it hears of the close: wait for it)
        routed += [(line["status"], line["error"], line["requestId"])
                   for line in access_lines() if line["route"] == "/v1/events"]
        if len(routed) >= 2:
            break
        await trio.sleep(0.1)
    assert routed == [(400, "bad_request", "broken-1"), (400, "bad_request", minted.decode())], routed
    assert not [event for event in await outbox_dump(server.data_dir) if event.get("eid") == "e-broken-chunks"]


async def test_a_refusal_before_the_body_logs_what_the_client_got_when_the_body_then_breaks(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-104: a request refused before its body was read (no key, no route) whose
    # body framing then broke, or whose client left, was logged and counted with the
    # refusal's own status (401, 404), which never reached the client.
    server = await start_server(nursery, tmp_path, access_log=True)
    chunked = b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    sent = {
        "nokey-big": (b"POST /v1/events", chunked + b"1" * 20_000, b"HTTP/1.1 431"),
        "nokey-bad": (b"POST /v1/events", chunked + b"zz\r\n{}\r\n", b"HTTP/1.1 400"),
        "noroute-bad": (b"POST /v1/nowhere", chunked + b"zz\r\n{}\r\n", b"HTTP/1.1 400"),
        "nokey-gone": (b"POST /v1/events", b"Content-Length: 1000\r\n\r\n{", b""),
    }
    for request_id, (line, rest, expected) in sent.items():
        async with await _open(server) as stream:
            await stream.send_all(line + b" HTTP/1.1\r\nHost: x\r\nX-Request-ID: " + request_id.encode() + b"\r\n" + rest)
            if not expected:
                await stream.send_eof()
            answer = await _read_until_closed(stream)
        assert answer.startswith(expected) if expected else answer == b"", (request_id, answer[:200])
    logged: dict[str, tuple[str, int, str]] = {}
    for _ in range(50):  # (a route writes its line once it hears of the close: wait for it)
        logged |= {line["requestId"]: (line["route"], line["status"], line["error"])
                   for line in access_lines() if line["requestId"] in sent}
        if len(logged) == len(sent):
            break
        await trio.sleep(0.1)
    assert logged == {
        "nokey-big": ("/v1/events", 431, "request_head_too_large"),
        "nokey-bad": ("/v1/events", 400, "bad_request"),
        "noroute-bad": ("unmatched", 400, "bad_request"),
        "nokey-gone": ("/v1/events", 499, "client_closed"),
    }, logged
    metrics = (await server.client.get("/metrics")).text
    assert 'collector_requests_total{route="/v1/events",status="401"}' not in metrics
    assert 'collector_requests_total{route="unmatched",status="404"}' not in metrics
    assert 'collector_requests_total{route="/v1/events",status="499"} 1.0' in metrics


async def test_a_websocket_handshake_followed_by_stray_bytes_is_logged_as_answered_without_a_traceback(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    # (access_lines: the access log at INFO, as serve has it)
    # helper-109: hypercorn answered such a connection with a bare 400; the route's 404
    # refusal then raised into hypercorn, which logged an ERROR traceback each time (any
    # client could flood the log with them), and the access line said 404.
    server = await start_server(nursery, tmp_path, access_log=True)
    for _ in range(3):
        async with await _open(server) as stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nx")
            assert (await _read_until_closed(stream)).startswith(b"HTTP/1.1 400")
    access_log.flush()  # (the fixture's reader, by hand: the other lines are wanted too)
    assert stderr_sink().flush(5)
    logged = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    assert [(line["route"], line["status"], line["error"]) for line in logged  # (an earlier test's lines may
            if line["msg"] == "request" and line["route"] == "unmatched"] == [("unmatched", 400, "bad_request")] * 3
    assert not [line for line in logged if line["level"] == "error"], logged


async def _refused_then_reused(server: RunningServer, path: str, key: str, body: bytes) -> tuple[bytes, bytes]:
    """A POST refused before its body is read (the body arrives late), then a second request on the same connection."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nOrigin: https://acme.com\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    async with await _open(server) as stream:
        await stream.send_all(head)
        await trio.sleep(0.05)  # the server refuses on the headers alone
        await stream.send_all(body)
        first = b""
        with trio.fail_after(5):
            while b"}" not in first:
                first += await stream.receive_some()
        await trio.sleep(0.1)
        await stream.send_all(HEALTH)
        second = b""
        with trio.fail_after(5):
            while not second.endswith(b"}") and (chunk := await stream.receive_some()):
                second += chunk
    return first, second


async def test_a_refusal_before_the_body_leaves_the_connection_usable(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # hypercorn closes a connection whose response ended before its request body
    # arrived, without Connection: close: an SDK retrying a 429 on its pooled
    # connection got a network error. A short declared body is now read first.
    server = await start_server(nursery, tmp_path)
    body = json.dumps(pageview("late-body")).encode()
    for path, key, status in (
        ("/v1/events", "cs_live_nosuchkey000", b"401"),
        ("/v1/replay", "cs_live_nosuchkey000", b"401"),
        ("/nowhere", BROWSER_KEY, b"404"),
        ("/healthz", BROWSER_KEY, b"405"),
    ):
        first, second = await _refused_then_reused(server, path, key, body)
        assert first.startswith(b"HTTP/1.1 " + status), (path, first)
        assert b"connection: close" not in first.lower()
        assert second.startswith(b"HTTP/1.1 200"), (path, second)
    # A refused request without a body (a GET) keeps its connection too.
    async with await _open(server) as stream:
        await stream.send_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n" + HEALTH)
        answer = b""
        with trio.fail_after(5):
            while answer.count(b"HTTP/1.1 ") < 2 or not answer.endswith(b"}"):
                answer += await stream.receive_some()
        assert answer.startswith(b"HTTP/1.1 404") and b"connection: close" not in answer.lower()
        assert b"HTTP/1.1 200" in answer
    # A body over 64 KiB, or chunked, is not read (a client with no key could
    # otherwise make the server handle a million one-byte chunks per refusal):
    # the refusal says Connection: close.
    for framing in (b"Content-Length: 70000\r\n\r\n{", b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"):
        async with await _open(server) as stream:
            await stream.send_all(
                b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: cs_live_nosuchkey000\r\n" + framing
            )
            answer = await _read_until_closed(stream)
            assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower(), framing


async def test_an_absolute_form_target_is_routed_and_router_refusals_carry_cors(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_server(nursery, tmp_path)
    body = json.dumps(pageview("absolute-form")).encode()
    async with await _open(server) as stream:  # RFC 9112 3.2.2: a server must accept it
        await stream.send_all(
            f"POST http://collector.example/v1/events?x=1 HTTP/1.1\r\nHost: collector.example\r\n"
            f"X-API-Key: {BROWSER_KEY}\r\nOrigin: https://acme.com\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        answer = await _read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 202"), answer[:300]
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["absolute-form"]
    async with await _open(server) as stream:  # a route that reads the raw path
        await stream.send_all(
            f"GET http://collector.example/v1/signals/v1?sessionId=s1 HTTP/1.1\r\nHost: x\r\n"
            f"X-API-Key: {BROWSER_KEY}\r\nOrigin: https://acme.com\r\nConnection: close\r\n\r\n".encode()
        )
        answer = await _read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    async with await _open(server) as stream:  # a decoded %3F must not cut the path short
        await stream.send_all(b"GET http://x/healthz%3Fx HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await _read_until_closed(stream)).startswith(b"HTTP/1.1 404")
    for path, status in (("/nowhere", 404), ("/live/ws", 426)):
        refused = await server.client.get(path, headers={"Origin": "https://acme.com"})
        assert refused.status_code == status
        assert refused.headers["Access-Control-Allow-Origin"] == "https://acme.com"


async def test_a_response_leaves_in_one_write_and_an_interim_one_at_once(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hypercorn wrote a response as three sends (head, body, an empty end of
    # message): two extra syscalls and scheduler trips per request. The
    # server's writes are recorded at the socket stream, both ends being trio's.
    server = await start_server(nursery, tmp_path)
    port = urlsplit(server.base_url).port
    written: list[bytes] = []
    send_all = trio.SocketStream.send_all

    async def recording(self: trio.SocketStream, data: bytes | bytearray | memoryview) -> None:
        if self.socket.getsockname()[1] == port:
            written.append(bytes(data))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", recording)
    body = json.dumps({"events": [pageview("one-write")]}).encode()
    post = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: {BROWSER_KEY}\r\nOrigin: https://acme.com\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    async with await _open(server) as stream:
        for request, status in (
            (post + b"\r\n" + body, b"202"),
            (HEALTH, b"200"),
            (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
            (b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
        ):
            written.clear()
            await stream.send_all(request)
            with trio.fail_after(5):
                answer = await stream.receive_some()
                while not written or len(answer) < len(written[0]):
                    answer += await stream.receive_some()
            await trio.sleep(0.05)  # anything written after the answer would show here
            assert len(written) == 1 and written[0] == answer, (request[:20], written)
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 " + status)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert len(rest) == (0 if request.startswith(b"HEAD") else length)
        # Expect: 100-continue: the interim answer is not held back (the client waits for it)
        written.clear()
        await stream.send_all(post.replace(b"one-write", b"x") + b"Expect: 100-continue\r\n\r\n")
        with trio.fail_after(3):
            interim = await stream.receive_some()
        assert interim.startswith(b"HTTP/1.1 100 ")
        await stream.send_all(body.replace(b"one-write", b"continued"))
        with trio.fail_after(5):
            final = b""
            while b"}" not in final:
                final += await stream.receive_some()
        assert final.startswith(b"HTTP/1.1 202"), final
    assert [row["eid"] for row in await outbox_dump(server.data_dir)] == ["one-write", "continued"]


async def test_a_request_cancelled_with_its_connection_is_still_logged(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-99: a request whose connection ended under it (cancelled while its batch
    # waited for the writer) was committed with no access line and no count.
    server = await start_server(nursery, tmp_path, request_timeout=1, access_log=True)
    holder = await trio.to_thread.run_sync(_hold_the_write_lock, server.data_dir, 3)
    try:
        body = json.dumps(pageview("gone-1")).encode()
        async with await _open(server) as stream:
            await stream.send_all(EVENTS_HEAD_1000.replace(b"Content-Length: 1000", b"Content-Length: %d" % len(body))
                                  .replace(b"Host: x\r\n", b"Host: x\r\nX-Request-ID: gone-1\r\n") + body)
            await trio.sleep(0.2)
        lines: list[tuple[str, int, str]] = []
        for _ in range(50):  # (cut request_timeout after the client left)
            lines += [(line["requestId"], line["status"], line["error"]) for line in access_lines()
                      if line["route"] == "/v1/events"]
            if lines:
                break
            await trio.sleep(0.1)
        assert lines == [("gone-1", 499, "client_closed")], lines
    finally:
        await trio.to_thread.run_sync(lambda: holder.wait(timeout=10))
    assert 'collector_requests_total{route="/v1/events",status="499"} 1.0' in (await server.client.get("/metrics")).text


def _h2_refused_body_beside_a_batch(base_url: str) -> dict[int, str]:
    """One write: stream 1 a whole batch, stream 3 a bad key with its 12 KB body in 1 KB frames.
    The status each stream got (`closed` when the connection ended first)."""
    statuses: dict[int, str] = {}
    with h2_client(base_url, timeout=10) as (sock, conn):
        head = [(":method", "POST"), (":path", "/v1/events"), (":authority", "x"), (":scheme", "http"),
                ("origin", "https://acme.com"), ("content-type", "application/json")]
        body = json.dumps(pageview("beside-1")).encode()
        conn.send_headers(1, [*head, ("x-api-key", BROWSER_KEY), ("content-length", str(len(body)))])
        conn.send_data(1, body, end_stream=True)
        conn.send_headers(3, [*head, ("x-api-key", "cs_test_bogus000000000"), ("content-length", "12000")])
        for n in range(12):
            conn.send_data(3, b"x" * 1000, end_stream=n == 11)
        sock.sendall(conn.data_to_send())
        with contextlib.suppress(OSError):
            while len(statuses) < 2 and (data := sock.recv(65536)):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        statuses[event.stream_id] = dict(event.headers)[b":status"].decode()
                sock.sendall(conn.data_to_send())
    return statuses


async def test_a_refused_streams_body_in_the_same_read_leaves_the_other_streams_answered(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # helper-102: the late-body check ran once per read, before hypercorn handled it;
    # a stream answered while the read was delivered raised KeyError again, and the
    # batch beside it was stored and never answered.
    server = await start_server(nursery, tmp_path)
    for _ in range(5):
        assert await trio.to_thread.run_sync(_h2_refused_body_beside_a_batch, server.base_url) == {1: "202", 3: "401"}
    assert "collector_connection_failures_total{" not in (await server.client.get("/metrics")).text


async def test_a_client_that_closes_mid_request_is_logged_as_gone_not_as_a_bad_request(
    nursery: trio.Nursery, tmp_path: Path, access_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    # helper-102: h11 refuses a body cut short by the client's close, and it was logged
    # 400 bad_request (HTTP/2 said 499 for the same).
    server = await start_server(nursery, tmp_path, access_log=True)
    async with await _open(server) as stream:
        await stream.send_all(EVENTS_HEAD_1000.replace(b"Host: x\r\n", b"Host: x\r\nX-Request-ID: short-1\r\n")
                              + b'{"events": [')
    async with await _open(server) as stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHo")  # (half a head)
    lines: list[tuple[str, int, str]] = []
    for _ in range(50):
        lines += [(line["route"], line["status"], line["error"]) for line in access_lines()]
        if len(lines) >= 2:
            break
        await trio.sleep(0.1)
    assert sorted(lines) == [("/v1/events", 499, "client_closed"), ("http_parser", 499, "client_closed")], lines
