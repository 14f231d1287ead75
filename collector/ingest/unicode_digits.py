"""Digits and separators outside ASCII, read as the ASCII ones they stand for. Pure.

A card number typed with a Japanese or Chinese input method comes as
full-width digits (`４１１１…`), an Arabic or Persian keyboard gives its own
digits, and text copied from documents carries thin or narrow no-break spaces,
en dashes, minus signs, line breaks and invisible joiners between the groups.
The payment scan (payment.py) and the text scrub (scrub.py) read ASCII; this
module gives them an ASCII reading of such text. Made once at import from the
running Python's Unicode tables (the Basic and Supplementary Multilingual
Planes and the tag characters: about 25 ms).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

_DIGITS: dict[int, str] = {}  # every decimal digit (category Nd) outside ASCII -> its ASCII digit
_SPACES: list[int] = []  # space separators (Zs) outside ASCII
_DASHES: list[int] = [0x2212]  # dash punctuation (Pd), and the minus sign
_INVISIBLE: list[int] = []  # format characters (Cf): zero-width spaces and joiners, soft hyphen, BOM, tags
for _cp in (*range(0x80, 0x20000), *range(0xE0000, 0xE1000)):
    _category = unicodedata.category(chr(_cp))
    if _category == "Nd":
        _DIGITS[_cp] = str(unicodedata.decimal(chr(_cp)))
    elif _category == "Zs":
        _SPACES.append(_cp)
    elif _category == "Pd":
        _DASHES.append(_cp)
    elif _category == "Cf":
        _INVISIBLE.append(_cp)

_LINE_BREAKS = dict.fromkeys(map(ord, "\t\n\r\v\f"), " ")
_SEPARATORS = {**dict.fromkeys(_SPACES, " "), **dict.fromkeys(_DASHES, "-"), **_LINE_BREAKS}
# Two readings of the invisible characters: gone ("4\u200b1\u200b1…" is one
# number) or a space ("4111\u200b1111…" is grouped as a card is).
_DROPPING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE)})
_SPACING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE, " ")})


def _char_class(code_points: list[int]) -> str:
    return "".join(re.escape(chr(cp)) for cp in code_points)


_INVISIBLE_CLASS = f"[{_char_class(_INVISIBLE)}]"
_HAS_INVISIBLE = re.compile(_INVISIBLE_CLASS)
# Between two digits of any script (`\d` is every Nd character): up to three separators
# (`\s` is every space and line break; dashes, `+`, a URL's `%20`), with invisible
# characters anywhere around them, as many as there are.
_BETWEEN = f"(?:{_INVISIBLE_CLASS}*(?:[\\s+\\-{_char_class(_DASHES)}]|%20)){{0,3}}{_INVISIBLE_CLASS}*"
_LOOSE_RUN = re.compile(f"\\d(?:{_BETWEEN}\\d)*")
_ANY_DIGIT = re.compile(r"\d")
# What an ASCII reader reads otherwise than a reading of it: the characters above, and
# tabs and line breaks (not separators to payment.py). Found by a class of the ones in
# the Basic Multilingual Plane and every character past it (the latter then looked up:
# a class holding those few hundred scanned 10 MB in 4 s, this one in 35 ms).
_READ_OTHERWISE_PAST_BMP = frozenset(chr(cp) for cp in (*_DIGITS, *_INVISIBLE) if cp > 0xFFFF)
_READ_OTHERWISE = re.compile(
    f"[{_char_class([cp for cp in (*_DIGITS, *_SPACES, *_DASHES, *_INVISIBLE) if cp <= 0xFFFF])}"
    "\t\n\r\v\f\U00010000-\U0010ffff]"
)
_DIGIT_OR_SEPARATOR = re.compile(f"[\\d\\s+\\-{_char_class(_DASHES)}]|{_INVISIBLE_CLASS}")

# Around each such character, what a card holding it can span (19 digits, three
# separators between two) and the context payment.py reads (an IBAN's start).
_REACH = 80
_MOST_WINDOW = 1024  # characters: a longer stretch of them is looked at in several windows
_MOST_WINDOWS = 256  # per text: past them, the rest is not read again (see changed_windows)


def ascii_digits(text: str) -> str:
    """`text` with every script's digits, spaces and dashes as ASCII ones, line breaks as
    spaces, invisible characters left out."""
    return text.translate(_DROPPING_INVISIBLE)


def changed_windows(text: str) -> Iterator[str]:
    """The stretches of `text` around the characters an ASCII reader reads otherwise
    (digits, spaces, dashes outside ASCII, invisible characters, tabs and line breaks),
    each holding twelve digits or more: only there can a reading hold a card that the
    text as it is does not. At most 256 windows of at most 1,024 characters, so a long
    text costs one character-class scan more, not readings of all of it (helper-130: a
    10 MB body of digit groups with one zero-width space cost 9 s of CPU read whole).
    Past that many, text crafted to be read again and again is not read again (the scan
    is there for what clients send by mistake, not for a client hiding a number). A
    window cut inside a run of digits is marked glued ("x") at the cut, so the part
    cut off never reads as a run of its own.
    """
    spans: list[list[int]] = []
    for found in _READ_OTHERWISE.finditer(text):
        if found.group() > "\uffff" and found.group() not in _READ_OTHERWISE_PAST_BMP:
            continue  # (an emoji, a letter of another plane)
        at = found.start()
        if spans and at - _REACH <= spans[-1][1] and spans[-1][1] - spans[-1][0] < _MOST_WINDOW:
            spans[-1][1] = at + _REACH + 1
            continue
        if len(spans) == _MOST_WINDOWS:
            break
        spans.append([max(0, at - _REACH), at + _REACH + 1])
    for start, end in spans:
        window = text[start:end]
        if len(_ANY_DIGIT.findall(window)) < 12:
            continue
        if start > 0 and _DIGIT_OR_SEPARATOR.match(text, start - 1):
            window = "x" + window
        if end < len(text) and _DIGIT_OR_SEPARATOR.match(text, end):
            window += "x"
        yield window


def read_otherwise(char: str) -> bool:
    """Whether an ASCII reader reads `char` otherwise than a reading of it (see _READ_OTHERWISE)."""
    return _READ_OTHERWISE.match(char) is not None and (char <= "\uffff" or char in _READ_OTHERWISE_PAST_BMP)


def holds_run_read_otherwise(window: str) -> bool:
    """Whether `window` holds a run of twelve digits or more (of any script, up to three
    separators between two, invisible characters anywhere) holding a character an
    ASCII reader reads otherwise: a pre-filter's question (runs all ASCII are left to
    the ASCII scans, which know more: a timestamp is no card)."""
    for found in _LOOSE_RUN.finditer(window):
        run = found.group()
        if len(_ANY_DIGIT.findall(run)) >= 12 and _READ_OTHERWISE.search(run):
            return True
    return False


def run_readings(text: str) -> Iterator[str]:
    """ASCII readings of the windows of `text` (changed_windows), both readings of their
    invisible characters."""
    for window in changed_windows(text):
        yield window.translate(_DROPPING_INVISIBLE)
        if _HAS_INVISIBLE.search(window):
            yield window.translate(_SPACING_INVISIBLE)
