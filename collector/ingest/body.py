"""Request body decoding: Content-Encoding with a streaming decompression cap (spec 8.1)."""

from __future__ import annotations

import zlib

from collector.errors import RawErrorBody, ServiceError

MAX_INFLATED = 10 * 1024 * 1024
_CHUNK = 64 * 1024  # output per inflate call: the 10 MB cap is checked between calls
_INPUT_PIECE = 64 * 1024  # input per inflate call
MAX_GZIP_MEMBERS = 1024


def is_gzip(content_encoding: str | None) -> bool:
    """Content-Encoding gzip, or x-gzip, which RFC 9110 8.4.1.3 says to read as gzip."""
    return (content_encoding or "").strip().lower() in ("gzip", "x-gzip")


def refuse_unsupported_encoding(content_encoding: str | None) -> None:
    """validation_error for a Content-Encoding other than none, identity or one gzip layer.

    Checked before the body is read too: a 10 MB body in `br` was read whole to be refused.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity") or is_gzip(encoding):
        return
    if all(is_gzip(layer) for layer in encoding.split(",")):
        raise ServiceError("validation_error", f"Content-Encoding {encoding!r}: send one gzip layer, not several")
    raise ServiceError("validation_error", f"unsupported Content-Encoding {encoding!r}; use gzip")


def decompress_body(raw: bytes, content_encoding: str | None, content_type: str | None) -> bytes:
    """The JSON bytes of a request body.

    gzip needs a JSON Content-Type and is refused before decompression
    otherwise (spec 7.2); it is inflated in chunks and aborted as soon as the
    output would pass 10 MB, so a gzip bomb never occupies more than that.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    refuse_unsupported_encoding(encoding)
    if "application/json" not in (content_type or "").lower():
        raise RawErrorBody(400, {"error": "Content-Type must be application/json"})
    parts: list[bytes] = []
    size = 0
    view, pos, members = memoryview(raw), 0, 0
    try:
        # RFC 1952: a gzip body may hold several members (pigz, streaming
        # compressors); they inflate to the concatenation of their contents.
        # The input goes in bounded pieces of a view: zlib copies what follows
        # a member's end into unused_data, and handing it the whole rest made
        # a body of many tiny members cost the square of its size (1 MB of
        # empty members took 1.3 s); the members are capped for the same reason.
        while pos < len(raw):
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise ServiceError("invalid_json", f"gzip body has more than {MAX_GZIP_MEMBERS} members")
            inflater = zlib.decompressobj(wbits=31)
            while not inflater.eof:
                if pos >= len(raw):
                    raise ServiceError("invalid_json", "gzip body is truncated")
                piece = view[pos : pos + _INPUT_PIECE]
                chunk = inflater.decompress(piece, _CHUNK)
                size += len(chunk)
                if size > MAX_INFLATED:
                    raise _too_large()
                parts.append(chunk)
                # (at a member's end unused_data holds the rest of the piece;
                # unconsumed_tail may still hold a stale copy of it)
                left = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                pos += len(piece) - len(left)
            if pos < len(raw) and raw[pos : pos + 2] != _GZIP_MAGIC:
                raise ServiceError("invalid_json", "gzip body has trailing bytes")
    except zlib.error as exc:
        raise ServiceError("invalid_json", f"body is not valid gzip: {exc}") from None
    return b"".join(parts)


_GZIP_MAGIC = b"\x1f\x8b"


def _too_large() -> ServiceError:
    return ServiceError("payload_too_large", "decompressed body is over the 10 MB limit")
