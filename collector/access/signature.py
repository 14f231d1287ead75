"""Server-key event signing, v1 (spec 5.2), to the byte.

Signed input: b"v1\\n" + unix seconds + b"\\nPOST\\n" + the route's path + b"\\n" +
trimmed Idempotency-Key (empty if absent) + b"\\n" + the exact wire body
(compressed bytes for gzip). MAC: HMAC-SHA256 keyed with the server API key.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from collector.errors import ServiceError

WINDOW_S = 300
_SIGNATURE = re.compile(r"v1=[0-9a-f]{64}")
def signed_input(
    timestamp: str, idempotency_key: str | bytes | None, body: bytes, path: str = "/v1/events"
) -> bytes:
    """Spec 5.2's signed bytes. A key given as bytes is the header as sent (not UTF-8 text).

    "Trimmed" as HTTP trims a field value: spaces and tabs (OWS). Other Unicode
    spaces (a no-break space, U+3000) are part of the key, which SDKs in other
    languages would otherwise trim differently (helper-73).
    """
    if isinstance(idempotency_key, bytes):
        key = idempotency_key.strip(b" \t")
    else:
        key = (idempotency_key or "").strip(" \t").encode()
    return b"\n".join((b"v1", timestamp.encode(), b"POST", path.encode(), key, body))


def sign(
    api_key: str, timestamp: str, idempotency_key: str | bytes | None, body: bytes, path: str = "/v1/events"
) -> str:
    mac = hmac.new(api_key.encode(), signed_input(timestamp, idempotency_key, body, path), hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_server_signature(
    *,
    api_key: str | None,
    timestamp: str | None,
    signature: str | None,
    idempotency_key: str | bytes | None,
    body: bytes,
    now_s: float,
    path: str = "/v1/events",
) -> None:
    """Raises ServiceError (401) unless the request is signed correctly and recently.

    The signed path is the request's route, or the text "/v1/events" that spec
    5.2 spells for every server-key write (it defines signing for that route
    only, so an SDK may sign /v1/consent and /v1/edge/pageview that way too).
    """
    if not api_key or not timestamp or not signature:
        raise ServiceError(
            "server_signature_required",
            "server-key event writes need X-API-Key, X-CS-Timestamp and X-CS-Signature",
        )
    ts = timestamp.strip()
    if not ts.isascii() or not ts.isdigit():
        raise ServiceError("invalid_server_signature", "X-CS-Timestamp must be unix seconds")
    # Unix seconds have ten digits until 2286; a longer number is far outside the
    # window (and converting thousands of digits would itself fail). Leading zeros
    # are no digits of it: "000" and the time was refused as five minutes off (helper-127).
    # (The signature covers the header as sent, zeros included.)
    digits = ts.lstrip("0") or "0"
    if len(digits) > 12 or abs(now_s - int(digits)) > WINDOW_S:
        # (milliseconds, as event timestamps are, would never pass however fresh: say so)
        in_ms = len(digits) <= 16 and abs(now_s - int(digits) / 1000) <= WINDOW_S
        raise ServiceError(
            "server_signature_expired",
            "X-CS-Timestamp is unix seconds, and this one reads as milliseconds; sign with the time in seconds"
            if in_ms
            else "X-CS-Timestamp is more than five minutes from the collector clock; re-sign with the current time",
        )
    if not _SIGNATURE.fullmatch(signature.strip()):
        raise ServiceError("invalid_server_signature", "X-CS-Signature must be v1=<64 lowercase hex>")
    given = signature.strip()
    if not any(
        hmac.compare_digest(sign(api_key, ts, idempotency_key, body, signed_path), given)
        for signed_path in dict.fromkeys((path, "/v1/events"))
    ):
        raise ServiceError("invalid_server_signature", "X-CS-Signature does not match the request")
