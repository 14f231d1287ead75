"""Pure work on a large body runs in a worker thread, so the event loop keeps serving.

Validating and scanning a body costs time in proportion to its size, and a
hostile one can make the payment scan's confirming step run around every
digit run: a 20 KB gzip body of them inflates to 10 MB and takes seconds of
Python. On the event loop that stalled every other connection (`/healthz`
took 20 s behind five such requests). In a thread it still costs its CPU,
but the loop takes the GIL back at every switch interval (5 ms) and keeps
answering. Small bodies, the common case, stay on the loop: a thread hop
costs more than their whole validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

OFF_LOOP_BYTES = 256 * 1024
# At most two such bodies at once: more threads would each take a share of
# the GIL from the event loop.
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("off_loop_limiter")

T = TypeVar("T")


async def run_pure(size: int, work: Callable[..., T], *args: object) -> T:
    """`work(*args)`, in a worker thread when the body is `size` >= OFF_LOOP_BYTES bytes."""
    if size < OFF_LOOP_BYTES:
        return work(*args)
    try:
        limiter = _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(2)
        _LIMITER.set(limiter)
    return await trio.to_thread.run_sync(work, *args, limiter=limiter)
