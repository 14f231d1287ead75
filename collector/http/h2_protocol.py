"""hypercorn's HTTP/2 protocol with the body of an answered stream let past.

RFC 9113 8.1 lets a client go on sending the body of a request the server has
already answered (an early 401, 413 or 429 refusal). hypercorn forgets a stream
once it is answered and then looked the next DATA frame up among its streams:
KeyError, and the whole connection ended with every other stream on it, one of
them stored and never answered (helper-99). Such DATA is acknowledged (the
connection's window must not shrink for it) and, once the answer has gone out
in full, the stream is reset with NO_ERROR, which tells the client to stop
sending it (a reset before would discard the answer).
"""

from __future__ import annotations

import contextlib

import h2.errors
import h2.events
import h2.exceptions
from hypercorn.protocol.h2 import H2Protocol


class CollectorH2Protocol(H2Protocol):
    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # (a stream whose HEADERS are in this same read is opened by super(): its DATA is no late body)
        # (unless hypercorn refuses new streams: it resets them while it closes)
        opening = (
            set() if self.context.terminated.is_set()
            else {event.stream_id for event in events if isinstance(event, h2.events.RequestReceived)}
        )
        passed = []
        for event in events:
            if (
                isinstance(event, h2.events.DataReceived)
                and event.stream_id not in self.streams
                and event.stream_id not in opening
            ):
                self._drop_late_body(event)
            else:
                passed.append(event)
        await super()._handle_events(passed)

    def _drop_late_body(self, event: h2.events.DataReceived) -> None:
        connection = self.connection
        try:
            connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        except h2.exceptions.StreamClosedError:  # (the stream's window is gone: the connection's only)
            if event.flow_controlled_length:
                connection.increment_flow_control_window(event.flow_controlled_length)
        if event.stream_id in self.stream_buffers:
            return  # its answer is still being sent: a reset now would discard it (RFC 9113 8.1)
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.NO_ERROR)
