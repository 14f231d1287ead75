"""`collector serve --workers N`: one parent, N worker processes, one socket, one environment.

The parent opens the data directory once (format check, migrations, tenants
import), then closes it; binds and listens on the HTTP socket itself (so with
`--bind 127.0.0.1:0` the port it prints is the real one) and spawns N
children with `python -m collector.workers`, each inheriting that listening
socket as a file descriptor (hypercorn's `bind = ["fd://N"]`). The kernel
hands each new connection to whichever child accepts first: one accept queue,
no SO_REUSEPORT hashing and no socket of the parent's that nobody accepts on.

Each child is a whole `collector.app.serve`: its own trio nursery tree, key
cache, request-rate partition (limit / N, see collector/limits/buckets.py)
and group-commit writer over the shared LMDB environment (LMDB's writer lock
serialises the children's transactions; a child adopts a map another child
grew). Worker 0 alone runs the retention sweep and the outbox consumers'
catch-up; every worker folds its own groups into the visitor records.

The parent prints exactly one `collector listening on http://HOST:PORT` line
once every child reported ready, and sends systemd READY=1 / STOPPING=1 /
WATCHDOG=1 (the children get no NOTIFY_SOCKET). SIGTERM or SIGINT: forwarded
as SIGTERM to every child; the parent exits 0 once all drained and exited 0,
1 if one had to be killed after `graceful_timeout` + 1 s or failed. A child
that dies unexpectedly is restarted after a backoff (0.5 s doubling to 8 s,
reset after 30 s of uptime); more than 5 unexpected exits within 60 s, or a
child that never gets ready at start-up, stop the parent with status 1. A
restarted child that refuses the directory (a key file that lacks a key it
recorded) exits 2 with one line: not a crash; the others go on serving and it
is tried again every 30 s.
Children die with the parent (PR_SET_PDEATHSIG: SIGTERM, so they drain).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from functools import partial

import msgspec
import trio

from collector import systemd
from collector.runtime import STOP_SIGNALS, announce_listening, defer_stop_signals
from collector.settings import Settings, SettingsError

log = logging.getLogger("collector.workers")

READY_TIMEOUT_S = 60.0
BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 0.5, 8.0, 30.0
CRASH_WINDOW_S, CRASH_LIMIT = 60.0, 5
REFUSED_TO_START = 2  # a restarted child's exit status when the directory refuses it (a key file)
REFUSED_RETRY_S = 30.0
_CHILD_ENV_DROP = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


class SupervisorFailed(Exception):
    """A child could not start, or crashed too often: the parent exits 1."""


def bind_listener(settings: Settings) -> socket.socket:
    host, port = settings.host_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(settings.backlog)
    sock.set_inheritable(True)
    return sock


def listening_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def prepare_storage(settings: Settings) -> None:
    """Open the environment once before the children: format check, migrations, start-up writes.

    In a thread the main thread joins: a transaction may wait long for LMDB's
    writer lock, and the main thread must stay free to handle a stop signal
    (runtime.stop_at_once_while_starting; Python runs handlers only there).
    """
    from collector.app import open_storage, prepare_data_dir

    failure: list[BaseException] = []

    def prepare() -> None:
        try:
            storage = open_storage(settings)
            try:
                prepare_data_dir(storage, settings, int(time.time() * 1000))
            finally:
                storage.close()
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)

    worker = threading.Thread(target=prepare, name="collector-prepare", daemon=True)
    worker.start()
    worker.join()  # (a signal interrupts the wait and runs its handler)
    if failure:
        raise failure[0]


def metrics_directory() -> str:
    """Where the workers share their metrics (collector/metrics_share.py); removed at exit.

    systemd's RuntimeDirectory= when the unit has one, else the temporary
    directory (TMPDIR; the shipped unit's DynamicUser gives a private /tmp).
    """
    try:
        return tempfile.mkdtemp(prefix="collector-metrics-", dir=os.environ.get("RUNTIME_DIRECTORY") or None)
    except OSError as exc:
        raise SettingsError(
            f"--workers needs a writable directory for the workers' metrics: {exc}"
            " (set TMPDIR, or RuntimeDirectory= in the unit)"
        ) from None


def run_supervisor(settings: Settings, sock: socket.socket, serving_lock: int) -> int:
    """`collector serve --workers N` (N > 1) in the parent, on listening `sock`; returns the exit status.

    `serving_lock`: the data directory's serve lock (a descriptor), handed to
    every worker so that it is held while any of them runs.
    """
    prepare_storage(settings)
    supervisor = Supervisor(settings, sock, serving_lock)
    try:
        return trio.run(supervisor.run)
    finally:
        # trio restored the start-up handler (exit 0 at once): from here a
        # signal must neither skip this clean-up nor turn a failure into 0
        defer_stop_signals()
        sock.close()
        shutil.rmtree(supervisor.metrics_dir, ignore_errors=True)


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket, serving_lock: int) -> None:
        self.settings = settings
        self.sock = sock
        self.serving_lock = serving_lock
        child = msgspec.structs.replace(
            settings, bind=f"fd://{sock.fileno()}", tenants=None, demo_tenant=False
        )
        self.child_settings = msgspec.json.encode(child).decode()
        self.env = {k: v for k, v in os.environ.items() if k not in _CHILD_ENV_DROP}
        self.procs: dict[int, Child] = {}
        self.metrics_dir = metrics_directory()
        self.stopping = trio.Event()
        self.starting = trio.CancelScope()  # the first start of every worker; a stop signal cancels it
        self.failed: str | None = None
        self.crashes: deque[float] = deque()
        self.restarts = 0

    async def run(self) -> int:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                # Signals are heeded from the start: a stop while the workers
                # start (each takes ~0.5 s, one after another) must not wait
                # for the rest of them (operator contract: exit within 10 s).
                nursery.start_soon(self._await_signal, signals)
                try:
                    with self.starting:
                        for index in range(self.settings.workers):
                            await nursery.start(self._slot, index)
                except SupervisorFailed as exc:
                    self.failed = str(exc)
                    # (said before returning: an exit 1 without a word was a silent restart loop under systemd)
                    log.error("stopping: %s", self.failed)
                    await self._stop_children()
                    nursery.cancel_scope.cancel()
                    return 1
                if not self.stopping.is_set():
                    url = listening_url(self.sock)
                    announce_listening(url)
                    log.info("listening on %s with %d workers", url, self.settings.workers)
                    systemd.notify(
                        f"READY=1\nSTATUS=listening on {url} with {self.settings.workers} workers\n"
                        f"MAINPID={os.getpid()}"
                    )
                    interval = systemd.watchdog_interval()
                    if interval:
                        nursery.start_soon(systemd.watchdog_loop, interval)
                await self.stopping.wait()
                clean = await self._stop_children()
                nursery.cancel_scope.cancel()
        if self.failed:
            log.error("stopping: %s", self.failed)
            return 1
        return 0 if clean else 1

    async def _await_signal(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if not self.stopping.is_set():
                log.info("received %s: draining workers", signal.Signals(signum).name)
                systemd.notify("STOPPING=1")
                self.stopping.set()
                self.starting.cancel()  # a worker still starting is stopped with the others

    async def _stop_children(self) -> bool:
        """SIGTERM every child; SIGKILL what has not exited after the drain time. True if clean.

        Clean: every child that was running drained and exited 0, or had not yet
        started serving and died of the SIGTERM itself. A child that had already
        crashed (logged when it did, waiting for its restart) is not this stop's.
        """
        self.stopping.set()
        procs = [proc for proc in self.procs.values() if proc.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        # The children close their copies of the listening socket as they stop
        # accepting; ours must go too, or connections queue in its backlog
        # until we exit and are then reset instead of refused.
        self.sock.close()
        clean = True
        with trio.move_on_after(self.settings.graceful_timeout + 1.0) as scope:
            for proc in procs:
                await proc.wait()
        if scope.cancelled_caught:
            clean = False
            for proc in procs:
                if proc.returncode is None:
                    log.error("worker pid %d did not drain in time: killing it", proc.pid)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            with trio.CancelScope(shield=True):
                for proc in procs:
                    await proc.wait()
        for proc in procs:
            if proc.returncode != 0 and not (proc.returncode == -signal.SIGTERM and not proc.ready):
                clean = False
        return clean

    def _spawn(self, index: int) -> Child:
        argv = [
            sys.executable, "-m", "collector.workers",
            "--index", str(index),
            "--parent", str(os.getpid()),
            "--settings", self.child_settings,
            "--metrics-dir", self.metrics_dir,
        ]  # fmt: skip
        # Spawned from the trio thread itself, not a worker thread (trio's
        # open_process): PR_SET_PDEATHSIG fires when the *thread* that forked
        # the child exits, and trio retires idle worker threads.
        popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, pass_fds=(self.sock.fileno(), self.serving_lock), env=self.env
        )
        return Child(popen)

    async def _slot(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        """Keep worker `index` running until the supervisor stops."""
        backoff = BACKOFF_FIRST_S
        first = True
        while not self.stopping.is_set():
            proc = self._spawn(index)
            self.procs[index] = proc
            started = time.monotonic()
            ready = await self._wait_ready(proc)
            if not ready:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                if first:
                    raise SupervisorFailed(f"worker {index} did not start (exit {proc.returncode})")
            else:
                proc.ready = True
                if first:
                    first = False
                    task_status.started()
            if ready:
                async with trio.open_nursery() as drain:
                    drain.start_soon(self._drain_output, proc)
                    await proc.wait()
                    drain.cancel_scope.cancel()
            await proc.stdout.aclose()
            if self.stopping.is_set():
                return
            now = time.monotonic()
            if proc.returncode == 0:
                # Drained and stopped on purpose (a SIGTERM to this worker alone, to
                # recycle it): started again, and not counted as a crash.
                log.info("worker %d (pid %d) stopped cleanly: starting it again", index, proc.pid)
            elif proc.returncode == REFUSED_TO_START:
                # Not a crash, and no retry will change it until the operator does:
                # the other workers go on serving, and this one is tried now and then.
                log.error(
                    "worker %d (pid %d) refused to start (the line above says why): the other workers go on"
                    " serving%s; it is tried again every %.0f s",
                    index, proc.pid,
                    " without the retention sweep and the visitor catch-up, which only worker 0 runs" if index == 0 else "",
                    REFUSED_RETRY_S,
                )  # fmt: skip
                with trio.move_on_after(REFUSED_RETRY_S):
                    await self.stopping.wait()
                self.restarts += 1
                continue
            else:  # an unexpected exit: restart with backoff, or give up
                self.crashes.append(now)
                while self.crashes and self.crashes[0] < now - CRASH_WINDOW_S:
                    self.crashes.popleft()
                log.error("worker %d (pid %d) exited unexpectedly with %s", index, proc.pid, proc.returncode)
                if len(self.crashes) > CRASH_LIMIT:
                    self.failed = f"{len(self.crashes)} worker crashes within {CRASH_WINDOW_S:.0f} s"
                    self.stopping.set()
                    return
            if now - started > BACKOFF_RESET_S:
                backoff = BACKOFF_FIRST_S
            with trio.move_on_after(backoff):
                await self.stopping.wait()
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            self.restarts += 1

    async def _wait_ready(self, proc: Child) -> bool:
        buffer = b""
        with trio.move_on_after(READY_TIMEOUT_S):
            while b"\n" not in buffer:
                chunk = await proc.stdout.receive_some(4096)
                if not chunk:
                    return False
                buffer += chunk
            return b"listening on" in buffer
        return False

    async def _drain_output(self, proc: Child) -> None:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            while await proc.stdout.receive_some(4096):
                pass


class Child:
    """A worker process; its stdout is read by trio, its exit polled (cheap, and any task may wait)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.ready = False  # it said "listening on": it may have accepted connections
        assert popen.stdout is not None
        self.stdout = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
        popen.stdout.close()

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        while (code := self.popen.poll()) is None:  # noqa: ASYNC110 (a child exit is no trio event)
            await trio.sleep(0.1)
        return code


# -- the child ---------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Get SIGTERM (a graceful drain) when the parent dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


def child_main(argv: list[str] | None = None) -> int:
    from collector.runtime import (
        defer_stop_signals,
        hold_standard_descriptors,
        report_fatal_signals,
        tune_gc,
    )

    hold_standard_descriptors()  # (the parent's are passed on; this is for a child started otherwise)

    # The parent forwards SIGTERM and systemd (KillMode=control-group) may send
    # its own: neither may kill the child with the default action, nor be lost
    # while it starts. serve() drains on the first, however early it came.
    # (Before this line, while the interpreter starts, the default action
    # still applies: the supervisor counts that exit as clean.)
    defer_stop_signals()
    from collector.app import serve
    from collector.logs import configure_logging

    parser = argparse.ArgumentParser(prog="python -m collector.workers")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--metrics-dir", required=True)
    args = parser.parse_args(argv)
    report_fatal_signals()
    _die_with_parent(args.parent)
    settings = msgspec.json.decode(args.settings, type=Settings)
    configure_logging(worker=args.index)
    tune_gc()  # every worker serves like a one-process collector does
    from collector.fieldkeys import KeyFileError
    from storage.errors import FormatError

    try:
        trio.run(partial(serve, settings, worker_index=args.index, metrics_dir=args.metrics_dir, own_process=True))
    except (KeyFileError, FormatError) as exc:
        # What the directory holds changed since the first start (a key file put back
        # from an older copy): one line, as `serve` refuses it, and the supervisor
        # keeps the other workers serving (helper-93: a traceback, then the node down).
        log.error("worker %d refuses to start: %s", args.index, exc)
        return REFUSED_TO_START
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
