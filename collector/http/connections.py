"""hypercorn's connection handling, with two of its failures contained.

ConnectionGuard: one connection's failure in the HTTP layer ends that
connection, never the server.

trio.serve_listeners runs every connection in one handler nursery, so an
exception that escapes hypercorn's connection handler cancels every other
connection and stops the process. hypercorn 0.18 has such exceptions: on
HTTP/2 (cleartext, which it accepts unasked), a DATA frame for a stream it has
already answered and closed raises KeyError (protocol/h2.py, DataReceived), and
any client can send one. Errors inside the ASGI app never get here (hypercorn
answers them with a 500); what gets here is the protocol layer's own.

A client can raise these at will, so the log says so at most once a minute
(with the traceback, and how many were not logged); the metric counts them all.

Connection: hypercorn's TCPServer (0.18, trio), with reading that ends the
connection when it ends and a read timeout only inside a request. hypercorn
applies `read_timeout` to every read, idle keep-alive included, and after a
read times out it stops reading but holds the connection open until its idle
task's `keep_alive_timeout`: with the defaults (30 s and 75 s) a request sent
on a connection idle for 31 to 75 s was never read, and the client got a
reset 75 s after its last response. A client that closed was likewise held in
CLOSE-WAIT until then. Here an idle connection waits for its next request up
to `keep_alive_timeout` (the idle task closes it), `read_timeout` bounds each
read while a request is in progress, and once reading ends (the client closed,
a read timed out) nothing waits for the idle task: the connection closes as
soon as its in-flight request, if any, is done.

Connection also writes a whole response in one send. hypercorn's h11
protocol hands over a response as three writes: the head, the body and, for a
Content-Length body, an empty end-of-message. Each is a `send_all`, so a
syscall and a trip through trio's scheduler, and each can leave as its own
TCP segment. Here a final response's head waits for the write that follows
it (the body, or the empty end of a body-less answer) and leaves with it;
empty writes are dropped. An interim response (1xx: 100-continue, 101) goes
at once, since the client waits for it. The head waits only for hypercorn's
next event, which comes at once: hypercorn starts a response only when the
app sends its first body message, and this app's responses are never
streamed (bench: a no-op route +20% requests/s; batch25 +10-20%).

And it keeps one idle watch per connection instead of hypercorn's idle task
per request. hypercorn cancelled its idle task when a request began and
started a new one (a nursery.start, behind a lock) when it ended: about five
task wake-ups and two scheduler passes per request for a timer. Here one
task waits for the whole connection under a cancel scope whose deadline is
moved: keep_alive_timeout from the end of the last request, never while one
is in progress. It does what hypercorn's idle task did: it closes a
connection idle for keep_alive_timeout, and one idle when the server
terminates (a busy one once its request is done).

Writes are shielded from cancellation, as hypercorn's are (a response is not
cut off half-way because its task was cancelled), but a graceful shutdown
abandons those still blocked when its deadline passes (OpenSends): hypercorn's
shield had no bound, so a client that stopped reading (a full receive
buffer) held SIGTERM off for as long as it stayed connected.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import resource
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import h2.errors
import h2.exceptions
import h11
import trio
from h2.settings import SettingCodes
from h2.stream import StreamState
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hyperframe.frame import GoAwayFrame, SettingsFrame

import collector.http.h2_protocol  # noqa: F401  (hypercorn makes ours from then on)
from collector.errors import ServiceError, render_error
from collector.http.asgi import CUT_BY_TIMEOUT, request_id_for
from collector.http.headers import cors_headers
from collector.http.parse_errors import answer_parse_errors
from collector.http.unrouted import UNRECORDED, UnroutedAnswers, stand_in_request
from storage.throttled_log import Throttle

log = logging.getLogger("collector.http")

CLOSE_AFTER_SEND_S = 5.0  # how long closing waits for a response still being written
REFUSE_WRITE_S = 1.0  # how long a connection over a cap may take to be told so
REFUSE_HEAD_WAIT_S = 0.5  # and to send its request head first (a client sends it at once)
# Refused connections waiting for their heads at once, at most: each holds a descriptor,
# and a flood of refusals that each waited brought back the EMFILE the caps prevent.
REFUSE_HEAD_WAITERS = 16
REFUSE_HEAD_BYTES = 16 * 1024
_PRINTABLE = re.compile(r"[\x20-\x7e\x80-\xff]*")
FD_RESERVE = 128  # descriptors kept back from connections: LMDB, listeners, logs, the CLI's files
SMALL_LIMIT_RESERVE = 32  # at least: the process's own at rest, and REFUSE_HEAD_WAITERS
MIN_CONNECTIONS = 64


class ConnectionGuard:
    def __init__(
        self,
        handler: Callable[[trio.SocketStream], Awaitable[Any]],
        count: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = handler
        self._count = count
        self._throttle = Throttle(clock)

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            await self._handler(stream)
        except Exception as exc:  # not BaseException: cancellation still ends the server
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        cause: BaseException = exc
        while isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:
            cause = cause.exceptions[0]  # hypercorn's task groups wrap what they raise
        self._count(type(cause).__name__)
        held = self._throttle.admit()
        if held is None:
            return
        # Where it failed, and what, but not the exception's message: hypercorn's and
        # h11's carry the request they failed on, headers and all (helper-109: an API
        # key, a signature and a stream token were written to the log).
        where = "".join(traceback.format_tb(cause.__traceback__))
        log.warning(
            "a connection ended on an error in the HTTP layer; the server goes on"
            " (%d more since the last such message)",
            held,
            extra={"fields": {"exc": f"{where}{type(cause).__module__}.{type(cause).__qualname__}"
                                     " (its message is not logged: it may hold the request)"}},
        )


class ConnectionLimits:
    """Caps the connections one process holds: in all, and from one client address.

    Without a cap, one client that opened connections and sent nothing took
    every file descriptor: each later client waited unanswered, and trio's
    accept loop logged EMFILE ten times a second. A connection over a cap is
    answered at once with 503 `service_unavailable` (Connection: close) and
    closed. A trusted proxy (trusted_proxies) carries many clients, so its
    address has no cap of its own.
    """

    def __init__(
        self,
        handler: Callable[[trio.SocketStream], Awaitable[Any]],
        *,
        total: int,
        per_client: int,
        trusted: Callable[[str], bool],
        refused: Callable[[str], None],
        unrouted: UnroutedAnswers = UNRECORDED,
    ) -> None:
        self._handler = handler
        self._unrouted = unrouted
        self.total, self.per_client = total, per_client
        self._trusted = trusted
        self._refused = refused
        self.open = 0
        self._by_client: dict[str, int] = {}
        self._waiting_heads = 0

    async def __call__(self, stream: trio.SocketStream) -> None:
        peer = _peer_host(stream)
        client = peer if peer is not None and not self._trusted(peer) else None  # None: not capped alone
        if self.open >= self.total:
            await self._refuse(stream, "total", "the server holds as many connections as it may")
            return
        if client is not None and self._by_client.get(client, 0) >= self.per_client:
            await self._refuse(stream, "per_client", "this address holds as many connections as one client may")
            return
        self.open += 1
        if client is not None:
            self._by_client[client] = self._by_client.get(client, 0) + 1
        try:
            await self._handler(stream)
        finally:
            self.open -= 1
            if client is not None:
                left = self._by_client[client] - 1
                if left:
                    self._by_client[client] = left
                else:
                    del self._by_client[client]

    async def _refuse(self, stream: trio.SocketStream, which: str, why: str) -> None:
        started = time.perf_counter()
        self._refused(which)
        # Bounded: a refused client gets a second, not a slot. Its request head, when it
        # comes at once, gives the X-Request-ID to echo and the Origin a browser script
        # needs to read the answer (else the SDK sees a network error, not a Retry-After).
        sent = b""
        if self._waiting_heads < REFUSE_HEAD_WAITERS:  # (else: answered at once, with a minted id)
            self._waiting_heads += 1
            try:
                with trio.move_on_after(REFUSE_HEAD_WAIT_S), contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError
                ):
                    while b"\r\n\r\n" not in sent and len(sent) < REFUSE_HEAD_BYTES and (data := await stream.receive_some()):
                        sent += data
            finally:
                self._waiting_heads -= 1
        if sent.startswith(HTTP2_PREFACE_START):
            await self._refuse_http2(stream, which, why, started)
            return
        fields = _head_fields(sent)
        body = render_error(ServiceError("service_unavailable", f"{why}: retry shortly"))
        headers = [
            ("content-type", "application/json"), ("content-length", str(len(body))), ("retry-after", "5"),
            ("x-request-id", request_id_for(fields.get("x-request-id", ""))),
            *cors_headers(fields.get("origin")), ("connection", "close"),
        ]  # fmt: skip
        head = "HTTP/1.1 503 Service Unavailable\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        with trio.move_on_after(REFUSE_WRITE_S), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(head.encode("latin-1") + body)
        # counted and logged once per request, as every other answer
        method, _, rest = sent.partition(b"\r\n")[0].decode("latin-1").partition(" ")
        request = stand_in_request(method, rest.partition(" ")[0], dict(headers)["x-request-id"])
        self._unrouted.record(request, "connection_cap", 503, "service_unavailable", started)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.aclose_forcefully(stream)

    async def _refuse_http2(self, stream: trio.SocketStream, which: str, why: str, started: float) -> None:
        """A prior-knowledge HTTP/2 client gets HTTP/2's refusal: GOAWAY, no stream taken
        (helper-114: an HTTP/1.1 503 was a broken connection to it, with no reason). Over
        the per-client cap it is ENHANCE_YOUR_CALM (it holds too many); over the total,
        NO_ERROR (nothing of its doing: retry)."""
        code = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM if which == "per_client" else h2.errors.ErrorCodes.NO_ERROR
        goaway = GoAwayFrame(0, last_stream_id=0, error_code=code, additional_data=f"{why}: retry shortly".encode())
        with trio.move_on_after(REFUSE_WRITE_S), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(SettingsFrame(0).serialize() + goaway.serialize())
        self._unrouted.record(stand_in_request("PRI", "*", request_id_for("")), "connection_cap", 503,
                              "service_unavailable", started)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.aclose_forcefully(stream)


HTTP2_PREFACE_START = b"PRI * HTTP/2.0\r\n\r\n"


def _head_fields(sent: bytes) -> dict[str, str]:
    """The header fields of an HTTP/1.1 request head (what of it arrived), lower-cased names."""
    fields: dict[str, str] = {}
    for line in sent.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name and not name[-1:].isspace():
            text = value.strip().decode("latin-1")
            if _PRINTABLE.fullmatch(text):  # (echoed in a header: nothing that could break it)
                fields.setdefault(name.decode("latin-1").lower(), text)
    return fields


def _peer_host(stream: trio.SocketStream) -> str | None:
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return peer[0] if isinstance(peer, tuple) else None


def default_connection_limits() -> tuple[int, int]:
    """(total, per client) for this process: its file descriptor limit less a reserve
    for LMDB, the listeners and logs, and a quarter of that for one client."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    available = soft if soft != resource.RLIM_INFINITY else 1_048_576
    # Under a small limit, less is kept back, but never less than what the process holds
    # at rest (about 15) and the refused connections waiting for their heads (16): a floor
    # of 64 connections was the whole of a 64 limit (helper-114), and half of it left
    # EMFILE at 20 and 64 (helper-121).
    reserve = min(FD_RESERVE, SMALL_LIMIT_RESERVE + available // 4)
    total = max(available - reserve, 1)
    return total, min(total, max(MIN_CONNECTIONS, total // 4))


class OpenSends:
    """The shielded writes in progress on a server's connections, so that shutdown can abandon them."""

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self._abandoned = False

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        with trio.CancelScope(shield=True) as scope:
            if self._abandoned:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)

    def abandon(self) -> None:
        """Cancel every write in progress, and every later one at once."""
        self._abandoned = True
        for scope in self._scopes:
            scope.cancel()


class IdleWatch:
    """hypercorn's per-connection idle task (TrioSingleTask's interface) as one task with a movable deadline."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._scope: trio.CancelScope | None = None  # the watch task's, to end it
        self._timer: trio.CancelScope | None = None  # the current wait's
        self._idle_since = 0.0
        self._busy_ended: trio.Event | None = None  # set up only while termination waits for a request

    async def restart(self, task_group: Any, action: Callable[[], Awaitable[None]]) -> None:
        """hypercorn calls this once, when the connection starts; `action` is its idle task, unused."""
        self._idle_since = trio.current_time()
        if self._scope is None:
            self._scope = await task_group._nursery.start(self._watch)

    async def stop(self) -> None:
        self.end()

    def set_idle(self, idle: bool) -> None:
        """Called as requests begin (False) and end (True); nothing is scheduled."""
        if idle:
            self._idle_since = trio.current_time()
            if self._busy_ended is not None:
                self._busy_ended.set()
        if self._timer is not None:
            self._timer.deadline = self._deadline(idle)

    def end(self) -> None:
        """Reading has ended: nothing more to watch for."""
        if self._scope is not None:
            self._scope.cancel()

    def _deadline(self, idle: bool) -> float:
        return self._idle_since + self._connection.config.keep_alive_timeout if idle else math.inf

    async def _watch(self, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        connection = self._connection
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                with trio.CancelScope(deadline=self._deadline(connection._idle)) as timer:
                    self._timer = timer
                    await connection.context.terminated.wait()
                self._timer = None
                if not timer.cancelled_caught:  # the server terminates: close once idle
                    while not connection._idle:
                        self._busy_ended = trio.Event()
                        await self._busy_ended.wait()
                    break
                if connection._idle and trio.current_time() >= self._deadline(True):
                    break  # idle for keep_alive_timeout (a request may have begun since it fired)
            with trio.CancelScope(shield=True):
                await connection._initiate_server_close()


class Connection(TCPServer):
    _idle = True  # no request in progress (hypercorn starts the idle task before reading)
    _request_began = 0.0  # when the request in progress began (its first byte)
    _last_data = 0.0  # when data last arrived (HTTP/2's stall check)
    _http2_held_since: dict[int, float]  # HTTP/2 stream id -> when the stall check first found it held up
    _http2_next_check = -math.inf
    _head_began: float | None = None  # when the first byte of a request head not yet whole came
    _header_block_began: float | None = None  # HTTP/2: when h2 began holding an unfinished header block
    _cut_peer: tuple[str, int] | None = None  # in CUT_BY_TIMEOUT while this connection lasts
    _reading_done = False
    _read_scope: trio.CancelScope | None = None
    _held_head = b""  # a final response's head, waiting for the write after it
    _http1 = True  # until an HTTP/2 preface switches the protocol

    def __init__(
        self,
        *args: Any,
        sends: OpenSends | None = None,
        request_timeout: float = math.inf,
        unrouted: UnroutedAnswers = UNRECORDED,
        live: set[Connection] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._live = live if live is not None else set()  # the server's open connections (for its drain)
        self.idle_task = self._idle_watch = IdleWatch(self)  # type: ignore[assignment]
        self._sends = sends if sends is not None else OpenSends()
        self._request_timeout = request_timeout
        self._unrouted = unrouted
        self._http2_held_since = {}

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            data = event.data
            if self._held_head:
                data, self._held_head = self._held_head + data, b""
            elif _is_final_response_head(data):
                self._held_head = data
                return
            if not data:
                return  # h11's end of a Content-Length body: nothing to write
            await self._write(data)
            return
        if self._held_head:  # any other event: what was held goes first
            held, self._held_head = self._held_head, b""
            await self._write(held)
        if isinstance(event, Updated):
            if self._idle and not event.idle:
                self._request_began = self._head_began if self._head_began is not None else trio.current_time()
            # Idle again with part of a pipelined request already read: that request's
            # head began now (it was held for keep_alive_timeout, helper-86).
            self._head_began = trio.current_time() if event.idle and self._head_buffered() else None
            self._idle = event.idle
            if self._read_scope is not None:  # a read already waiting takes the new bound
                self._read_scope.deadline = self._read_deadline()
            if not self._reading_done:  # (once it is, nothing more can arrive: no idle wait)
                self._idle_watch.set_idle(event.idle)
            return
        await super().protocol_send(event)

    async def _write(self, data: bytes) -> None:
        # hypercorn's RawData write, with a shield the shutdown can lift
        async with self.send_lock:
            try:
                with self._sends.shielded(), trio.move_on_after(self._request_timeout) as sending:
                    await self.stream.send_all(data)
                if sending.cancelled_caught:
                    # A client that reads nothing (pipelined requests, a full receive
                    # window) held its connection and the unsent answers for as long as
                    # it stayed connected: after request_timeout it is cut off.
                    await trio.aclose_forcefully(self.stream)
                    await self.protocol.handle(Closed())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())

    async def run(self) -> None:
        self._live.add(self)
        try:
            await super().run()
        finally:  # (every task of the connection has ended: none will ask any more)
            self._live.discard(self)
            if self._cut_peer is not None:
                CUT_BY_TIMEOUT.discard(self._cut_peer)

    async def refuse_new_streams(self) -> None:
        """A drain began: an HTTP/2 client may open no more streams here; those open finish.

        HTTP/1.1 learns it from `Connection: close` on its next answer; HTTP/2 has
        no such header (h2 strips it), and a client went on opening streams for
        the whole graceful_timeout, then lost what it had in flight (helper-99).
        MAX_CONCURRENT_STREAMS 0 stops it (a GOAWAY would close h2's state at once);
        the connection is closed once idle, as every connection is.
        """
        protocol = self.protocol.protocol
        if not isinstance(protocol, H2Protocol) or protocol.closed:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            protocol.connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 0})
        await protocol._flush()

    async def _close(self) -> None:
        # hypercorn sends EOF without its send lock: when h11 gives up on the
        # connection (a request pipelined behind a refusal whose body was not
        # read) while that refusal is still being written, send_eof raised
        # BusyResourceError and the refusal lost its body. Wait for the write
        # first (bounded: a client that reads nothing holds it forever).
        lock = self.send_lock
        if lock.statistics().owner is not trio.lowlevel.current_task():
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_AFTER_SEND_S):
                async with lock:
                    await super()._close()
                    return
        await super()._close()

    def _taken_over_by_http2(self, protocol: H2Protocol) -> None:
        # The HTTP/2 preface reads as an HTTP/1.1 request ("PRI * HTTP/2.0") until
        # hypercorn switches protocols: the connection was left busy, with no stream
        # open, and was cut at read_timeout before its first request (helper-86). It
        # is idle until a stream opens.
        self._http1 = False
        self._head_began = None
        if not protocol.streams:
            self._idle = True
            self._idle_watch.set_idle(True)

    def _head_buffered(self) -> bool:
        """Whether HTTP/1.1's parser holds bytes of a request it has not begun."""
        protocol = self.protocol.protocol
        return isinstance(protocol, H11Protocol) and bool(protocol.connection.trailing_data[0])

    def _mark_cut(self) -> None:
        """Remember, while the connection lasts, that its request was cut for being slow."""
        with contextlib.suppress(OSError):
            peer = self.stream.socket.getpeername()
            self._cut_peer = (peer[0], peer[1])
            CUT_BY_TIMEOUT.add(self._cut_peer)

    async def _cut(self, http2: bool) -> None:
        """End a connection whose client is too slow (the read loop then stops)."""
        self._mark_cut()  # (before the close: it reads the peer's address)
        if http2:
            # (an answer held back by the window would keep the socket open
            # until request_timeout cancels its handler: the client is cut now)
            await trio.aclose_forcefully(self.stream)

    def _http2_checked_stalled(self) -> bool:
        """The stall check, run now, the next one a second from now."""
        self._http2_next_check = trio.current_time() + HTTP2_STALL_CHECK_S
        return self._http2_stalled()

    def _http2_stalled(self) -> bool:
        """Whether an HTTP/2 client holds up a stream the server serves: silent for read_timeout
        while one waits on it, or holding one up for request_timeout in all.

        b507702 stopped bounding HTTP/2 reads at all (a slow answer is not the
        client's doing), and a client that sent part of a body, or a window of
        zero that holds back its answer, then held the connection and its
        handler for ever (helper-93).
        """
        protocol: H2Protocol = self.protocol.protocol  # type: ignore[assignment]
        now = trio.current_time()
        held = _held_up_http2_streams(protocol)
        # Since when each stream has been held up by its client: one that keeps the
        # connection busy (PINGs, a window widened a byte at a time) is still bounded
        # by request_timeout. Counted from the first check that found it so, not from
        # when it opened: the server's own slow answer is not the client's (helper-102).
        since = self._http2_held_since
        for stream_id in [s for s in since if s not in held]:
            del since[stream_id]
        for stream_id in held:
            since.setdefault(stream_id, now)
        if not held:
            return False
        read_timeout = self.config.read_timeout
        if read_timeout and now - self._last_data >= read_timeout:
            return True
        return any(now - since[stream_id] >= self._request_timeout for stream_id in held)

    def _note_header_block(self, now: float) -> None:
        """HTTP/2 streams open once their header block ends (END_HEADERS): until then a
        block begun and left unfinished held its buffered frames (up to 1 MB) on an
        "idle" connection for keep_alive_timeout (75 s; helper-118). It is a request
        arriving, bounded as an HTTP/1.1 head is."""
        protocol = self.protocol.protocol
        buffer = getattr(getattr(protocol, "connection", None), "incoming_buffer", None)
        if buffer is not None and buffer._headers_buffer:
            if self._header_block_began is None:
                self._header_block_began = now
        else:
            self._header_block_began = None

    def _read_deadline(self) -> float:
        per_read = trio.current_time() + self.config.read_timeout if self.config.read_timeout else math.inf
        if self._header_block_began is not None:
            return min(per_read, self._header_block_began + self._request_timeout)
        if self._idle:
            if self._head_began is None:
                return math.inf  # the idle task's keep_alive_timeout bounds the wait
            # Part of a request head came: hypercorn calls the connection busy only
            # once the head is whole, and a head sent a line at a time (or never
            # finished) was held for keep_alive_timeout.
            return min(per_read, self._head_began + self._request_timeout)
        # Each read within read_timeout, and the whole request within request_timeout:
        # a body trickled a byte at a time, each within read_timeout, held its
        # connection (and its buffered body) for as long as the client liked.
        protocol = self.protocol.protocol
        if isinstance(protocol, H2Protocol):
            # Its requests overlap, so no one deadline fits: while streams are open the
            # read wakes once a second and asks whether the client holds one up
            # (_http2_stalled). A stream opened later comes with data, and data is
            # read with the next check's deadline.
            if not protocol.streams:
                return math.inf  # the idle task's keep_alive_timeout bounds the wait
            # (a fixed schedule, not a deadline from the last read: a client sending
            # PINGs would otherwise never be looked at; each check sets the next)
            if self._http2_next_check == -math.inf:
                self._http2_next_check = trio.current_time() + HTTP2_STALL_CHECK_S
            return self._http2_next_check
        if protocol.connection.their_state is not h11.SEND_BODY:
            # The request has all arrived: the server is answering it, and a client
            # waiting for its answer sends nothing. A slow answer (a busy disk) cut the
            # connection at read_timeout, its answer unsent and unlogged (helper-90).
            return math.inf
        return min(per_read, self._request_began + self._request_timeout)

    async def _read_data(self) -> None:
        # (the protocol exists from here; an HTTP/2 one, taken over later, answers its own way)
        if isinstance(self.protocol.protocol, H11Protocol):
            answer_parse_errors(self.protocol.protocol, self._unrouted)
        self._last_data = trio.current_time()
        while True:
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self._read_scope = scope
                try:
                    data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    data = b""
            self._read_scope = None
            http2 = isinstance(self.protocol.protocol, H2Protocol)
            if scope.cancelled_caught:  # read_timeout or request_timeout inside a request
                if http2 and self._header_block_began is None and not self._http2_checked_stalled():
                    continue
                await self._cut(http2)
                break
            now = self._last_data = trio.current_time()
            # (a client that never lets a read wait, a PING a millisecond, is looked
            # at on the same schedule: helper-99)
            if http2 and data and now >= self._http2_next_check and self._http2_checked_stalled():
                await self._cut(http2)
                break
            if data and self._idle and self._head_began is None and not http2:
                self._head_began = trio.current_time()
            await self.protocol.handle(RawData(bytes(data)))
            if self._http1 and isinstance(self.protocol.protocol, H2Protocol):
                self._taken_over_by_http2(self.protocol.protocol)
            if http2 or not self._http1:
                self._note_header_block(now)
            elif self._idle and self._head_began is not None and not self._head_buffered():
                self._head_began = None  # only skipped empty lines came: idle still (helper-120)
            if data == b"":
                break
        self._reading_done = True
        self._idle_watch.end()
        await self.protocol.handle(Closed())
        protocol = self.protocol.protocol
        if isinstance(protocol, H2Protocol):
            # hypercorn ends an HTTP/2 connection's streams but not their send buffers:
            # an answer waiting for the client's window waited for request_timeout
            # below, unlogged until then. Its send ends now, as HTTP/1.1's does.
            for buffer in list(protocol.stream_buffers.values()):
                await buffer.close()
        # The client is gone. What still runs for it (a request being answered)
        # gets request_timeout to finish, then is cancelled: an HTTP/2 answer to a
        # client that closed waited forever for its stream buffer to drain, and the
        # connection (its descriptor, its place under max_connections) with it.
        nursery = self._task_group._nursery
        if nursery is not None:
            scope = nursery.cancel_scope
            scope.deadline = min(scope.deadline, trio.current_time() + self._request_timeout)


HTTP2_STALL_CHECK_S = 1.0  # how often a silent HTTP/2 connection with open streams is looked at

_STILL_ARRIVING = (StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL)  # the client has not ended the stream


def _held_up_http2_streams(protocol: H2Protocol) -> list[int]:
    """Streams whose request is still arriving, or whose answer the client's flow-control window holds back.

    Only the streams hypercorn still serves: one it has answered and let go stays
    half-closed in h2's books when its client sent no body (an early refusal of an
    `Expect: 100-continue` request), and cut a client waiting for another answer
    (helper-99).
    """
    connection = protocol.connection
    held = []
    for stream_id in list(protocol.streams):
        stream = connection.streams.get(stream_id)
        if stream is None:
            continue
        if stream.state_machine.state in _STILL_ARRIVING:
            held.append(stream_id)
            continue
        buffer = protocol.stream_buffers.get(stream_id)
        if buffer is not None and buffer.buffer:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                if connection.local_flow_control_window(stream_id) <= 0:
                    held.append(stream_id)
    return held


def _is_final_response_head(data: bytes) -> bool:
    # h11 writes every response head as "HTTP/1.1 NNN ..."; 1xx heads are interim
    return data.startswith(b"HTTP/1.1 ") and data[9:10] != b"1"
