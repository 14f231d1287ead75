"""Lone surrogate escapes (a JavaScript string cut inside an emoji) read as U+FFFD."""

from __future__ import annotations

import json

import msgspec
import pytest

from collector.ingest.surrogates import without_lone_surrogates


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("ab\ud83d", "ab\ufffd"),  # a title cut after the high half of 😀
        ("\ude00x", "\ufffdx"),  # the low half alone
        ("\ud83d\ude00\ud83d", "😀\ufffd"),  # a whole pair kept, the lone half replaced
        ("\\ud83d", "\\ud83d"),  # an escaped backslash and text: no surrogate
        ("\\\ud83d", "\\\ufffd"),  # an escaped backslash, then a lone surrogate
    ],
)
def test_lone_surrogates_read_as_the_replacement_character(text: str, read: str) -> None:
    body = json.dumps({"t": text}).encode()  # (json.dumps escapes lone surrogates, as JSON.stringify does)
    assert msgspec.json.decode(without_lone_surrogates(body)) == {"t": read}


def test_a_body_without_them_is_returned_as_it_is() -> None:
    for body in (b'{"t": "plain"}', json.dumps({"t": "😀 \\ud83d"}).encode(), b'{"t": "\\ud83d\\ude00"}'):
        assert without_lone_surrogates(body) is body
