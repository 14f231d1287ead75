"""Stream tokens (spec 5.4): short-lived credentials for the tenant-wide WebSocket feeds.

Format: `csst_` + base64url(JSON claims) + `.` + base64url(HMAC-SHA256 of the
claims, first 16 bytes), keyed with the data directory's stream-token secret
(`storage/stream_secret.py`). Nothing is stored per token: the claims carry
the tenant, a fingerprint of the key that minted it (never the key itself: a
token travels in a browser's Sec-WebSocket-Protocol header) and the expiry.
Every character is one an HTTP token (a WebSocket subprotocol) may hold.

The spec mints them from a dashboard session only; `collector stream-token
mint` stands in for that session (operator contract).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

import msgspec

PREFIX = "csst_"
DEFAULT_TTL_S = 300
MAX_TTL_S = 86_400
CLOCK_STEP_S = 300  # a token whose expiry is further off than MAX_TTL_S plus this is refused


class StreamClaims(msgspec.Struct, frozen=True):
    clientId: str
    keyFingerprint: str  # key_fingerprint() of the key behind the token
    expiresAt: int  # unix seconds


class StreamTokenRefused(Exception):
    """The token cannot be used; `reason` goes into the 401 stream_token_required body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(StreamClaims)


def key_fingerprint(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    # Strict: urlsafe_b64decode skips characters outside the alphabet, which
    # would let one token be spelt many ways.
    standard = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
    return base64.b64decode(standard, validate=True)


def _mac(secret: bytes, claims: bytes) -> bytes:
    return hmac.new(secret, claims, hashlib.sha256).digest()[:16]


def mint(secret: bytes, *, client_id: str, api_key: str, now_s: int, ttl_s: int = DEFAULT_TTL_S) -> str:
    if not 1 <= ttl_s <= MAX_TTL_S:
        raise ValueError(f"the ttl must be 1 to {MAX_TTL_S} seconds, got {ttl_s}")
    claims = _encoder.encode(StreamClaims(client_id, key_fingerprint(api_key), now_s + ttl_s))
    return f"{PREFIX}{_b64(claims)}.{_b64(_mac(secret, claims))}"


def verify(secret: bytes, token: str | None, *, now_s: int) -> StreamClaims:
    """The token's claims; StreamTokenRefused (with a reason) when it is missing, forged or expired."""
    if not token:
        raise StreamTokenRefused("missing")
    if not token.startswith(PREFIX) or token.count(".") != 1:
        raise StreamTokenRefused("malformed")
    body, _, mac = token[len(PREFIX):].partition(".")
    try:
        claims_raw, given = _unb64(body), _unb64(mac)
    except (ValueError, TypeError, binascii.Error):
        raise StreamTokenRefused("malformed") from None
    if _b64(claims_raw) != body or _b64(given) != mac:  # one spelling per token
        raise StreamTokenRefused("malformed")
    if not hmac.compare_digest(given, _mac(secret, claims_raw)):
        raise StreamTokenRefused("invalid")
    try:
        claims = _decoder.decode(claims_raw)
    except msgspec.DecodeError:
        raise StreamTokenRefused("malformed") from None
    if claims.expiresAt <= now_s:
        raise StreamTokenRefused("expired")
    if claims.expiresAt > now_s + MAX_TTL_S + CLOCK_STEP_S:
        # minted while the clock ran far ahead (helper-108: a token minted a year fast
        # was good for a year): no token lives longer than MAX_TTL_S from now
        raise StreamTokenRefused("expired")
    return claims
