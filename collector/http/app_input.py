"""hypercorn's per-request input queue, which no longer waits on a request that has ended.

hypercorn hands each request's body to its route through a queue of 10 items,
and the connection's one reader waits while it is full. A route that refuses a
request before reading its body (a bad key: 401) never empties it; on HTTP/2,
where the body keeps coming after the answer, the 11th small DATA frame left
the reader waiting for ever: every other stream of the connection, its PINGs
and its WINDOW_UPDATEs with it, past every timeout and after the client left
(helper-123). Worse, the route's own answer, as it closed the stream, put a
disconnect into that full queue and waited on itself.

Here a queue is closed when its route ends, so a put waiting on it, or any
later one, is dropped; and the disconnect is put only if there is room (a
route with unread input reads that first, and is ended by request_timeout if
it then waits).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio.tcp_server
import trio
from hypercorn.trio.task_group import TaskGroup, _handle

Put = Callable[[Any], Awaitable[None]]


class EndedRoutesDropTheirInput(TaskGroup):
    async def spawn_app(self, app: Any, config: Any, scope: Any, send: Any) -> Put:
        sender, receiver = trio.open_memory_channel[Any](config.max_app_queue_size)

        async def run_route() -> None:
            try:
                await _handle(app, config, scope, receiver.receive, send, trio.to_thread.run_sync, trio.from_thread.run)
            finally:
                receiver.close()  # (a put waiting on the queue is let go: BrokenResourceError)

        assert self._nursery is not None
        self._nursery.start_soon(run_route)

        async def put(message: Any) -> None:
            # (try/except, not contextlib.suppress: this runs for every request's body)
            try:
                if message["type"] == "http.disconnect":  # (also put by the route's own last send)
                    sender.send_nowait(message)
                else:
                    await sender.send(message)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        return put


# hypercorn's connection makes its task group by this name.
hypercorn.trio.tcp_server.TaskGroup = EndedRoutesDropTheirInput  # type: ignore[misc]
