"""Request body decoding: Content-Encoding with a streaming decompression cap (spec 8.1)."""

from __future__ import annotations

import zlib

from collector.errors import RawErrorBody, ServiceError

MAX_INFLATED = 10 * 1024 * 1024
_CHUNK = 64 * 1024


def decompress_body(raw: bytes, content_encoding: str | None, content_type: str | None) -> bytes:
    """The JSON bytes of a request body.

    gzip needs a JSON Content-Type and is refused before decompression
    otherwise (spec 7.2); it is inflated in chunks and aborted as soon as the
    output would pass 10 MB, so a gzip bomb never occupies more than that.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise ServiceError("validation_error", f"unsupported Content-Encoding {encoding!r}; use gzip")
    if "application/json" not in (content_type or "").lower():
        raise RawErrorBody(400, {"error": "Content-Type must be application/json"})
    parts: list[bytes] = []
    size = 0
    pending = raw
    try:
        # RFC 1952: a gzip body may hold several members (pigz, streaming
        # compressors); they inflate to the concatenation of their contents.
        while pending:
            inflater = zlib.decompressobj(wbits=31)
            while pending:
                chunk = inflater.decompress(pending, _CHUNK)
                size += len(chunk)
                if size > MAX_INFLATED:
                    raise _too_large()
                parts.append(chunk)
                pending = inflater.unconsumed_tail
                if inflater.eof:
                    break
            if not inflater.eof:
                raise ServiceError("invalid_json", "gzip body is truncated")
            pending = inflater.unused_data
            if pending and not pending.startswith(_GZIP_MAGIC):
                raise ServiceError("invalid_json", "gzip body has trailing bytes")
    except zlib.error as exc:
        raise ServiceError("invalid_json", f"body is not valid gzip: {exc}") from None
    return b"".join(parts)


_GZIP_MAGIC = b"\x1f\x8b"


def _too_large() -> ServiceError:
    return ServiceError("payload_too_large", "decompressed body is over the 10 MB limit")
