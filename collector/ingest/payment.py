"""Payment-instrument detection over a whole request (spec 4.1 rule 5).

A request is refused whole when any string anywhere in it holds a card
number, or an object key names a card-number, CVV or expiry field with a
non-empty value. A card number is 12-19 digits, optionally grouped by single
spaces or dashes, not part of a longer alphanumeric token, that passes Luhn
AND starts with an issuer prefix (IIN) valid for that length. The IIN check
is what keeps millisecond timestamps (they start with 17), phone numbers and
order ids from matching: Luhn alone passes one random number in ten.

Cost: one precompiled regex over the raw body finds candidates; only when a
candidate passes Luhn and IIN is the decoded body walked to confirm it sits
in a string (a JSON number is not payment material). The common request pays
for two C-level regex scans and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# (prefix low, prefix high, lengths): prefixes compared on the leading digits.
_IIN_TABLE: tuple[tuple[int, int, frozenset[int]], ...] = (
    (4, 4, frozenset({13, 16, 19})),  # Visa
    (51, 55, frozenset({16})),  # Mastercard
    (2221, 2720, frozenset({16})),  # Mastercard 2-series
    (34, 34, frozenset({15})),  # Amex
    (37, 37, frozenset({15})),  # Amex
    (6011, 6011, frozenset(range(16, 20))),  # Discover
    (644, 649, frozenset(range(16, 20))),  # Discover
    (65, 65, frozenset(range(16, 20))),  # Discover
    (3528, 3589, frozenset(range(16, 20))),  # JCB
    (300, 305, frozenset(range(14, 17))),  # Diners
    (36, 36, frozenset(range(14, 17))),  # Diners
    (38, 38, frozenset(range(14, 17))),  # Diners
    (62, 62, frozenset(range(16, 20))),  # UnionPay
    (50, 50, frozenset(range(12, 20))),  # Maestro
    (56, 69, frozenset(range(12, 20))),  # Maestro
)

_CANDIDATE = re.compile(rb"(?<![0-9A-Za-z_.-])\d(?:[ -]?\d){11,18}(?![0-9A-Za-z_])")
_CANDIDATE_TEXT = re.compile(r"(?<![0-9A-Za-z_.-])\d(?:[ -]?\d){11,18}(?![0-9A-Za-z_])")
_SEPARATORS = re.compile(r"[\s_\-.]")
_CARD_FIELD_NAMES = frozenset(
    {
        "cardnumber", "ccnumber", "ccnum", "cardnum", "creditcard", "creditcardnumber",
        "debitcard", "pan", "cvv", "cvv2", "cvc", "cvc2", "csc", "cid", "cardcvc", "cardcvv",
        "cccsc", "cccvv", "securitycode", "cardsecuritycode", "ccexp", "cardexpiry",
        "cardexpiration", "expdate", "expirydate", "expirationdate", "ccexpmonth", "ccexpyear",
        "cardexpmonth", "cardexpyear",
    }
)  # fmt: skip
# A cheap pre-filter over the lower-cased body: every card field name starts
# (after separators) with one of these, right after a JSON quote. One regex
# anchored on the quote is ~3x cheaper than a dozen substring scans.
_KEY_HINT = re.compile(rb'"[-_ .]*(?:card|cc|credit|debit|pan|cv[vc]|csc|cid|security|exp)')


# Digits, spaces and dashes become "0", everything else "x": runs of twelve
# "0"s are then found by a trivial regex at C speed, and the (slower) card
# regex only runs on the few short regions around such runs.
_RUN_TABLE = bytes(48 if chr(b) in "0123456789 -" else 120 for b in range(256))
_RUNS = re.compile(rb"0{12,}")


def _raw_candidates(raw: bytes) -> Iterator[str]:
    mapped = raw.translate(_RUN_TABLE)
    for run in _RUNS.finditer(mapped):
        region = raw[max(0, run.start() - 1) : run.end() + 1]
        for match in _CANDIDATE.finditer(region):
            yield match.group().decode()


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def has_card_iin(digits: str) -> bool:
    length = len(digits)
    for low, high, lengths in _IIN_TABLE:
        if length not in lengths:
            continue
        prefix = int(digits[: len(str(low))])
        if low <= prefix <= high:
            return True
    return False


def looks_like_card(candidate: str) -> bool:
    digits = candidate.replace(" ", "").replace("-", "")
    if digits[0] not in "23456":  # no issuer starts with 0, 1, 7, 8 or 9 (timestamps do)
        return False
    return 12 <= len(digits) <= 19 and has_card_iin(digits) and luhn_valid(digits)


def is_card_field_name(name: str) -> bool:
    return _SEPARATORS.sub("", name).lower() in _CARD_FIELD_NAMES


def text_has_card(text: str) -> bool:
    return any(looks_like_card(m.group()) for m in _CANDIDATE_TEXT.finditer(text))


def _walk(value: Any) -> Iterator[tuple[str | None, Any]]:
    stack: list[tuple[str | None, Any]] = [(None, value)]
    while stack:
        key, item = stack.pop()
        yield key, item
        if isinstance(item, dict):
            stack.extend(item.items())
        elif isinstance(item, list):
            stack.extend((None, element) for element in item)


def _has_value(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, int | float) and not isinstance(value, bool)


def find_payment_data(raw: bytes, decoded: Any) -> str | None:
    """What payment material the request carries, or None. `decoded` is the parsed body."""
    card_candidate = any(looks_like_card(c) for c in _raw_candidates(raw))
    key_candidate = _KEY_HINT.search(raw.lower()) is not None
    if not card_candidate and not key_candidate:
        return None
    for key, value in _walk(decoded):
        if key_candidate and key is not None and is_card_field_name(key) and _has_value(value):
            return f"a field named {key!r} carries a value"
        if card_candidate and isinstance(value, str) and text_has_card(value):
            return "a string holds a payment card number"
        if card_candidate and key is not None and text_has_card(key):
            return "an object key holds a payment card number"
    return None
