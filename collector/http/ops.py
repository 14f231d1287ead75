"""Operational routes: /healthz, /readyz, /metrics, as raw ASGI handlers like the API's.

They were Quart routes. Quart held a connection open after a response that
said `Connection: close` (its request task waits for the client to hang up),
and werkzeug's URL adapter answered a Host it cannot IDNA-encode (a
64-character label, `a..b`) with a 500 and a traceback; neither reads
anything these routes need. GET and HEAD; any other method is 405 with
`Allow: GET, HEAD` in the spec's error format.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable

import trio

from collector.errors import ServiceError
from collector.http.access_log import log_request, refuse_and_record
from collector.http.asgi import (
    JSON_CONTENT_TYPE,
    Receive,
    Request,
    Scope,
    Send,
    send_response,
)
from collector.services import Services
from storage.env import READY_MARGIN_PAGES
from storage.errors import StorageError
from storage.writer import WriteContext

# The probe's megabyte, as 256 values of 4,000 bytes, each in a page of its own (an
# event of that size takes one too). One 1 MB value needs 256 pages in a row, which a
# map a retention sweep has just emptied seldom has: the node stayed not ready with
# half its map free.
_PROBE_KEYS = [b"ready_probe/%03d" % n for n in range(256)]
_PROBE_VALUE = bytes(4000)
_METRICS_CONTENT_TYPE = (b"content-type", b"text/plain; version=0.0.4")
_READY = b'{"status":"ready"}'
_NOT_READY = b'{"status":"not_ready","reason":"storage is not writable"}'

Answer = tuple[int, bytes, list[tuple[str, str]]]


def ops_handlers(
    services: Services,
) -> dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]]:
    """The handlers by path, for Router.add."""
    # which worker process answered (`serve --workers N`): index and pid
    health = f'{{"status":"ok","worker":{services.worker_index},"pid":{os.getpid()}}}'.encode()
    probing: set[bool] = set()  # non-empty while a probe commit is on its way

    async def healthz() -> Answer:
        return 200, health, []

    async def readyz() -> Answer:
        try:
            # (a map at its cap keeps its last pages for retention: events are refused
            # then, whatever the last commit did; every worker sees the same map)
            writable = services.storage.writable() and not services.storage.reads_short_of_reserve(READY_MARGIN_PAGES)
        except StorageError:
            writable = False
        if writable and not services.writer.healthy:
            # The last commit failed (a map at its cap, an I/O error): free disk
            # space alone says nothing then. A probe commit tells, and its
            # success is also what makes the writer healthy again. One at a
            # time: balancers polling meanwhile are told "not ready".
            if probing:
                writable = False
            else:
                probing.add(True)
                try:
                    writable = await _commit_probe(services)
                finally:
                    probing.clear()
        if writable:
            return 200, _READY, []
        return 503, _NOT_READY, [("Retry-After", "5")]

    async def metrics() -> Answer:
        return 200, services.metrics.render(), []

    return {
        "/healthz": _route(services, "/healthz", healthz),
        "/readyz": _route(services, "/readyz", readyz),
        "/metrics": _route(services, "/metrics", metrics, _METRICS_CONTENT_TYPE, readers=_metrics_readers(services)),
    }


def _metrics_readers(services: Services) -> Callable[[Request], bool]:
    """Whether a request's client may read /metrics (setting metrics_from)."""
    networks, proxies = services.metrics_readers, services.proxies

    def allowed(request: Request) -> bool:
        # A page a browser fetched it for is not a scraper: on a DNS-rebinding site, a
        # visitor's browser on the private network read it same-origin, which CORS does
        # not stop (helper-122). Browsers say so in Sec-Fetch-Site; "none" is a person
        # typing the URL, which no page can make a browser send.
        if request.headers.get("sec-fetch-site", "none") != "none":
            return False
        client = proxies.client_address(request.client_ip, request.headers.get("x-forwarded-for"))
        return client is not None and networks.trusted(client)

    return allowed


def _route(
    services: Services,
    path: str,
    answer: Callable[[], Awaitable[Answer]],
    content_type: tuple[bytes, bytes] = JSON_CONTENT_TYPE,
    *,
    readers: Callable[[Request], bool] | None = None,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """`readers`: who may have the answer; anyone else is told there is nothing here."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request = Request(scope)
        code: str | None
        error: ServiceError | None = None
        if readers is not None and not readers(request):
            error = ServiceError("not_found", f"{path} is served only to the networks in metrics_from,"
                                              " and not to a fetch a web page made")
        elif request.method not in ("GET", "HEAD"):
            error = ServiceError(
                "method_not_allowed",
                f"{request.method} {request.path}: use GET",
                headers={"Allow": "GET, HEAD"},
            )
        if error is not None:
            await refuse_and_record(services, request, receive, send, error,
                                    [("X-Request-ID", request.request_id)], path, started)
            return
        status, body, headers = await answer()
        headers.append(("X-Request-ID", request.request_id))
        code = None if status < 400 else "not_ready"
        services.metrics.count_request(path, status)
        try:
            await send_response(send, status, body, headers, content_type, head=request.method == "HEAD")
        finally:  # (an answer cut off while sent is still a request answered: helper-93)
            if services.settings.access_log:
                log_request(request, path, status, code, None, started)

    return handle


class _ProbeTick:
    """A few bytes committed before the probe: LMDB reuses the pages a transaction
    freed (a retention sweep's) only once a later one has committed, and on a full
    map every probe failed without committing anything, so none ever did."""

    solo = True
    spends_reserve = True

    def run(self, ctx: WriteContext) -> None:
        ctx.txn.put(b"ready_probe_tick", ctx.now_ms.to_bytes(8, "big"), db=ctx.dbs.meta)


class _ProbeWrite:
    """A write job that proves a commit with room for a large batch can be made.

    It stores a megabyte (a 25-event batch of the largest events is about 3 MB,
    a typical one 10 KB), committed, so its pages are written: a map at its cap,
    a file that may not grow (a file-size limit, a quota, a full disk) or a
    failing disk fails here. (Stored and deleted in one transaction, the pages
    were never written, and the probe passed while every batch failed.) Solo:
    in a transaction of its own, so its failure never fails an admission.
    """

    solo = True

    def run(self, ctx: WriteContext) -> None:
        for key in _PROBE_KEYS:
            ctx.txn.put(key, _PROBE_VALUE, db=ctx.dbs.meta)
        ctx.stored_elsewhere = True  # (a commit that stored something: the writer is healthy again)


class _ProbeCleanup:
    """Deletes the probe's megabyte, in a transaction after the probe's."""

    solo = True
    spends_reserve = True  # it makes room

    def run(self, ctx: WriteContext) -> None:
        for key in _PROBE_KEYS:
            ctx.txn.delete(key, db=ctx.dbs.meta)


async def _commit_probe(services: Services) -> bool:
    # Shielded, without a timeout: a cancelled submit (the balancer hung up)
    # would leave its probe queued while the next request queued another. A
    # stuck writer keeps this request waiting, and every other one gets 503.
    with trio.CancelScope(shield=True):
        try:
            await services.writer.submit(_ProbeTick())
            await services.writer.submit(_ProbeWrite())
        except StorageError:
            return False
        # (should it fail: a megabyte left in meta, which the next probe reuses)
        with contextlib.suppress(StorageError):
            await services.writer.submit(_ProbeCleanup())
    return True
