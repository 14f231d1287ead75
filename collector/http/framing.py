"""A request framed two ways is answered, then its connection closed (RFC 9112 section 6.3).

A request with both Transfer-Encoding and Content-Length is read by h11 by
its Transfer-Encoding. A proxy in front that framed it by Content-Length
sees a different end of the body, and the bytes between the two ends would be
read here as the next request on the connection (request smuggling). The RFC
lets a server process such a request by Transfer-Encoding, but it must close
the connection after responding: the answer carries `Connection: close`, and
h11 then ends the connection instead of reading past the body.
"""

from __future__ import annotations

from typing import Any

from collector.http.asgi import Receive, Scope, Send, closing_connection


def framed_twice(scope: Scope) -> bool:
    names = [name for name, _ in scope["headers"]]
    return b"transfer-encoding" in names and b"content-length" in names


class CloseAmbiguouslyFramed:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and framed_twice(scope):
            send = closing_connection(send)
        await self.app(scope, receive, send)
