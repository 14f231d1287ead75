"""Digits and separators outside ASCII, read as the ASCII ones they stand for. Pure.

A card number typed with a Japanese or Chinese input method comes as
full-width digits (`４１１１…`), an Arabic or Persian keyboard gives its own
digits, and text copied from documents carries thin or narrow no-break spaces,
en dashes, minus signs and invisible joiners between the groups. The payment
scan (payment.py) and the text scrub (scrub.py) read ASCII; this module gives
them an ASCII reading of such text. Made once at import from the running
Python's Unicode tables (the Basic and Supplementary Multilingual Planes:
about 20 ms).
"""

from __future__ import annotations

import re
import unicodedata

_DIGITS: dict[int, str] = {}  # every decimal digit (category Nd) outside ASCII -> its ASCII digit
_SPACES: list[int] = []  # space separators (Zs) outside ASCII
_DASHES: list[int] = [0x2212]  # dash punctuation (Pd), and the minus sign
_INVISIBLE: list[int] = []  # format characters (Cf): zero-width spaces and joiners, soft hyphen, BOM
for _cp in range(0x80, 0x20000):
    _category = unicodedata.category(chr(_cp))
    if _category == "Nd":
        _DIGITS[_cp] = str(unicodedata.decimal(chr(_cp)))
    elif _category == "Zs":
        _SPACES.append(_cp)
    elif _category == "Pd":
        _DASHES.append(_cp)
    elif _category == "Cf":
        _INVISIBLE.append(_cp)

_SEPARATORS = {**dict.fromkeys(_SPACES, " "), **dict.fromkeys(_DASHES, "-")}
# Two readings of the invisible characters: gone ("4\u200b1\u200b1…" is one
# number) or a space ("4111\u200b1111…" is grouped as a card is).
_DROPPING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE)})
_SPACING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE, " ")})


def _char_class(code_points: list[int]) -> str:
    return "".join(re.escape(chr(cp)) for cp in code_points)


# One of the characters this module reads: text without any needs no other reading.
UNICODE_DIGITISH = re.compile(f"[{_char_class([*_DIGITS, *_SPACES, *_DASHES, *_INVISIBLE])}]")
# Twelve digits or more of any script (`\\d` is every Nd character), up to three
# separators of any kind between two of them: the shortest run payment.py looks at,
# loosely (a pre-filter: `\\s` is more than the spaces).
ANY_DIGIT_RUN = re.compile(f"\\d(?:[\\s+\\-{_char_class([*_DASHES, *_INVISIBLE])}]{{0,3}}\\d){{11}}")

# The UTF-8 bytes such a run can be made of, mapped to "0" (everything else "x"):
# ASCII digits and separators, continuation bytes, and the lead bytes of every
# character above (found from the tables, so a script's digits are never missed).
# Twelve "0"s in a row mark the only places ANY_DIGIT_RUN needs to look at.
_LEADS = {chr(cp).encode()[0] for cp in (*_DIGITS, *_SPACES, *_DASHES, *_INVISIBLE)}
RUN_BYTES = bytes(
    48 if chr(b) in "0123456789 +-" or 0x80 <= b <= 0xBF or b in _LEADS else 120 for b in range(256)
)


def ascii_digits(text: str) -> str:
    """`text` with every script's digits, spaces and dashes as ASCII ones, invisible characters left out."""
    return text.translate(_DROPPING_INVISIBLE)


def ascii_readings(text: str) -> tuple[str, ...]:
    """`text` as ASCII digits, spaces and dashes where it wrote them otherwise (both readings
    of its invisible characters); () when it holds none of them."""
    if text.isascii() or UNICODE_DIGITISH.search(text) is None:
        return ()
    dropped = text.translate(_DROPPING_INVISIBLE)
    spaced = text.translate(_SPACING_INVISIBLE)
    return (dropped,) if spaced == dropped else (dropped, spaced)
