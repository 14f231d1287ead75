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


def on_loop(read: Callable[..., T], *args: object) -> T:
    """`read(*args)` on the event loop's thread, called from it or from run_pure's thread.

    For LMDB reads: the map is resized on the loop's thread only, while no read
    transaction of the process is open elsewhere (LMDB's rule); a read in a
    worker thread could overlap a resize and fail, or read unmapped memory.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:  # a worker thread of run_pure
        return trio.from_thread.run_sync(read, *args)
    return read(*args)


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
