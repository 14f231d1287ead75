"""Raw ASGI plumbing for the hot routes: headers in, body with caps, response out.

The ingest routes bypass Quart's request machinery (about half a millisecond
per request on this stack); everything here is deliberately minimal.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import trio

from collector.errors import ServiceError, render_error

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON_CONTENT_TYPE = (b"content-type", b"application/json")


REQUEST_ID_MAX = 200  # bytes of a client's X-Request-ID echoed (and logged)


REQUEST_ID_KEY = "collector.request_id"  # in the ASGI scope
PARSER_REFUSAL = "collector.parser_refusal"  # in the ASGI scope: (status, code) h11's refusal was answered with


def request_id_for(supplied: str) -> str:
    """The X-Request-ID of a response: the client's (its first 200 bytes), else a minted one."""
    if len(supplied) > REQUEST_ID_MAX:
        supplied = supplied[: _utf8_cut(supplied, REQUEST_ID_MAX)]
    if not supplied:
        # A minted id only needs to be unique, not secret: os.urandom releases
        # the GIL on every call, which costs a GIL hand-off while the writer
        # thread runs. (random is reseeded in forked workers.)
        return f"{random.getrandbits(96):024x}"
    return supplied


def _utf8_cut(text: str, limit: int) -> int:
    """Where to cut a header (read as Latin-1, a character a byte) at `limit` bytes without
    splitting a UTF-8 character: before the lead byte (0xC0-0xF7) of a character that the
    limit would split, looked for among the 3 bytes before it; else at the limit."""
    for back in range(1, 4):
        if limit - back < 0 or not "\x80" <= text[limit - back + 1] <= "\xbf":
            break
        if "\xc0" <= text[limit - back] <= "\xf7":
            return limit - back
    return limit


# Headers that hold one value (not a list): a repeat of the same value adds nothing.
_SINGLE_VALUED = frozenset({
    "x-api-key", "idempotency-key", "origin", "referer", "content-type", "user-agent",
    "x-cs-timestamp", "x-cs-signature", "x-request-id",
})  # fmt: skip


class Request:
    """The parts of an ASGI HTTP scope the handlers read, decoded once."""

    __slots__ = ("scope", "method", "path", "headers", "_query", "request_id", "client_ip")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            if key not in headers:
                headers[key] = text
            elif key in _SINGLE_VALUED and text == headers[key]:
                # The same value twice (a proxy that adds what the client sent): one.
                # Joined, `Idempotency-Key: k1` twice was the id "k1, k1/0", another
                # event than its retry's, and an Origin twice no registered domain.
                continue
            else:  # repeated headers are joined as HTTP allows (RFC 9110 5.3)
                headers[key] = f"{headers[key]}, {text}"
        self.headers = headers
        self._query: dict[str, str] | None = None
        # Kept in the scope: the parser's refusal of this request (parse_errors) answers
        # with the same id as its access line, when the id was minted.
        request_id = scope.get(REQUEST_ID_KEY)
        if request_id is None:
            request_id = scope[REQUEST_ID_KEY] = request_id_for(headers.get("x-request-id", ""))
        self.request_id: str = request_id
        client = scope.get("client")
        self.client_ip: str | None = client[0] if client else None

    @property
    def query(self) -> dict[str, str]:
        if self._query is None:
            raw = self.scope.get("query_string", b"")
            self._query = dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}
        return self._query


async def read_body(request: Request, receive: Receive, limit: int) -> bytes:
    """The whole body, refusing with 413 payload_too_large past `limit` bytes.

    A declared Content-Length over the limit is refused before reading.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _too_large(limit)
        except ValueError:
            raise ServiceError("validation_error", "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise client_gone(request)
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> ServiceError:
    return ServiceError(
        "payload_too_large", f"request body is over the {limit // (1024 * 1024)} MB limit"
    )


class ClientGone(Exception):
    """The client disconnected before its request body arrived, or the server stopped
    waiting for it (`timed_out`: read_timeout or request_timeout)."""

    def __init__(self, *, timed_out: bool = False, refused: tuple[int, str] | None = None) -> None:
        super().__init__()
        self.timed_out = timed_out
        self.refused = refused  # (status, code) the HTTP parser answered instead (broken body framing)

    @property
    def answered(self) -> tuple[int, str]:
        """The status and code its request is counted and logged with: what the parser
        answered, else nginx's 499 (the client closed before its answer) or 408 (the
        server stopped waiting for a request too slow to arrive); no answer of the
        route's is sent."""
        if self.refused is not None:
            return self.refused
        return (408, "request_timeout") if self.timed_out else (499, "client_closed")


def client_gone(request: Request) -> ClientGone:
    """The request's client has gone (or the parser answered it), with why."""
    client = request.scope.get("client")
    return ClientGone(
        timed_out=client is not None and tuple(client) in CUT_BY_TIMEOUT, refused=request.scope.get(PARSER_REFUSAL)
    )


# The (address, port) of the connections whose request the server cut for being too
# slow, while they last (collector/http/connections.py): the request is then logged
# as the server's timeout (408), not as a client that left (499).
CUT_BY_TIMEOUT: set[tuple[str, int]] = set()


# A refusal sent before the body was read (a bad key, a rate limit) reads and
# discards it first only when its declared Content-Length is at most this, in
# at most DRAIN_MESSAGES reads: an SDK's batch takes one or two. Anything else
# (chunked, larger, dribbled, slower than DRAIN_SECONDS) is not read, and the response says
# Connection: close. Without the bounds, a client with no key could make the
# server handle a million one-byte chunks per refusal, again and again.
DRAIN_LIMIT = 64 * 1024
DRAIN_MESSAGES = 64
DRAIN_SECONDS = 2.0  # a refusal waits no longer than this for a body that does not come


class BodyTracker:
    """The ASGI receive of one request, remembering whether its body has all arrived.

    HTTP/1.1 can only carry the next request on a connection once this one's
    body has been read. hypercorn closes a connection whose response finished
    before its request body did, without saying so (no `Connection: close`):
    a client that reuses it for a retry, as SDKs do after a 429, gets a
    network error instead of an answer. `finish` reads the rest before a
    refusal is sent, or tells the caller to close.
    """

    __slots__ = ("_receive", "done", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = False
        self.disconnected = False  # the body ended in a disconnect, not its last byte

    async def receive(self) -> MutableMapping[str, Any]:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.done = self.disconnected = True
        elif not message.get("more_body", False):
            self.done = True
        return message

    def gone(self, request: Request) -> ClientGone | None:
        """Why no answer of the route's can reach the client any more, if none can: it
        left while its body was read, or the HTTP parser answered its broken body."""
        if not (self.disconnected or request.scope.get(PARSER_REFUSAL)):
            return None
        return client_gone(request)

    async def finish(self, request: Request) -> bool:
        """Read and discard the rest of the body; False when the connection must close instead."""
        if self.done or not request.scope.get("http_version", "1.1").startswith("1"):
            return True  # (an HTTP/2 stream ends alone; the connection goes on)
        declared = request.headers.get("content-length")
        if declared is None:
            if "transfer-encoding" in request.headers:
                return False  # chunked: of unknown length
            declared = "0"  # no body (a GET): only its end is left to read
        if not declared.isdigit() or int(declared) > DRAIN_LIMIT:
            return False
        with trio.move_on_after(DRAIN_SECONDS):
            for _ in range(DRAIN_MESSAGES):
                await self.receive()
                if self.done:
                    return True
        return False


def closing_connection(send: Send) -> Send:
    """`send`, with `Connection: close` added to the response head: h11 ends the connection after it."""

    async def closing_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return closing_send


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    content_type: tuple[bytes, bytes] = JSON_CONTENT_TYPE,
    *,
    head: bool = False,
) -> None:
    """The whole response; `head` sends its headers (Content-Length included) without the body."""
    raw_headers = [content_type, (b"content-length", str(len(body)).encode())]
    raw_headers.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers)
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def send_refusal(
    request: Request, receive: Receive, send: Send, error: ServiceError, headers: list[tuple[str, str]]
) -> ClientGone | None:
    """`error` in the spec's error body, after `headers` and the error's own.

    For a refusal made before the request body was read: the body is drained
    first when BodyTracker allows, else the response says Connection: close.
    When the client left meanwhile, or the parser answered its broken body, nothing
    is sent, and the ClientGone saying so is returned.
    """
    headers = [*headers, *error.own_headers().items()]
    body = BodyTracker(receive)
    if not await body.finish(request):  # keep the connection usable
        headers.append(("Connection", "close"))
    if (left := body.gone(request)) is not None:
        return left
    await send_response(send, error.status, render_error(error), headers)
    return None
