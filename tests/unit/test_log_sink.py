"""The stderr sink: log lines never block the caller, whatever the reader does."""

from __future__ import annotations

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
        while not (received.endswith(b"\n") and sink.flush(0.05)):
            received += os.read(read_end, 1 << 20)
        lines = bytes(received).splitlines()
        notice = [text for text in lines if b"log lines dropped" in text]
        assert len(notice) == 1 and f'"msg":"{sink.dropped} log lines dropped'.encode() in notice[0]
        assert len(lines) - 1 + sink.dropped == 8000  # every line written or counted, none twice
    finally:
        os.close(read_end)
        os.close(write_end)
