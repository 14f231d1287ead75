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
import hypercorn.protocol
from hypercorn.protocol.h2 import H2Protocol


class CollectorH2Protocol(H2Protocol):
    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # One event at a time: a stream can be answered and let go while the events of
        # one read are being handled (the route runs once hypercorn's queue to it is
        # full), so whether DATA is late is decided as each one comes (helper-102).
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                self._drop_late_body(event)
                await self._flush()
            else:
                await super()._handle_events([event])

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


# hypercorn's protocol wrapper makes the HTTP/2 protocol by this name, for a prior-knowledge
# preface within the first read too: ours from the first frame (helper-102: a first
# read holding a whole refused body still raised KeyError when the class was swapped after it).
hypercorn.protocol.H2Protocol = CollectorH2Protocol  # type: ignore[misc]
