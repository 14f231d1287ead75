"""The notify protocol, with the test playing systemd on a Unix datagram socket."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from collector import systemd


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """systemd's end: a bound datagram socket named by NOTIFY_SOCKET."""
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    yield listener
    listener.close()


def received(listener: socket.socket) -> list[str]:
    """Every datagram waiting on the socket, without blocking."""
    messages = []
    listener.setblocking(False)
    try:
        while True:
            messages.append(listener.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        listener.settimeout(5)
    return messages


def test_ready_and_stopping_reach_the_socket(notify_socket: socket.socket) -> None:
    assert systemd.notify("READY=1\nSTATUS=listening on http://127.0.0.1:8080")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=listening on http://127.0.0.1:8080"
    assert systemd.notify("STOPPING=1")
    assert notify_socket.recv(4096) == b"STOPPING=1"


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"collector-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("READY=1")
        assert listener.recv(4096) == b"READY=1"


@pytest.mark.parametrize("value", [None, "", "relative/notify.sock", "vsock:2:1234"])
def test_without_a_usable_socket_notify_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert systemd.notify("READY=1") is False


def test_nobody_listening_is_false_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert systemd.notify("READY=1") is False


def test_a_full_socket_never_blocks_the_caller(notify_socket: socket.socket) -> None:
    outcome: list[bool] = []

    def flood() -> None:
        for _ in range(100_000):
            if not systemd.notify("WATCHDOG=1"):
                outcome.append(False)
                return
        outcome.append(True)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    thread.join(timeout=10)
    finished = not thread.is_alive()
    notify_socket.close()  # unblocks a blocked sender, if the test is about to fail
    assert finished, "notify() blocked on a full receive queue"
    assert outcome == [False]


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 30.0),
        ("30000000", "self", 30.0),
        ("30000000", "other", None),
        ("0", None, None),
        ("soon", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(
                name, {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(value, value)
            )
    assert systemd.watchdog_interval() == expected


async def test_watchdog_pings_every_half_interval(
    notify_socket: socket.socket, autojump_clock: Any
) -> None:
    start = trio.current_time()
    with trio.move_on_after(46):
        await systemd.watchdog_loop(30.0)
    assert trio.current_time() - start == pytest.approx(46)
    # at 0, 15, 30 and 45 s of trio's clock: the pings come from a task on the
    # event loop, so a loop that stops scheduling tasks stops pinging
    assert received(notify_socket) == ["WATCHDOG=1"] * 4
