"""The one error table: every error code of the spec, its HTTP status and retry hint.

Handlers never build error bodies by hand; they raise `ServiceError(code, message,
**extra)` and the HTTP layer renders it with `render_error`. A code missing from
this table is a programming error, caught at raise time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from collector.access.tenants import KeyRecord


@dataclass(frozen=True, slots=True)
class ErrorKind:
    status: int
    retryable: bool
    retry_after: int | None = None


ERRORS: dict[str, ErrorKind] = {
    # 7.1 authentication and access
    "missing_api_key": ErrorKind(401, False),
    "invalid_api_key": ErrorKind(401, False),
    "server_signature_required": ErrorKind(401, False),
    "server_signature_expired": ErrorKind(401, False),
    "invalid_server_signature": ErrorKind(401, False),
    "stream_token_required": ErrorKind(401, False),
    "account_suspended": ErrorKind(403, False),
    "insufficient_permission": ErrorKind(403, False),
    "origin_required": ErrorKind(403, False),
    "domain_not_allowed": ErrorKind(403, False),
    "site_scope_ambiguous": ErrorKind(403, False),
    "live_read_forbidden": ErrorKind(403, False),
    "plan_upgrade_required": ErrorKind(403, False),
    "upgrade_required": ErrorKind(426, False),
    "rate_limit_exceeded": ErrorKind(429, True),
    "service_unavailable": ErrorKind(503, True, retry_after=5),
    # 7.2 ingestion and usage
    "validation_error": ErrorKind(400, False),
    "invalid_json": ErrorKind(400, False),
    "idempotency_required": ErrorKind(400, False),
    "invalid_idempotency_key": ErrorKind(400, False),
    "prohibited_payment_data": ErrorKind(400, False),
    "prohibited_or_unsafe_event": ErrorKind(400, False),
    "session_id_required": ErrorKind(400, False),
    "signals_coverage_limit_reached": ErrorKind(402, False),
    "idempotency_conflict": ErrorKind(409, False),
    "payload_too_large": ErrorKind(413, False),
    "batch_too_large": ErrorKind(413, False),
    "usage_limit_exceeded": ErrorKind(429, False, retry_after=3600),
    "accepted_event_safety_ceiling_reached": ErrorKind(429, False, retry_after=3600),
    "usage_metering_unavailable": ErrorKind(503, True, retry_after=5),
    "storage_unavailable": ErrorKind(503, True, retry_after=1),
    "projection_pending": ErrorKind(503, True, retry_after=1),
    "usage_projection_pending": ErrorKind(503, True, retry_after=1),
    # not in the spec's tables, but needed to answer every request cleanly
    "not_found": ErrorKind(404, False),
    "method_not_allowed": ErrorKind(405, False),
    "key_type_not_allowed": ErrorKind(403, False),  # POST /v1/replay takes website keys only
    # the HTTP parser's own refusals (collector/http/parse_errors.py)
    "bad_request": ErrorKind(400, False),
    "request_head_too_large": ErrorKind(431, False),
    "unsupported_transfer_encoding": ErrorKind(501, False),
    "internal_error": ErrorKind(500, True),
}


# The challenges of 401 answers (RFC 9110 11.6.1): how to authenticate what was refused.
# Spec 5.1 passes a key in X-API-Key (or `?key=` for website keys), 5.2 signs server-key
# writes, 5.4 carries stream tokens in Sec-WebSocket-Protocol; none names a scheme, so
# these are the service's own.
KEY_CHALLENGE = 'ApiKey realm="events", header="X-API-Key"'
SIGNATURE_CHALLENGE = 'Service-HMAC realm="events", version=v1'
CHALLENGES = {
    "server_signature_required": SIGNATURE_CHALLENGE,
    "server_signature_expired": SIGNATURE_CHALLENGE,
    "invalid_server_signature": SIGNATURE_CHALLENGE,
    "stream_token_required": 'StreamToken realm="streams", protocol="service-v1"',
}


class ServiceError(Exception):
    """A request refused with one of the spec's error codes.

    `extra` becomes additional top-level fields of the error body (for example
    `retryAfter`, `reason`, `details`); `headers` are added to the response.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: object,
    ) -> None:
        if code not in ERRORS:
            raise KeyError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
        self.headers = headers or {}
        # Set when the refusal came after the key was authenticated (access.gate):
        # the response then carries that key's rate headers (spec 8.2).
        self.key_record: KeyRecord | None = None

    @property
    def status(self) -> int:
        return ERRORS[self.code].status

    def response_headers(self) -> dict[str, str]:
        kind = ERRORS[self.code]
        headers = {}
        if kind.retry_after is not None:
            headers["Retry-After"] = str(kind.retry_after)
        headers.update(self.own_headers())
        return headers

    def own_headers(self) -> dict[str, str]:
        """`headers`, with a 401's challenge (RFC 9110 15.5.2: every 401 carries one)."""
        if self.status != 401:
            return self.headers
        return {"WWW-Authenticate": CHALLENGES.get(self.code, KEY_CHALLENGE), **self.headers}


class RawErrorBody(Exception):
    """A refusal whose body the spec fixes verbatim and which uses no error code.

    Spec 7.2: gzip without a JSON Content-Type answers 400 with a body that has
    only `error: "Content-Type must be application/json"`.
    """

    def __init__(self, status: int, body: dict[str, object]) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body


_encoder = msgspec.json.Encoder()


def render_error(error: ServiceError) -> bytes:
    body: dict[str, object] = {"error": error.code, "message": error.message}
    body.update(error.extra)
    return _encoder.encode(body)
