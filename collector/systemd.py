"""The systemd notify protocol without a dependency: READY, STOPPING, WATCHDOG.

Messages go as datagrams to $NOTIFY_SOCKET (a leading "@" names the abstract
namespace). Outside systemd, NOTIFY_SOCKET is unset and every call is a
no-op. The watchdog ping is sent by a task on the event loop, so a wedged
loop stops pinging and systemd restarts the service (WatchdogSec=).
"""

from __future__ import annotations

import os
import socket

import trio


def notify(message: str) -> bool:
    """Send one notify message ("READY=1\\nSTATUS=...", "STOPPING=1", "WATCHDOG=1").

    Never blocks and never raises: False when not under systemd, when
    NOTIFY_SOCKET is not a path or abstract name, or when the send failed.
    """
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a transport we do not speak (vsock:)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # a full receive queue must not stall the event loop
            sock.sendto(message.encode(), address)
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """WatchdogSec in seconds from WATCHDOG_USEC, or None when no watchdog is set for this process.

    WATCHDOG_PID, when set, must be this process's pid (the variables are
    inherited by children, which must not ping for the main process).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID")
    if pid is not None and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None


async def watchdog_loop(interval: float) -> None:
    """Send WATCHDOG=1 now and every interval / 2 until cancelled."""
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval / 2)
