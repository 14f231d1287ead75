"""Interpreter settings for a serving process (the fatal-signal report also for operator commands)."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import signal
import sys

# gen0 collects after this many net container allocations (CPython's default
# is 700); gen1 and gen2 after 20 collections of the generation below.
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Fewer cyclic-GC passes, none over what start-up allocated.

    Decoding a 25-event body allocates ~1,500 container objects; with the
    default thresholds the collector ran about twice per request and, with
    64 requests in flight, cost ~0.14 ms of a 25-event request's ~1.2 ms of
    CPU (bench batch25: ~830 collections, 0.58 s of GC in 5 s). Reference
    counting still frees almost everything at once; the cyclic collector
    only has to find cycles, and a few hundred requests' worth of them can
    wait. `gc.freeze()` moves every object alive at start-up (modules, the
    Public Suffix List, settings) to the permanent generation, so the rare
    full collection scans only what serving allocated.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def hold_standard_descriptors() -> None:
    """Put /dev/null on fd 0, 1 or 2 when the process started with it closed.

    Otherwise the next file opened takes the number: a service started with
    `2>&-` held data.mdb as fd 2, where the log sink, faulthandler and LMDB's
    own assertion messages write (into the file, were it opened for writing).
    Python has already set sys.stdout/sys.stderr to None for a closed one, so a
    command still knows its stdout was closed.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:  # (the lowest free number: fd itself, unless an earlier one was free too)
                os.dup2(held, fd)
                os.close(held)
            # Python opens files close-on-exec: `--workers` children would start with
            # the number free again (helper-97: a child's stderr was a socket of its own)
            os.set_inheritable(fd, True)


def report_fatal_signals() -> None:
    """Name a fatal signal on stderr with the Python stack, when there is a stderr.

    A data.mdb cut short (a partial copy) is a SIGBUS once LMDB touches a page
    past its end; without this the process dies without a word (under systemd,
    a silent crash loop). With no stderr (started with fd 2 closed) there is
    nowhere to say it, and enabling would fail.
    """
    if sys.stderr is None:
        return
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        faulthandler.enable()


_early_stop: list[int] = []


# SIGHUP too: a hang-up (a closed terminal, a process-group signal) drains
# like a stop instead of killing requests mid-commit; nothing reloads on it.
# Unless the process started with it ignored (`nohup collector serve`): then it
# stays ignored, as nohup asked. (Read at import, before anything handles it.)
STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT) + (
    () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
)


def stop_at_once_while_starting() -> None:
    """Until serving begins (then defer_stop_signals): a stop signal ends the process with status 0.

    Nothing has been acknowledged yet, and an LMDB transaction cut short is
    discarded as after a crash. With the default action a slow start (a large
    tenants file, LMDB's writer lock held by a command) ended with 143 where
    the operator contract promises 0; deferring instead could not be stopped.
    """

    def stop(received: int, _frame: object) -> None:
        with contextlib.suppress(OSError):  # (started with stderr closed: fd 2 may be anything)
            os.write(2, f"collector: stopped by {signal.Signals(received).name} while starting\n".encode())
        os._exit(0)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


def defer_stop_signals() -> None:
    """Remember SIGTERM, SIGINT and SIGHUP until serve() watches them itself (see early_stop_signal).

    A worker process of `serve --workers N` starts while its supervisor may
    already be stopping: with the default action the signal killed it
    half-started (an unclean exit), and with a handler that ignored it the
    worker served out the whole drain time and was then killed. A signal
    that arrives later, during the drain, is remembered too and changes nothing.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda received, _frame: _early_stop.append(received))


def early_stop_signal() -> int | None:
    """The first stop signal that arrived before serve() watched for it, if any."""
    return _early_stop[0] if _early_stop else None


def announce_listening(url: str) -> None:
    """Print the operator contract's `collector listening on URL` line on stdout.

    A stdout that is closed, or a pipe whose reader is gone (`serve | true`),
    must not stop a server that is otherwise ready: it killed the process with
    a traceback (helper-89). The log line beside it still says so on stderr.
    """
    if sys.stdout is None:
        return
    with contextlib.suppress(OSError, ValueError):  # (ValueError: a closed file object)
        print(f"collector listening on {url}", flush=True)
