"""Where log lines go: stderr, written by a thread of its own.

A write to stderr blocks once its reader stops reading (a stalled journald, a
log shipper that hung, a pipe nobody drains): written from the event loop, it
froze every request and the drain that SIGTERM starts. Here the loop only
appends to a bounded backlog; a daemon thread writes it out. While the reader
is stuck the backlog fills, and lines past `MAX_BACKLOG_BYTES` are dropped and
counted; once writing goes through again, one line says how many were lost.
"""

from __future__ import annotations

import atexit
import os
import select
import threading
import time
from collections import deque

MAX_BACKLOG_BYTES = 4 * 1024 * 1024
# At exit, after a drain of up to graceful_timeout (8 s): the contract's 10 s, and a
# supervisor's SIGKILL at graceful_timeout + 1 s under `--workers`, leave this much.
FLUSH_AT_EXIT_S = 0.5
FAILED_WRITE_PAUSE_S = 1.0  # after a write failed: what comes meanwhile waits in the backlog
# A write of at most PIPE_BUF bytes to a pipe is atomic: `--workers` children share
# one stderr, and longer writes tore lines into each other.
PIPE_BUF = select.PIPE_BUF
_DROPPED_LINE = (
    '{"ts":"%s","level":"warning","logger":"collector.logs",'
    '"msg":"%d log lines dropped: stderr was not being read, or could not be written"%s}\n'
)


class StderrSink:
    """A bounded, non-blocking writer of whole lines to a file descriptor."""

    def __init__(self, fd: int = 2, max_backlog_bytes: int = MAX_BACKLOG_BYTES) -> None:
        self._fd = fd
        self._max = max_backlog_bytes
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._writing = False  # the thread holds lines it has not written yet
        self._unreported_drops = 0
        self._torn = False  # a failed write left a line without its end
        self.dropped = 0  # every line dropped since the start (a metric reads it)
        # What every line of this process carries (`,"worker":1,"pid":7`: logs.configure_logging),
        # for the one line the sink writes itself.
        self.line_fields = ""
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stderr-sink", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """Queue `data` (whole lines); never blocks on the reader."""
        with self._cond:
            if self._backlog_bytes + len(data) > self._max:
                lines = data.count(b"\n") or 1
                self.dropped += lines
                self._unreported_drops += lines
                self._cond.notify()  # (the line saying so goes out once writing does)
                return
            self._backlog.append(data)
            self._backlog_bytes += len(data)
            self._cond.notify()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the backlog to be written; False if it was not."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._backlog or self._writing or self._unreported_drops:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._backlog and not self._unreported_drops:
                    self._cond.wait()
                chunk = b"".join(self._backlog)
                self._backlog.clear()
                self._backlog_bytes = 0
                self._writing = True  # (an empty chunk with a drop notice is a write too)
                drops, self._unreported_drops = self._unreported_drops, 0
            lost = sum(self._write_piece(piece) for piece in _line_pieces(chunk, PIPE_BUF))
            unsaid = 0  # drops whose notice did not go out: said with the next one
            if drops:  # after the lines taken before the drop, before those taken after it
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
                unsaid = drops if self._write_piece((_DROPPED_LINE % (stamp, drops, self.line_fields)).encode()) else 0
            with self._cond:
                self.dropped += lost  # (lines lost to a failed write: a full disk, a reader gone)
                self._unreported_drops += lost + unsaid
                self._writing = False
                self._cond.notify_all()
            if lost or unsaid:
                time.sleep(FAILED_WRITE_PAUSE_S)  # (not a busy loop while writes keep failing)

    def _write_piece(self, piece: bytes) -> int:
        """Write `piece` (whole lines); the number of lines lost to a failed write.

        A line cut off by a failure (a disk that filled mid-write) is ended before the
        next piece, which would otherwise be glued to it (helper-109)."""
        ending = b"\n" if self._torn else b""  # the cut line's end, still owed
        sent = ending + piece
        left = self._write_all(sent)
        written = len(sent) - len(left)
        if written:  # (nothing written: the cut line is still cut, helper-111)
            self._torn = not sent[:written].endswith(b"\n")
        return left[len(ending) - written :].count(b"\n") if written < len(ending) else left.count(b"\n")

    def _write_all(self, data: bytes) -> bytes:
        """What of `data` could not be written (stderr closed, gone or full)."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stderr that is full: wait, as a blocking one would
                select.select([], [self._fd], [])
                continue
            except OSError:
                return bytes(view)
            view = view[written:]
        return b""


def _line_pieces(data: bytes, limit: int) -> list[bytes]:
    """`data` cut at line ends into pieces of at most `limit` bytes (a longer line alone)."""
    pieces: list[bytes] = []
    start = 0
    while start < len(data):
        end = start + limit
        if end >= len(data):
            pieces.append(data[start:])
            break
        cut = data.rfind(b"\n", start, end)
        cut = cut + 1 if cut >= start else data.find(b"\n", end) + 1 or len(data)
        pieces.append(data[start:cut])
        start = cut
    return pieces


_sink: StderrSink | None = None


def stderr_sink() -> StderrSink:
    """The process's sink, started on first use."""
    global _sink
    if _sink is None:
        _sink = StderrSink()
        # What is still queued at a normal exit goes out, unless stderr is stuck.
        atexit.register(_sink.flush, FLUSH_AT_EXIT_S)
    return _sink
