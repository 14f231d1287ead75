"""The HTTP parser's own refusals, answered in the spec's error format.

h11 refuses what it cannot parse (a malformed request line or header line,
bad chunked framing: 400; a request head over hypercorn's
`h11_max_incomplete_size`: 431; a Transfer-Encoding other than chunked: 501)
before any route sees the request, and hypercorn answered those with a bare
status: no body, no X-Request-ID, no access line. An SDK branching on the
error field, and an operator looking for the request in the log, found
nothing. Here they get the error body (section 2.7), an X-Request-ID (the
client's when a request head was read, else a minted one) and, for a request
no route saw, an access line and a count in `collector_requests_total`
with route `http_parser`.

h11 also refused an empty line before a request line, which RFC 9112 (2.2)
asks a server to ignore: some clients end a POST body with an extra CRLF,
and the next request on that keep-alive connection was answered 400.
"""

from __future__ import annotations

import re
import time
from typing import Any, cast

import h11
from h11._readers import READERS
from h11._receivebuffer import ReceiveBuffer
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.ws_stream import WSStream

from collector.errors import ServiceError, render_error
from collector.http.asgi import PARSER_REFUSAL, Request
from collector.http.headers import EXPOSED_HEADERS, cors_headers
from collector.http.unrouted import UnroutedAnswers, stand_in_request

ACCESS_ROUTE = "http_parser"
EMPTY_LINES_SKIPPED = 2  # RFC 9112 2.2: "at least one"; a few more would only feed an idle client


def _skipping_empty_lines(read_request_line: Any) -> Any:
    def read(buf: ReceiveBuffer) -> h11.Request | None:
        data = buf._data
        if data[:1] not in b"\r\n" or not data:  # (every request but these: h11's reader alone)
            request: h11.Request | None = read_request_line(buf)
            if request is not None and hasattr(buf, "empty_lines_skipped"):
                buf.empty_lines_skipped = 0  # type: ignore[attr-defined]
            return request
        # (counted per request, on the connection's buffer: per read, one a read let a
        # client trickle empty lines for ever, helper-120)
        skipped = getattr(buf, "empty_lines_skipped", 0)
        while skipped < EMPTY_LINES_SKIPPED:
            if data[:2] == b"\r\n":
                buf._extract(2)
            elif data[:1] == b"\n":
                buf._extract(1)
            else:
                break
            skipped += 1
            data = buf._data
        buf.empty_lines_skipped = skipped  # type: ignore[attr-defined]
        if data == b"\r" and skipped < EMPTY_LINES_SKIPPED:  # half an empty line: wait for the rest
            return None
        request = read_request_line(buf)
        if request is not None:
            buf.empty_lines_skipped = 0  # type: ignore[attr-defined]
        return request

    return read


# h11 keeps one reader per (role, state) in this table, shared by every connection.
_IDLE_CLIENT = (h11.CLIENT, h11.IDLE)
if not getattr(READERS[_IDLE_CLIENT], "skips_empty_lines", False):
    READERS[_IDLE_CLIENT] = _skipping_empty_lines(READERS[_IDLE_CLIENT])
    READERS[_IDLE_CLIENT].skips_empty_lines = True  # type: ignore[union-attr]


def _error_for(status: int, head_limit: int) -> ServiceError:
    if status == 431:
        return ServiceError(
            "request_head_too_large", f"the request head (or a chunk's size line) is over {head_limit} bytes"
        )
    if status == 501:
        return ServiceError(
            "unsupported_transfer_encoding", "Transfer-Encoding must be chunked (once), or absent"
        )
    return ServiceError(
        "bad_request",
        "the request is not valid HTTP/1.1 (its request line, a header line or its chunked framing);"
        " nothing was stored",
    )


ANY_ORIGIN_MAY_READ = [("Access-Control-Allow-Origin", "*"), ("Access-Control-Expose-Headers", EXPOSED_HEADERS)]
_ORIGIN_LINE = re.compile(rb"\r?\norigin:[ \t]*([\x21-\x7e]{1,2048})[ \t]*\r?\n", re.IGNORECASE)


def _origin_in_head(protocol: H11Protocol) -> str | None:
    """The Origin of a head h11 refused unparsed for its size, if it arrived: the
    refusal is then readable by the script that sent it. (A head refused for a
    malformed line has left the buffer; browsers send none.)"""
    buffer = getattr(protocol.connection, "_receive_buffer", None)
    found = _ORIGIN_LINE.search(bytes(buffer._data)) if buffer is not None else None
    return found.group(1).decode("ascii") if found else None


def answer_parse_errors(protocol: H11Protocol, unrouted: UnroutedAnswers) -> None:
    """Make `protocol` (one connection's) answer its parser's refusals in the error format."""

    async def send_error_response(status_code: int) -> None:
        started = time.perf_counter()
        stream = protocol.stream
        in_request = stream is not None and hasattr(stream, "scope")
        scope: Any = stream.scope if in_request else None  # type: ignore[union-attr]
        request = Request(scope) if in_request else stand_in_request("-", "-", "")
        error = _error_for(status_code, protocol.config.h11_max_incomplete_size)
        # h11 also refuses a request its client closed in the middle of ("peer closed
        # connection without sending complete message body"): no one is there to
        # answer, and it is the client's leaving, 499 (helper-102: logged as 400).
        client_gone = getattr(protocol.connection, "_receive_buffer_closed", False)
        status, code = (499, "client_closed") if client_gone else (status_code, error.code)
        if in_request:  # the route, told the client left, logs what was answered instead
            scope[PARSER_REFUSAL] = (status, code)
        if not client_gone:
            body = render_error(error)
            origin = request.headers.get("origin") if in_request else _origin_in_head(protocol)
            headers = [*_refusal_head(body, request.request_id, origin), *protocol.config.response_headers("h11")]
            await protocol._send_h11_event(h11.Response(status_code=status_code, headers=headers))
            await protocol._send_h11_event(h11.Data(data=body))
            await protocol._send_h11_event(h11.EndOfMessage())
        # A request a route already saw is counted and logged when its handler ends.
        if not in_request:
            unrouted.record(request, ACCESS_ROUTE, status, code, started)

    protocol._send_error_response = send_error_response  # type: ignore[method-assign]
    _answer_refused_handshakes(protocol, unrouted)


def _refusal_head(body: bytes, request_id: str, origin: str | None) -> list[tuple[bytes, bytes]]:
    """The headers of a refusal no route made: its JSON body's, its id, the close, and the
    CORS headers of every route, which a browser script needs to read it (helper-117); a
    head refused before its Origin arrived, Chromium's order when a custom header is huge,
    may be read by any origin, without credentials: it says nothing of anyone."""
    cors = cors_headers(origin) if origin else ANY_ORIGIN_MAY_READ
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode("latin-1")),
        (b"connection", b"close"),
        *((name.encode(), value.encode("latin-1")) for name, value in cors),
    ]


def _answer_refused_handshakes(protocol: H11Protocol, unrouted: UnroutedAnswers) -> None:
    """Make `protocol` answer a WebSocket handshake hypercorn refuses in the error format,
    and close the connection after it.

    hypercorn refuses a handshake it finds invalid (no `Sec-WebSocket-Key`, a version
    other than 13, HTTP/1.0) before any route sees it, with a bare 400 marked
    `Connection: close`, and then never ends the stream: the connection stayed open,
    past keep_alive_timeout and request_timeout (it was never idle), taking one of its
    address's connections and holding a drain to graceful_timeout (helper-136). Here the
    answer is the error body with an X-Request-ID, an access line and a count with
    route `http_parser`, and the stream ends, so the connection closes.
    """
    send = protocol.stream_send  # (the stream is made with the protocol's stream_send: set before any request)

    async def stream_send(event: StreamEvent) -> None:
        stream = protocol.stream
        refused = isinstance(stream, WSStream) and stream.app_put is None and not stream.handshake.accepted
        if not refused or not isinstance(event, Response | EndBody):
            await send(event)
            return
        if isinstance(event, Response):
            started = time.perf_counter()
            request = Request({**cast(Any, stream).scope, "method": "GET"})  # (a WebSocket scope has none)
            error = ServiceError(
                "bad_request", "not a WebSocket handshake this server can take (RFC 6455 4.2.1: GET over"
                " HTTP/1.1 with Sec-WebSocket-Key and Sec-WebSocket-Version 13)",
            )
            body = render_error(error)
            headers = [
                *_refusal_head(body, request.request_id, request.headers.get("origin")),
                (b"sec-websocket-version", b"13"),  # (RFC 6455 4.4: the version it speaks)
            ]
            await send(Response(stream_id=event.stream_id, status_code=400, headers=headers))
            await send(Body(stream_id=event.stream_id, data=body))
            unrouted.record(request, ACCESS_ROUTE, 400, error.code, started)
            return
        await send(event)
        await send(StreamClosed(stream_id=event.stream_id))

    protocol.stream_send = stream_send  # type: ignore[method-assign]
