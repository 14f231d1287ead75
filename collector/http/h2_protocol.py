"""hypercorn's HTTP/2 protocol with the body of an answered stream let past, and
GOAWAY that lets the streams already open finish.

RFC 9113 8.1 lets a client go on sending the body of a request the server has
already answered (an early 401, 413 or 429 refusal). hypercorn forgets a stream
once it is answered and then looked the next DATA frame up among its streams:
KeyError, and the whole connection ended with every other stream on it, one of
them stored and never answered (helper-99). Such DATA is acknowledged (the
connection's window must not shrink for it) and, once the answer has gone out
in full, the stream is reset with NO_ERROR, which tells the client to stop
sending it (a reset before would discard the answer).

GOAWAY (RFC 9113 6.8) says the sender opens no more streams: those already open
still get their answers. h2 (the library) instead closes the whole connection
state on one, sent or received, and refuses every answer still due; hypercorn then
ends the connection. So a client's graceful GOAWAY lost the answers in flight, and
the server's own at `keep_alive_max_requests` promised to process the last stream
(and those before it) and answered none of them, its batch stored: the client
hung until it gave up (helper-99). Here a GOAWAY with NO_ERROR leaves the
connection open until its last stream is done, then closes it; a stream opened
after it anyway is refused (REFUSED_STREAM: not processed, safe to retry).

A client that resets its streams as fast as it opens them ("rapid reset",
CVE-2023-44487), or makes the server reset them ("MadeYouReset", CVE-2025-8671),
made the server start and cancel a route for each: one connection kept a core
busy (49,600 streams in 3 s took 3.4 s of CPU). A client address (an IPv6 one's
/64) may have RESETS_BURST streams reset, either side resetting them, while their
routes run, and RESETS_PER_S more each second, over all its connections to this process (a new connection starts
with what the last one left); past that its connection is sent GOAWAY with
ENHANCE_YOUR_CALM and closed. A connection whose last stream was reset is idle
(hypercorn did not say so, and it was never closed).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import hypercorn.protocol
import priority
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hyperframe.frame import (
    DataFrame,
    ExtensionFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from storage.throttled_log import ThrottledLog

RESETS_BURST = 100  # streams a client may reset at once (a page navigated away from resets a few)
RESETS_PER_S = 10.0  # and more each second
# Frames that ask the server for work and open no stream (PING, SETTINGS, PRIORITY,
# WINDOW_UPDATE, empty DATA, unknown types): a flood of them kept a core busy from one
# connection (helper-118: 1.0 s of CPU a second). A connection may send this many at
# once, and this many more a second; past that, GOAWAY ENHANCE_YOUR_CALM.
CONTROL_FRAMES_BURST = 1000
CONTROL_FRAMES_PER_S = 100.0
DEFAULT_WINDOW = 65_535  # a connection's flow-control window before any WINDOW_UPDATE (RFC 9113 6.9.2)
# h2 holds a header block's frames until END_HEADERS: 64 of up to 16 KiB each, 1 MB a
# connection (helper-118). A block over twice hypercorn's 64 KiB header list cannot be one
# it accepts: the connection gets GOAWAY ENHANCE_YOUR_CALM once one is (checked each read,
# and a read is at most 64 KiB). (A count of frames refused small frames: helper-120.)
HEADER_BLOCK_MAX_BYTES = 2 * 65536
h2.frame_buffer.CONTINUATION_BACKLOG = 1024  # (h2's own 64 refused a block in small frames: helper-123)
SMALL_FRAME_BYTES = 1024  # DATA no route reads costs as a frame that opens nothing when smaller than this

_rapid_reset = ThrottledLog(logging.getLogger("collector.http"), logging.WARNING)
_flood = ThrottledLog(logging.getLogger("collector.http"), logging.WARNING)

# Client address -> (resets it may still make, when that was counted); the oldest
# addresses are forgotten past RESET_ADDRESSES (a forgotten one starts afresh).
_resets_left: dict[str, tuple[float, float]] = {}
RESET_ADDRESSES = 4096


def _reset_budget_of(client: tuple[str, int] | None) -> str:
    """Whose allowance a reset spends: the client's address, an IPv6 one's /64 (one
    host is given a whole /64 to pick addresses from: helper-110)."""
    if client is None:
        return "-"
    address = client[0]
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if parsed.version == 6 and parsed.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return address


# Peers that carry many clients (trusted_proxies; set by serve): their resets are their
# clients', and one budget for all of them cut every client's connection (helper-113).
def no_exempt_peer(address: str) -> bool:
    return False


exempt_peers: Callable[[str], bool] = no_exempt_peer


def _exempt(client: tuple[str, int] | None) -> bool:
    return client is not None and exempt_peers(client[0])


def _one_spent(left: float, elapsed: float, burst: int, per_s: float) -> float:
    """A token bucket's `left` after `elapsed` seconds of refill and one spent (below 0: none was left)."""
    return min(float(burst), left + elapsed * per_s) - 1


def _may_reset(address: str) -> bool:
    """Whether a client's stream reset fits its allowance (a token bucket per address)."""
    now = trio.current_time()
    left, counted_at = _resets_left.pop(address, (float(RESETS_BURST), now))
    left = _one_spent(left, now - counted_at, RESETS_BURST, RESETS_PER_S)
    _resets_left[address] = (left, now)  # (re-inserted: the most recent last)
    if len(_resets_left) > RESET_ADDRESSES:
        del _resets_left[next(iter(_resets_left))]
    return left >= 0


class CollectorH2Protocol(H2Protocol):
    # The last stream id processed once either side sent GOAWAY (None: neither did).
    _going_away_after: int | None = None
    _gone = False  # the final GOAWAY went out: the connection is closing

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        connection = self.connection
        dispatch = connection._frame_dispatch_table  # (h2 has no hook for a received GOAWAY)
        self._close_on_goaway = dispatch[GoAwayFrame]
        dispatch[GoAwayFrame] = self._receive_goaway
        # hypercorn's own GOAWAY (at keep_alive_max_requests): must not close h2's side even
        # for the moment it awaits sending it, or a stream answering then loses its answer
        self._send_goaway_and_close = connection.close_connection
        connection.close_connection = self._close_connection_asked  # type: ignore[method-assign]
        self._control_left, self._control_counted_at = float(CONTROL_FRAMES_BURST), trio.current_time()
        for frame_type in (PingFrame, SettingsFrame, PriorityFrame, WindowUpdateFrame, ExtensionFrame, DataFrame,
                           RstStreamFrame, GoAwayFrame, HeadersFrame):
            dispatch[frame_type] = self._counting_control_frames(dispatch[frame_type])
        # Resets h2 sends itself, for a client's frame that broke a stream, come with no
        # event when the stream had ended its request (DATA after END_STREAM): seen here.
        self._prepare_for_sending = connection._prepare_for_sending
        connection._prepare_for_sending = self._sending  # type: ignore[method-assign]
        self._over_reset_allowance = False
        self._reset_ids: set[int] = set()  # streams reset by the server: charged once, or our own

    def _receive_goaway(self, frame: Frame) -> tuple[list[Frame], list[h2.events.Event]]:
        assert isinstance(frame, GoAwayFrame)
        # (streams whose HEADERS came in this read are h2's, not yet hypercorn's)
        if frame.error_code != h2.errors.ErrorCodes.NO_ERROR or not (
            self.streams or self.connection.open_inbound_streams
        ):
            return self._close_on_goaway(frame)  # h2's own: the connection ends now
        # The client opens no more streams; this connection lives until those open are
        # answered (no ConnectionTerminated event: hypercorn would end it at once).
        self._take_streams_up_to(self.connection.highest_inbound_stream_id)
        return [], []

    def _take_streams_up_to(self, last_stream_id: int) -> None:
        if self._going_away_after is None:
            self._going_away_after = last_stream_id

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # One event at a time: a stream can be answered and let go while the events of
        # one read are being handled (the route runs once hypercorn's queue to it is
        # full), so whether DATA is late is decided as each one comes (helper-102).
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                # (a body no route reads, in small frames, costs as a frame that opens no stream:
                # 1-byte DATA on an answered stream took 21 s of CPU in 20 s, helper-120)
                if event.flow_controlled_length < SMALL_FRAME_BYTES and not self._may_send_control_frame():
                    await self._end_for_flood()
                    return
                self._drop_late_body(event)
                await self._flush()
            elif isinstance(event, h2.events.RequestReceived) and event.stream_id > (
                self._going_away_after if self._going_away_after is not None else event.stream_id
            ):
                self._refuse_stream_after_goaway(event.stream_id)
                await self._flush()
            elif isinstance(event, h2.events.StreamReset):
                # (the server's own resets were counted as h2 sent them: _sending)
                charged = event.remote_reset and event.stream_id in self.streams
                await super()._handle_events([event])
                if charged and not self._may_reset():
                    await self._calm_down()
                    return
                await self._after_reset(event.stream_id)
            else:
                await super()._handle_events([event])
        # What h2 answered by itself in a read with no events (a RST, the WINDOW_UPDATE for
        # a late body) goes out now: it waited for the next event, and an upload on another
        # stream of the connection stalled for want of window (helper-120).
        await self._flush()

    async def _calm_down(self) -> None:
        _rapid_reset("HTTP/2 client %s reset streams faster than %d a second: its connection was closed",
                     self._client_address, RESETS_PER_S, cause="rapid reset")
        await self._end_with_goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    async def _end_with_goaway(self, error_code: int, last_stream_id: int | None = None) -> None:
        """A final GOAWAY, then the connection closes; what still arrives is not read
        (h2 would answer it with a PROTOCOL_ERROR: helper-113)."""
        self._gone = True
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._send_goaway_and_close(error_code, None, last_stream_id)
        await self._flush()
        await self.send(Closed())

    def _close_connection_asked(
        self, error_code: int = 0, additional_data: bytes | None = None, last_stream_id: int | None = None
    ) -> None:
        """hypercorn asked h2 to close: a GOAWAY that closes now, or one that lets the
        open streams finish, or nothing when one said so already."""
        connection = self.connection
        in_flight = self.streams or connection.open_inbound_streams
        if error_code != h2.errors.ErrorCodes.NO_ERROR or not in_flight:
            self._gone = True  # final: nothing read after it draws h2's PROTOCOL_ERROR (helper-116)
            self._send_goaway_and_close(error_code, additional_data, last_stream_id)
        elif self._going_away_after is None:
            state = connection.state_machine.state
            self._send_goaway_and_close(error_code, additional_data, last_stream_id)
            connection.state_machine.state = state
            self._take_streams_up_to(connection.highest_inbound_stream_id if last_stream_id is None else last_stream_id)
        # (else: one GOAWAY said it already)

    def _refuse_stream_after_goaway(self, stream_id: int) -> None:
        self._reset_ourselves(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)

    async def stream_send(self, event: StreamEvent) -> None:
        await super().stream_send(event)
        if isinstance(event, StreamClosed):
            await self._close_once_gone_away()

    async def _send_data(self, stream_id: int) -> None:
        await super()._send_data(stream_id)
        if stream_id not in self.stream_buffers:  # its answer ended (END_STREAM sent) or was dropped
            await self._close_once_gone_away()

    async def _close_once_gone_away(self) -> None:
        """After GOAWAY, once the last stream taken is done, its answer sent to its end
        (helper-110: closing when the route finished cut the last DATA and END_STREAM
        still in hypercorn's send buffer), the connection ends."""
        if self._going_away_after is None or self.streams or self.stream_buffers or self._gone:
            return
        await self._end_with_goaway(h2.errors.ErrorCodes.NO_ERROR, self._going_away_after)

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData) and self._gone:
            return  # (helper-113: a WINDOW_UPDATE read before the close drew GOAWAY PROTOCOL_ERROR)
        await super().handle(event)
        if self._gone:
            return
        if self._over_reset_allowance:
            await self._calm_down()
        elif (block := self.connection.incoming_buffer._headers_buffer) and sum(
            len(frame.data) for frame in block
        ) > HEADER_BLOCK_MAX_BYTES:
            _flood("HTTP/2 client %s sent a header block over %d bytes: its connection was closed",
                   self._client_address, HEADER_BLOCK_MAX_BYTES, cause="header block")
            await self._end_with_goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _may_reset(self) -> bool:
        return _exempt(self.client) or _may_reset(_reset_budget_of(self.client))

    @property
    def _client_address(self) -> str:
        """The client's address, for a log line."""
        return self.client[0] if self.client else "-"

    def _sending(self, frames: list[Frame]) -> None:
        """h2's way out for every frame: the first reset of a stream, which a frame of the
        client's made h2 send, spends the client's allowance as its own reset would
        ("MadeYouReset", CVE-2025-8671: a WINDOW_UPDATE overflowing a stream's window,
        DATA after END_STREAM; 20,000 such streams in 8 s took 6.6 s of CPU, helpers 116
        and 118; in one read the stream's route is not started yet, and starts anyway).
        Later resets of the same stream (h2 answers each frame still arriving on it) and
        the server's own resets (a late body, a stream after GOAWAY) spend nothing."""
        for frame in frames:
            if not isinstance(frame, RstStreamFrame):
                continue
            if frame.stream_id in self._reset_ids:
                continue  # (h2 answering another frame on it: that frame was counted as it came)
            if len(self._reset_ids) > 10_000:
                self._reset_ids.clear()
            self._reset_ids.add(frame.stream_id)
            if not self._over_reset_allowance and not self._may_reset():
                self._over_reset_allowance = True  # (the rest of this read is not charged)
        self._prepare_for_sending(frames)

    def _reset_ourselves(self, stream_id: int, error_code: int) -> None:
        self._reset_ids.add(stream_id)  # (not the client's doing)
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.connection.reset_stream(stream_id, error_code)

    def _counting_control_frames(
        self, receive: Callable[[Frame], tuple[list[Frame], list[h2.events.Event]]]
    ) -> Callable[[Frame], tuple[list[Frame], list[h2.events.Event]]]:
        def counted(frame: Frame) -> tuple[list[Frame], list[h2.events.Event]]:
            if self._opens_nothing(frame) and not self._may_send_control_frame():
                self._log_flood()
                # (h2 answers this error with GOAWAY ENHANCE_YOUR_CALM; hypercorn then closes)
                raise h2.exceptions.DenialOfServiceError("too many frames that open no stream")
            return receive(frame)

        return counted

    def _opens_nothing(self, frame: Frame) -> bool:
        """Whether a frame asks for work the client did not earn (helpers 118, 120, 123)."""
        connection = self.connection
        if isinstance(frame, HeadersFrame):  # (a new stream's, or trailers on an open one, are fine)
            return frame.stream_id <= connection.highest_inbound_stream_id and frame.stream_id not in connection.streams
        if isinstance(frame, DataFrame):
            if not frame.data:
                return "END_STREAM" not in frame.flags
            # small DATA on a stream h2 has closed (reset): each drew a RST; large ones are
            # bounded by flow control, and a body sent in full-size frames must not be cut
            return len(frame.data) < SMALL_FRAME_BYTES and frame.stream_id not in connection.streams
        if isinstance(frame, WindowUpdateFrame):
            # one giving back window the server's DATA used is the client's duty, not a request
            # (helper-123: h2load with 64 KB windows was cut downloading /metrics)
            if frame.stream_id == 0:
                return connection.outbound_flow_control_window >= DEFAULT_WINDOW
            stream = connection.streams.get(frame.stream_id)
            return stream is None or stream.outbound_flow_control_window >= connection.remote_settings.initial_window_size
        return True

    def _may_send_control_frame(self) -> bool:
        """Spend one of the connection's allowance of frames that open no stream."""
        now = trio.current_time()
        elapsed, self._control_counted_at = now - self._control_counted_at, now
        self._control_left = _one_spent(self._control_left, elapsed, CONTROL_FRAMES_BURST, CONTROL_FRAMES_PER_S)
        return self._control_left >= 0 or _exempt(self.client)

    def _log_flood(self) -> None:
        _flood("HTTP/2 client %s sent frames that open no stream faster than %d a second: its connection"
               " was closed", self._client_address, CONTROL_FRAMES_PER_S, cause="control frame flood")

    async def _end_for_flood(self) -> None:
        self._log_flood()
        await self._end_with_goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    async def _priority_updated(self, event: h2.events.PriorityUpdated) -> None:
        """PRIORITY for a stream the server is not sending on is let be (RFC 9113 5.3.4 lets
        a client name closed and idle ones): hypercorn kept each in its priority tree, which
        ends the connection at its 1,000th (helper-118)."""
        if event.stream_id not in self.stream_buffers:
            return
        # nor is a parent that is not being answered put in (helper-120: each new stream
        # depending on the one answered before it put that one back, for ever)
        depends_on = event.depends_on if event.depends_on in self.stream_buffers else None
        with contextlib.suppress(priority.PriorityError):
            self.priority.reprioritize(
                stream_id=event.stream_id, depends_on=depends_on, weight=event.weight or 16, exclusive=bool(event.exclusive)
            )
        await self.has_data.set()

    async def _after_reset(self, stream_id: int) -> None:
        """A stream the client reset. hypercorn keeps its send buffer, and a route waiting
        for its answer to drain, for ever: the connection was never idle nor closed after
        GOAWAY, and held a drain for its whole graceful_timeout (helpers 110, 113). The
        buffer is closed, which lets the route go, and the send task drops it."""
        buffer = self.stream_buffers.get(stream_id)
        if buffer is not None:
            await buffer.close()
            with contextlib.suppress(priority.MissingStreamError):
                self.priority.unblock(stream_id)
            await self.has_data.set()  # (ending a reset stream fails: the send task lets it go)
        if not self.streams:
            await self.send(Updated(idle=True))

    def _drop_late_body(self, event: h2.events.DataReceived) -> None:
        connection = self.connection
        try:
            connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        except h2.exceptions.StreamClosedError:  # (the stream's window is gone: the connection's only)
            if event.flow_controlled_length:
                connection.increment_flow_control_window(event.flow_controlled_length)
        if event.stream_id in self.stream_buffers:
            return  # its answer is still being sent: a reset now would discard it (RFC 9113 8.1)
        self._reset_ourselves(event.stream_id, h2.errors.ErrorCodes.NO_ERROR)


# hypercorn's protocol wrapper makes the HTTP/2 protocol by this name, for a prior-knowledge
# preface within the first read too: ours from the first frame (helper-102: a first
# read holding a whole refused body still raised KeyError when the class was swapped after it).
hypercorn.protocol.H2Protocol = CollectorH2Protocol  # type: ignore[misc]
