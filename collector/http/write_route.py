"""The shell every raw-ASGI write route shares: preflight, refusals, metrics, access log.

A route supplies only its work, `(services, request, receive, headers, seen)
-> (status, body)`, which raises ServiceError (or a storage error) to refuse.
Every refusal is rendered here by one mapping, so /v1/events, /v1/edge/pageview,
/v1/consent, /v1/replay and the one read on this path, GET /v1/signals/:visitorId,
answer alike: the spec's error body, never a traceback, and 503
storage_unavailable with Retry-After when storage fails.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

import msgspec
import trio

from collector.access.domains import gate
from collector.access.gate import resolve_key
from collector.access.hostnames import utf8_header
from collector.access.tenants import KeyRecord, Site
from collector.errors import RawErrorBody, ServiceError, render_error
from collector.http.access_log import log_request, record_request
from collector.http.asgi import (
    BodyTracker,
    ClientGone,
    Receive,
    Request,
    Scope,
    Send,
    read_body,
    send_response,
)
from collector.http.headers import cors_headers, preflight_headers
from collector.http.off_loop import run_pure
from collector.ingest.body import decompress_body, is_gzip, refuse_unsupported_encoding
from collector.ingest.payment import text_has_card
from collector.limits.buckets import rate_headers, refusal
from collector.limits.rates import bucket_id, ingest_scope, scope_rate
from collector.services import Services
from storage.errors import StorageError, WriterBusy
from storage.throttled_log import ThrottledLog

log = logging.getLogger("collector.http")
_storage_unavailable = ThrottledLog(log, logging.WARNING)  # every request fails alike until storage recovers
_encoder = msgspec.json.Encoder()

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


class Seen:
    """What the handler learned about the caller, for the access log."""

    __slots__ = ("client_id",)

    def __init__(self) -> None:
        self.client_id: str | None = None


Work = Callable[
    [Services, Request, Receive, list[tuple[str, str]], Seen], Awaitable[tuple[int, bytes]]
]


def preflight_gate(services: Services, request: Request) -> None:
    """A preflight carries no X-API-Key; when the URL names a key, apply its domain gate.

    Without a key the preflight is answered for any origin: the request that
    follows is gated by its key, and the collector never uses cookies.
    """
    query_key = request.query.get("key")
    if not query_key:
        return
    record = services.keys.lookup(query_key)
    if record is not None:
        gate(record, request.headers.get("origin"), request.headers.get("referer"))


def refuse_payment_headers(services: Services, request: Request) -> None:
    """Spec 4.1 rule 5 covers the whole request, not only its body.

    The Idempotency-Key becomes stored event ids; the Referer and the query
    string are where a checkout page's URL puts a card number (a beacon's
    `?key=` itself excepted: a key is random text). The authentication headers
    are left alone: a signature's hex or a key may hold a Luhn-valid digit run.
    (X-Request-ID is stored nowhere; the access log writes a card-bearing one redacted.)
    """
    where = None
    value = request.headers.get("idempotency-key")
    if value and text_has_card(utf8_header(value)):  # read as it will be stored
        where = "the Idempotency-Key header"
    elif (referer := request.headers.get("referer")) and text_has_card(utf8_header(referer)):
        where = "the Referer header"
    elif request.scope.get("query_string") and _query_has_card(request):
        where = "the query string"
    if where is not None:
        error = ServiceError(
            "prohibited_payment_data",
            f"payment-instrument material is not accepted ({where} holds a payment card number);"
            " nothing was stored",
        )
        # Refused before the gate, but a known key's response still carries its
        # rate headers (spec 8.2: on every authenticated response; no token is taken).
        with contextlib.suppress(ServiceError):  # (no key, or an unknown one: no headers)
            error.key_record, _ = resolve_key(services.keys, request.headers.get("x-api-key"), request.query.get("key"))
        raise error


def _query_has_card(request: Request) -> bool:
    """Every parameter, a repeated one's every value included, but the key the gate uses."""
    used_key = request.query.get("key")
    pairs = parse_qsl(request.scope["query_string"].decode("latin-1"), keep_blank_values=True)
    return any(
        text_has_card(text)
        for name, value in pairs
        for text in ((name,) if name == "key" and value == used_key else (name, value))
    )


SIGNALS_ROUTE = "/v1/signals/:visitorId"  # signals.ROUTE (that module imports this one)
RAW_BODY_LIMIT = 10 * 1024 * 1024  # spec 8.1
GZIP_BODY_LIMIT = 1 * 1024 * 1024  # compressed bytes; inflating is capped in decompress_body


def spend_request_token(
    services: Services, record: KeyRecord, site: Site | None, scope: str, headers: list[tuple[str, str]]
) -> None:
    """Take one request from the caller's bucket (spec 8.2); rate_limit_exceeded when empty.

    Runs before the body is read, so a refused flood costs almost nothing.
    `site` (the matched property) decides only the signals-read rate; None
    when the site is not bound yet.
    """
    decision = services.limiter.check(*_bucket(services, record, site, scope))
    headers.extend(rate_headers(decision, scope))
    if not decision.allowed:
        raise refusal(decision, scope)


def peek_rate_headers(services: Services, record: KeyRecord, route: str) -> list[tuple[str, str]]:
    """The caller's rate headers for a refusal before its bucket (spec 8.2: every authenticated
    response carries them); nothing is taken from the bucket."""
    scope = "signals-read" if route == SIGNALS_ROUTE else ingest_scope(record)
    # the site is not bound yet: the key's plan decides the rate
    return rate_headers(services.limiter.peek(*_bucket(services, record, None, scope)), scope)


def _bucket(services: Services, record: KeyRecord, site: Site | None, scope: str) -> tuple[str, float, float]:
    """The caller's bucket id, its rate and the time, as RateLimiter.check and peek take them."""
    plan = record.site_plan(site) if site is not None else record.normalized_plan
    return bucket_id(record.clientId, record.key_type.value, scope), scope_rate(record, scope, plan), services.clock()


async def read_capped_body(request: Request, receive: Receive) -> bytes:
    """The body as sent, refused with payload_too_large past its cap."""
    # the same reading of the header as decompress_body's; any other coding is refused unread
    encoding = request.headers.get("content-encoding")
    refuse_unsupported_encoding(encoding)
    return await read_body(request, receive, GZIP_BODY_LIMIT if is_gzip(encoding) else RAW_BODY_LIMIT)


# What a compressed body is taken to inflate to when deciding where to inflate it:
# JSON often compresses 10 to 30 times, and a bomb far more (1 MB may give 10 MB).
INFLATE_RATIO = 32


async def inflated_body(request: Request, raw: bytes) -> bytes:
    """The body, inflated (off the event loop when it may inflate to a large one:
    16 clients sending 11 KB bombs took /healthz from 1 ms to 250 ms)."""
    encoding, content_type = request.headers.get("content-encoding"), request.headers.get("content-type")
    estimate = len(raw) * INFLATE_RATIO if encoding else 0  # (a plain body has nothing to inflate)
    return await run_pure(estimate, decompress_body, raw, encoding, content_type)


def make_write_handler(
    services: Services,
    route: str,
    work: Work,
    *,
    retry_hint: str,
    method: str = "POST",
    route_check: Callable[[Request], object] | None = None,
) -> Handler:
    """An ASGI handler for `route`; `retry_hint` ends the storage_unavailable message.

    `method` is the one method the route serves besides the CORS preflight
    (GET for the signals read, which shares this shell's gates and refusals).
    `route_check`, for a route with a path parameter, refuses a path that is
    another route (404, 426) before the method is looked at.
    """
    access_log = services.settings.access_log

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request = Request(scope)
        origin = request.headers.get("origin")
        headers = [("X-Request-ID", request.request_id), *cors_headers(origin)]
        seen = Seen()
        error_code: str | None = None
        body = BodyTracker(receive)
        gating_preflight = False
        try:
            if route_check is not None:
                route_check(request)  # a path of another route: 404/426 with CORS, preflight or not
            if request.method == "OPTIONS":
                gating_preflight = True
                preflight_gate(services, request)
                await send_response(
                    send, 204, b"", [("X-Request-ID", request.request_id), *preflight_headers(origin)]
                )
                record_request(services, request, route, 204, None, None, started)
                return
            if request.method != method:
                raise ServiceError(
                    "method_not_allowed", f"{route} accepts {method} only", headers={"Allow": f"{method}, OPTIONS"}
                )
            if method == "POST":
                refuse_payment_headers(services, request)
            status, answer = await work(services, request, body.receive, headers, seen)
        except ServiceError as error:
            status, answer, error_code = error.status, render_error(error), error.code
            if gating_preflight:  # a refused preflight allows nothing cross-origin
                headers = [("X-Request-ID", request.request_id)]
            elif error.key_record is not None:
                headers.extend(peek_rate_headers(services, error.key_record, route))
            headers.extend(error.response_headers().items())
        except RawErrorBody as raw:
            status, answer, error_code = raw.status, _encoder.encode(raw.body), "content_type"
        except ClientGone as gone:
            record_request(services, request, route, *gone.answered, seen.client_id, started)
            return
        except (WriterBusy, StorageError) as exc:
            # The access line says 503 storage_unavailable; this says why.
            _storage_unavailable("storage unavailable on %s: %s", route, exc, cause=f"{route} {exc}")
            unavailable = ServiceError("storage_unavailable", f"nothing was stored ({exc.for_client}); {retry_hint}")
            status, answer, error_code = unavailable.status, render_error(unavailable), unavailable.code
            headers.extend(unavailable.response_headers().items())
        except trio.Cancelled:
            # The connection ended under the request (its task group cancelled): no
            # answer goes out, but it was a request, counted and logged (helper-99: a
            # batch stored this way had no line at all): its client gone (499), or the
            # server stopping at the drain's deadline (503, helper-102).
            stopping = services.drain_deadline is not None and trio.current_time() >= services.drain_deadline
            status, code = (503, "service_unavailable") if stopping else (499, "client_closed")
            record_request(services, request, route, status, code, seen.client_id, started)
            raise
        except Exception:
            log.exception("unexpected error on %s", route)
            internal = ServiceError("internal_error", "the request failed unexpectedly; retry it")
            status, answer, error_code = 500, render_error(internal), internal.code
        if status >= 400 and not await body.finish(request):
            headers.append(("Connection", "close"))
        if (left := body.gone(request)) is not None:
            # A refusal made before the body was read, whose client then left or whose
            # body framing broke: the parser's answer (or none) is what it got, and what
            # is logged (helper-104: the refusal's own status was).
            record_request(services, request, route, *left.answered, seen.client_id, started)
            return
        services.metrics.count_request(route, status)
        try:
            await send_response(send, status, answer, headers)
        finally:  # (an answer cut off while sent is still a request answered: helper-93)
            if access_log:
                log_request(request, route, status, error_code, seen.client_id, started)

    return handle

