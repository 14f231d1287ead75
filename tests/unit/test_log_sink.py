"""The stderr sink: log lines never block the caller, whatever the reader does."""

from __future__ import annotations

import contextlib
import os
import threading

from collector.log_sink import StderrSink


def test_a_reader_that_stops_reading_blocks_no_writer_and_loses_only_what_overflows() -> None:
    read_end, write_end = os.pipe()
    try:
        sink = StderrSink(fd=write_end, max_backlog_bytes=256 * 1024)
        line = b'{"msg":"' + b"x" * 90 + b'"}\n'  # 101 bytes
        # 8,000 lines (808 KB) are more than the pipe (64 KiB), a chunk being written
        # and the backlog (256 KiB each at most) can hold.
        writer = threading.Thread(target=lambda: [sink.write(line) for _ in range(8000)])
        writer.start()
        writer.join(10)
        assert not writer.is_alive(), "a write blocked on the reader"
        assert sink.dropped > 0
        assert not sink.flush(0.2)  # the reader is still not reading
        received = bytearray()
        while not sink.flush(0.05):  # the reader reads again: the sink writes the rest
            received += os.read(read_end, 1 << 20)
        os.set_blocking(read_end, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 1 << 20):  # what the last writes left in the pipe
                received += chunk
        lines = bytes(received).splitlines()
        notice = [text for text in lines if b"log lines dropped" in text]
        assert len(notice) == 1 and f'"msg":"{sink.dropped} log lines dropped'.encode() in notice[0]
        assert len(lines) - 1 + sink.dropped == 8000  # every line written or counted, none twice
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_non_blocking_stderr_that_is_full_is_waited_for_not_dropped() -> None:
    # helper-83: a write refused with EAGAIN threw the rest of its chunk away, uncounted.
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        sink = StderrSink(fd=write_end)
        line = b'{"msg":"' + b"y" * 90 + b'"}\n'
        for _ in range(3000):  # 303 KB: several times what the pipe holds
            sink.write(line)
        received = bytearray()
        while len(received) < 3000 * len(line):
            received += os.read(read_end, 1 << 20)
        assert sink.flush(5) and sink.dropped == 0
        assert bytes(received) == line * 3000
    finally:
        os.close(read_end)
        os.close(write_end)


def test_writes_are_whole_lines_no_longer_than_a_pipe_writes_at_once() -> None:
    # helper-83: `--workers` children share stderr, and one write of the whole backlog
    # (more than PIPE_BUF bytes) was torn into another child's lines.
    from collector.log_sink import PIPE_BUF, _line_pieces

    data = b"".join(b"z" * size + b"\n" for size in (10, 3000, 2000, PIPE_BUF + 900, 1, 0, PIPE_BUF - 1))
    pieces = _line_pieces(data, PIPE_BUF)
    assert b"".join(pieces) == data and all(piece.endswith(b"\n") for piece in pieces)
    assert all(len(piece) <= PIPE_BUF for piece in pieces if piece.count(b"\n") > 1)
