"""The systemd notify protocol without a dependency: READY, STOPPING, WATCHDOG.

Messages go as datagrams to $NOTIFY_SOCKET (a leading "@" names the abstract
namespace). Outside systemd, NOTIFY_SOCKET is unset and every call is a no-op.
The watchdog ping runs on the event loop, so a wedged loop stops pinging and
systemd restarts the service.
"""

from __future__ import annotations

import os
import socket

import trio


def notify(message: str) -> bool:
    """Send one notify message; False when not under systemd or the send failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between pings (half of WatchdogSec), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000 / 2
    except ValueError:
        return None


async def watchdog_loop(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)
