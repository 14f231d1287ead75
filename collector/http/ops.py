"""Operational routes on the Quart app: /healthz, /readyz, /metrics."""

from __future__ import annotations

import os

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from collector.http.asgi import request_id_for
from collector.services import Services
from storage.errors import StorageError
from storage.writer import WriteContext

_encoder = msgspec.json.Encoder()
_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}
_PROBE_VALUE = bytes(1024 * 1024)


def register_ops_routes(app: QuartTrio, services: Services) -> None:
    @app.after_request
    async def add_request_id(response: Response) -> Response:
        # Spec 5.6: every response carries X-Request-ID, these routes' too.
        response.headers["X-Request-ID"] = request_id_for(request.headers.get("X-Request-ID", ""))
        return response

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        # The spec's error body (2.7) instead of the framework's HTML page.
        status = error.code or 500
        code = _ERROR_CODES.get(status, "internal_error" if status >= 500 else "bad_request")
        method = request.method
        body = _encoder.encode({"error": code, "message": f"{method} {request.path}: {error.name.lower()}"})
        response = Response(body, status=status, content_type="application/json")
        if error.code == 405:
            response.headers["Allow"] = "GET, HEAD"
        return response

    # which worker process answered (`serve --workers N`): index and pid
    health = (
        f'{{"status":"ok","worker":{services.worker_index},"pid":{os.getpid()}}}'.encode()
    )

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(health, status=200, content_type="application/json")

    probing: set[bool] = set()  # non-empty while a probe commit is on its way

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            writable = services.storage.writable()
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
            return Response(b'{"status":"ready"}', status=200, content_type="application/json")
        return Response(
            b'{"status":"not_ready","reason":"storage is not writable"}',
            status=503,
            content_type="application/json",
            headers={"Retry-After": "5"},
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            services.metrics.render(), status=200, content_type="text/plain; version=0.0.4"
        )


class _ProbeWrite:
    """A write job that proves a commit with room for a large batch can be made.

    It stores a megabyte (a 25-event batch of the largest events is about 3 MB,
    a typical one 10 KB) and deletes it in the same transaction: the pages are
    allocated, so a map at its cap fails here, and nothing stays behind. Solo:
    in a transaction of its own, so its failure never fails an admission.
    """

    solo = True

    def run(self, ctx: WriteContext) -> None:
        ctx.txn.put(b"ready_probe", _PROBE_VALUE, db=ctx.dbs.meta)
        ctx.txn.delete(b"ready_probe", db=ctx.dbs.meta)


async def _commit_probe(services: Services) -> bool:
    # Shielded, without a timeout: a cancelled submit (the balancer hung up)
    # would leave its probe queued while the next request queued another. A
    # stuck writer keeps this request waiting, and every other one gets 503.
    with trio.CancelScope(shield=True):
        try:
            await services.writer.submit(_ProbeWrite())
        except StorageError:
            return False
    return True
