"""The stderr sink: log lines never block the caller, whatever the reader does."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import threading
import time
from pathlib import Path

import pytest

from collector import logs
from collector.log_sink import PIPE_BUF, StderrSink
from collector.logs import one_line


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


def test_a_failed_write_ends_the_line_it_cut_and_counts_what_it_lost(tmp_path: Path) -> None:
    # helper-109: stderr on a disk that filled mid-write left half a line that the next
    # record was glued to, and the lines lost were counted nowhere.
    path = tmp_path / "stderr"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    sink = StderrSink(fd)
    sink.line_fields = ',"worker":1,"pid":7'  # (a `--workers` child's: logs.configure_logging)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))  # (Python ignores SIGXFSZ: the write fails)
        sink.write(b'{"a":"' + b"x" * 200 + b'"}\n{"b":1}\n')
        deadline = time.monotonic() + 5
        while sink.dropped < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # a write that fails whole keeps the cut line owed its end (helper-111: it was
        # forgotten, and the line after the disk had room again was glued to the cut one)
        sink.write(b'{"lost":1}\n')
        while sink.dropped < 3 and time.monotonic() < deadline + 5:
            time.sleep(0.01)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert sink.dropped == 3
    sink.write(b'{"c":2}\n')
    assert sink.flush(5)
    os.close(fd)
    cut, *rest = path.read_bytes().split(b"\n")
    assert len(cut) == 100 and rest[-1] == b""
    records = [json.loads(line) for line in rest[:-1]]
    assert records[0] == {"c": 2} and records[1]["msg"] == "3 log lines dropped: stderr was not being read, or could not be written"
    assert (records[1]["worker"], records[1]["pid"]) == (1, 7)  # as every line of the process (helper-116)


def test_a_record_that_cannot_be_cut_to_size_keeps_its_process_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_process_fields", {"worker": 2, "pid": 9})
    line = one_line({"ts": "t", "level": "info", "logger": "x", "worker": 2, "pid": 9,
                     **{f"field{n}": "v" for n in range(1000)}})  # (names are never cut)
    assert json.loads(line) == {"ts": "t", "level": "info", "logger": "x", "worker": 2, "pid": 9, "msg": "(cut)"}


def test_a_log_record_is_one_line_of_at_most_a_pipe_write_with_controls_escaped() -> None:
    # helper-109: a 12 KB warning was written in one write past PIPE_BUF, and another
    # worker's line landed inside it; U+2028 and C1 controls went out raw.
    line = one_line({"ts": "t", "msg": "m\u2028\u009b\x7f" + "a" * 10_000, "exc": "Traceback\n" + "b" * 20_000 + "\nKeyError: 'k'"})
    assert len(line.encode()) <= PIPE_BUF - 1 and "\u2028" not in line and "\u009b" not in line
    record = json.loads(line)
    assert record["msg"].startswith("m\u2028\u009b\x7faaa") and " characters cut ...] " in record["msg"]
    assert record["exc"].startswith("Traceback\nbbb") and record["exc"].endswith("bbb\nKeyError: 'k'")
    assert one_line({"msg": "short"}) == '{"msg":"short"}'
    wide = json.loads(one_line({"msg": "\x01" * 5000}))["msg"]  # (escaped: 6 bytes a character)
    assert 500 < len(wide) < 700
