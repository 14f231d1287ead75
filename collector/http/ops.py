"""Operational routes on the Quart app: /healthz, /readyz, /metrics."""

from __future__ import annotations

import os

from quart import Response
from quart_trio import QuartTrio

from collector.services import Services
from storage.errors import StorageError


def register_ops_routes(app: QuartTrio, services: Services) -> None:
    # which worker process answered (`serve --workers N`): index and pid
    health = (
        f'{{"status":"ok","worker":{services.worker_index},"pid":{os.getpid()}}}'.encode()
    )

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(health, status=200, content_type="application/json")

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            writable = services.storage.writable()
        except StorageError:
            writable = False
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
