"""The payment detector's cheap pre-filters never miss what the full walk finds."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.ingest.payment import (
    _has_value,
    _walk,
    find_payment_data,
    is_card_field_name,
    text_has_card,
)


def full_walk(decoded: Any) -> bool:
    """The detector without pre-filters: every key and string of the body."""
    for key, value in _walk(decoded):
        if key is not None and is_card_field_name(key) and _has_value(value):
            return True
        if isinstance(value, str) and text_has_card(value):
            return True
        if key is not None and text_has_card(key):
            return True
    return False


def encodings(value: object) -> list[bytes]:
    return [
        json.dumps(value).encode(),  # \uXXXX for every non-ASCII character
        json.dumps(value, ensure_ascii=False).encode(),
        msgspec.json.encode(value),
    ]


CARD_PARTS = st.sampled_from(
    ["4111", "1111", " ", "-", "\n", "\t", "\u00a0", "\"", "5555555555554444", "378282246310005",
     "4111 1111 1111 1111", "a", "_", ".", "1795000000000", "0", "9", "\u0663", "card", "CVV", "cc-exp",
     "Card_Number", "\u2003", "x"]
)  # fmt: skip
TEXTS = st.one_of(st.text(max_size=40), st.lists(CARD_PARTS, max_size=10).map("".join))


@settings(max_examples=400, deadline=None)
@given(TEXTS, TEXTS)
def test_prefilters_agree_with_the_full_walk(text: str, key: str) -> None:
    for body in ({"label": text}, {"events": [{key: text}, {"k": [key]}]}, {key: {"v": 1}}):
        for raw in encodings(body):
            decoded = msgspec.json.decode(raw)
            assert (find_payment_data(raw, decoded) is not None) == full_walk(decoded), raw


@pytest.mark.parametrize(
    "raw",
    [
        rb'{"label": "card:\n4111111111111111"}',
        rb'{"label": "\u0034111111111111111"}',
        rb'{"label": "\u0022 4111111111111111"}',
        rb'{"label": "4111\u00201111\u00201111\u00201111"}',
        rb'{"\u0063ard_number": "x"}',
        rb'{"\tcard_number": "x"}',
        rb'{"ca_rd_number": "x"}',
        '{"\u00a0cvv": "123"}'.encode(),
    ],
)
def test_escapes_do_not_hide_payment_data(raw: bytes) -> None:
    assert find_payment_data(raw, msgspec.json.decode(raw)) is not None
