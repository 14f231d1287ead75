"""Lone UTF-16 surrogates written as JSON escapes, read as U+FFFD. Pure.

JavaScript strings are UTF-16: an SDK that cuts a title or a click's text at a
length limit can split an emoji's surrogate pair, and JSON.stringify then
writes the half it kept as an escape (`"\\ud83d"`, well-formed JSON text since
ES2019). No Unicode string holds it, so msgspec refused the whole body
("Input data was truncated"): one cut emoji lost a batch of 25 events. Such an
escape is read as U+FFFD, the replacement character, as a lenient UTF-8
decoder reads a broken sequence. Only bodies that fail to decode are looked at.
"""

from __future__ import annotations

import re

# Every escape, one at a time (so `\\\\ud83d`, an escaped backslash and text, is no
# surrogate): a high surrogate with its low one, a lone surrogate, or another escape.
_ESCAPE = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(u[dD][89a-fA-F][0-9a-fA-F]{2})"
    rb"|[^u]|u[0-9a-fA-F]{4})",
    re.DOTALL,
)
_REPLACEMENT = rb"\ufffd"


def _replace(match: re.Match[bytes]) -> bytes:
    return _REPLACEMENT if match.group(1) is not None else match.group(0)


def without_lone_surrogates(body: bytes) -> bytes:
    """`body` with each lone surrogate escape replaced by `\\ufffd`; `body` itself when it has none."""
    if b"\\ud" not in body and b"\\uD" not in body:
        return body
    repaired = _ESCAPE.sub(_replace, body)
    return body if repaired == body else repaired
