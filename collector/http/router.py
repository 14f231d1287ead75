"""The ASGI entry point: hot routes go straight to raw handlers, the rest to Quart.

Quart serves the operational routes and the WebSockets; its per-request
machinery costs about as much as the whole ingest pipeline, so the ingest
routes skip it. Unknown paths still answer in the spec's error format.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quart_trio import QuartTrio

from collector.errors import ServiceError, render_error
from collector.http.asgi import Receive, Request, Scope, Send, send_response
from collector.services import Services

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

QUART_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Route prefixes Quart serves once the realtime routes exist.
QUART_PREFIXES: tuple[str, ...] = ()


class Router:
    def __init__(self, quart: QuartTrio, services: Services) -> None:
        self.quart = quart
        self.services = services
        self._routes: dict[str, Handler] = {}
        self._prefixes: list[tuple[str, Handler]] = []

    def add(self, path: str, handler: Handler) -> None:
        self._routes[path] = handler

    def add_prefix(self, prefix: str, handler: Handler) -> None:
        """Every path under `prefix` (a route with a path parameter)."""
        self._prefixes.append((prefix, handler))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            handler = self._routes.get(path) or self._routes.get(path.rstrip("/"))
            if handler is None:
                handler = next((h for prefix, h in self._prefixes if path.startswith(prefix)), None)
            if handler is not None:
                await handler(scope, receive, send)
                return
            if path not in QUART_PATHS and not path.startswith(QUART_PREFIXES):
                await self._not_found(scope, send)
                return
        await self.quart(scope, receive, send)  # type: ignore[arg-type]

    async def _not_found(self, scope: Scope, send: Send) -> None:
        request = Request(scope)
        error = ServiceError("not_found", f"no route for {request.method} {request.path}")
        self.services.metrics.count_request("unmatched", 404)
        await send_response(send, 404, render_error(error), [("X-Request-ID", request.request_id)])
