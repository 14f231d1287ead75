"""The ASGI entry point: every HTTP route is a raw handler; Quart is kept for the WebSockets.

Quart's per-request machinery costs about as much as the whole ingest
pipeline, so no HTTP route goes through it (the operational routes left it
too: see collector/http/ops.py). It stays for the realtime WebSocket routes
once they exist. Unknown paths answer in the spec's error format.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from urllib.parse import unquote, urlsplit

import h11
from quart_trio import QuartTrio

from collector.errors import ServiceError, render_error
from collector.http.access_log import record_request, refuse_and_record
from collector.http.asgi import Receive, Request, Scope, Send
from collector.http.headers import cors_headers
from collector.services import Services

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

# Route prefixes Quart serves once the realtime routes exist.
QUART_PREFIXES: tuple[str, ...] = ()
# Tenant-wide WebSocket-only routes (spec 4.2): plain HTTP gets 426 upgrade_required.
# (/v1/signals/:visitorId/stream is refused the same way by the signals handler.)
WEBSOCKET_ONLY = frozenset({"/live/ws", "/signals/stream"})


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
            if path[:1] != "/":
                # The absolute form (`POST http://host/v1/events HTTP/1.1`), which a
                # server must accept (RFC 9112 3.2.2) and proxies send: route its path.
                # From the raw target: a decoded %3F or %23 in `path` would cut it short.
                raw_path = urlsplit((scope.get("raw_path") or path.encode()).partition(b"?")[0]).path or b"/"
                path = unquote(raw_path.decode("ascii", errors="replace"))
                scope = {**scope, "path": path, "raw_path": raw_path}
            handler = self._routes.get(path) or self._routes.get(path.rstrip("/"))
            if handler is None:
                handler = next((h for prefix, h in self._prefixes if path.startswith(prefix)), None)
            if handler is not None:
                await handler(scope, receive, send)
                return
            if path in WEBSOCKET_ONLY:
                await self._refuse(scope, receive, send, ServiceError(
                    "upgrade_required", f"{path} is a WebSocket route, and this version does not serve it yet"
                    " (a WebSocket handshake gets 404 not_found)",
                    headers={"Upgrade": "websocket"}))  # RFC 9110 15.5.22
                return
            if not path.startswith(QUART_PREFIXES):
                await self._not_found(scope, receive, send)
                return
        elif kind == "websocket" and not scope["path"].startswith(QUART_PREFIXES):
            await self._refuse_websocket(scope, receive, send)
            return
        await self.quart(scope, receive, send)  # type: ignore[arg-type]

    async def _not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        await self._refuse(
            scope, receive, send, ServiceError("not_found", f"no route for {request.method} {request.path}")
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: ServiceError) -> None:
        started = time.perf_counter()
        request = Request(scope)
        # CORS as on every route, so a page's script can read why it was refused
        headers = [("X-Request-ID", request.request_id), *cors_headers(request.headers.get("origin"))]
        await refuse_and_record(self.services, request, receive, send, error, headers, "unmatched", started)

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """No WebSocket route is served yet: refuse the handshake in the spec's error format.

        With the ASGI denial-response extension (hypercorn has it) the client
        gets a 404 with the usual JSON body and X-Request-ID; otherwise the
        handshake is closed, which the server turns into a bare 403.
        """
        started = time.perf_counter()
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        request = Request({**scope, "method": "GET"})
        error = ServiceError("not_found", f"no WebSocket route is served at {request.path} yet")
        denial = "websocket.http.response" in scope.get("extensions", {})
        # Without the denial extension the server answers a handshake closed before it was accepted with 403.
        status, code = error.status if denial else 403, error.code
        try:
            if denial:
                body = render_error(error)
                await send({
                    "type": "websocket.http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"x-request-id", request.request_id.encode("latin-1"))],
                })
                await send({"type": "websocket.http.response.body", "body": body})
            else:
                await send({"type": "websocket.close", "code": 1008})
        except h11.LocalProtocolError:
            # hypercorn had answered the connection already: a bare 400 for bytes after the
            # handshake that are no WebSocket frame (helper-109: the refusal raised into
            # hypercorn, an ERROR traceback each time, and was logged as the 404 never sent)
            status, code = 400, "bad_request"
        finally:  # (a client gone mid-answer is still a request that was refused)
            record_request(self.services, request, "unmatched", status, code, None, started)
