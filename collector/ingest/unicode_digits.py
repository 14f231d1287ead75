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
from collections.abc import Callable, Iterator

_DIGITS: dict[int, str] = {}  # every decimal digit (category Nd) outside ASCII -> its ASCII digit
_SPACES: list[int] = []  # space separators (Zs) outside ASCII
# Dash punctuation (Pd), the minus sign, and the katakana prolonged sound mark (full and
# half width), which a Japanese input method types for "-" (helper-131: "４１１１ー１１１１…").
_DASHES: list[int] = [0x2212, 0x30FC, 0xFF70]
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

# (and the line and paragraph separators and NEL: helper-132 joined a card's groups with them)
_LINE_BREAKS = dict.fromkeys(map(ord, "\t\n\r\v\f\x85\u2028\u2029"), " ")
_SEPARATORS = {**dict.fromkeys(_SPACES, " "), **dict.fromkeys(_DASHES, "-"), **_LINE_BREAKS}
# Two readings of the invisible characters: gone ("4\u200b1\u200b1…" is one
# number) or a space ("4111\u200b1111…" is grouped as a card is).
_DROPPING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE)})
_SPACING_INVISIBLE = str.maketrans({**_DIGITS, **_SEPARATORS, **dict.fromkeys(_INVISIBLE, " ")})


def _char_class(code_points: list[int]) -> str:
    return "".join(re.escape(chr(cp)) for cp in code_points)


def _bmp(code_points: list[int]) -> list[int]:
    return [cp for cp in code_points if cp <= 0xFFFF]


# What an ASCII reader reads otherwise than a reading of it: the characters above, and
# tabs and line breaks (not separators to payment.py). Found by a class of the ones in
# the Basic Multilingual Plane and every character past it (the latter then looked up:
# a class holding those few hundred scanned 10 MB in 4 s, this one in 35 ms).
_READ_OTHERWISE_PAST_BMP = frozenset(chr(cp) for cp in (*_DIGITS, *_INVISIBLE) if cp > 0xFFFF)
_READ_OTHERWISE = re.compile(
    f"[{_char_class(_bmp([*_DIGITS, *_SPACES, *_DASHES, *_INVISIBLE]))}\t\n\r\v\f\x85\u2028\u2029"
    "\U00010000-\U0010ffff]"
)
# Invisible characters, found the same fast way (past the BMP: the tag characters).
_INVISIBLE_FAST = re.compile(f"[{_char_class(_bmp(_INVISIBLE))}\U000e0000-\U000e0fff]")
_DASH_CLASS = _char_class(_DASHES)
# A run of digits of any script (`\d` is every Nd character), up to three separators
# between two (`\s` is every space and line break; dashes, `+`, a URL's `%20` and its
# encoded tabs and line breaks, as payment._PERCENT_ENCODED_SPACE).
_SEPARATOR = f"(?:[\\s+\\-{_DASH_CLASS}]|%20|%0[9a-dA-D])"
_RUN = re.compile(f"\\d(?:{_SEPARATOR}{{0,3}}\\d)*")
_RUN_OF_12 = re.compile(f"\\d(?:{_SEPARATOR}{{0,3}}\\d){{11}}")
_ANY_DIGIT = re.compile(r"\d")
_ASCII_LINE_BREAK = re.compile("[\t\n\r\v\f]")  # (the others are outside ASCII)

# Around each such character, what a card holding it can span (19 digits, three
# separators between two) and the context payment.py reads (an IBAN's start).
_REACH = 80
_MOST_WINDOW = 2048  # characters: a longer stretch of them is looked at in several windows
# ... which overlap by this much: more than a card takes, percent-encoded (19 mathematical
# digits of 12 characters and 18 encoded separators of 9: 390), with room for invisible
# characters between them.
_OVERLAP = 768
# Where a window that takes over from a long one may start: right after a character no
# token reaches across. Not an ASCII letter or digit, a separator, "+", "%" or "." (an
# IBAN's groups, the "+" before a phone number, a run's glue, a decimal point), nor a
# character read otherwise or past the BMP. Looked for this far back (helper-134: a cut
# inside "DE51 5001 …" or before "+６２…" read an IBAN or a phone number as a card).
_BOUNDARY_BEFORE = re.compile(
    f".*[^A-Za-z0-9 +\\-.%\u00a0{_char_class(_bmp([*_DIGITS, *_SPACES, *_DASHES, *_INVISIBLE]))}"
    "\t\n\r\v\f\x85\u2028\u2029\U00010000-\U0010ffff]",
    re.S,
)
_BOUNDARY_LOOKBACK = 256
# Two invisible characters or more, which a reading makes nothing or one space as it does
# one: one stands for them, so a card spread by any number is still whole in a window
# (helper-134: 140 zero-width spaces between its digits, 700 between its groups).
_INVISIBLE_RUNS = re.compile(f"[{_char_class(_bmp(_INVISIBLE))}\U000e0000-\U000e0fff]{{2,}}")
# What stands in for a run cut off before a window: a first group too long to start a
# card, as the run's first group is not where a card may start (payment._groups_from_run).
_CUT_RUN_BEFORE = "0" * 20


def ascii_digits(text: str) -> str:
    """`text` with every script's digits, spaces and dashes as ASCII ones, line breaks as
    spaces, invisible characters left out."""
    return text.translate(_DROPPING_INVISIBLE)


def changed_windows(
    text: str, trigger: re.Pattern[str] | None = None, keep: Callable[[str], bool] | None = None
) -> Iterator[str]:
    """The stretches of `text` around the characters an ASCII reader reads otherwise
    (digits, spaces, dashes outside ASCII, invisible characters, tabs and line breaks),
    each holding twelve digits or more: only there can a reading hold a card that the
    text as it is does not. Windows of up to 2 KB (those that meet overlap by
    _OVERLAP), so a long text costs one character-class scan and a digit count a
    window more, not readings of all of it (helper-130: a 10 MB body of digit groups with one zero-width space cost 9 s of
    CPU read whole). A window's edge cut inside a token stands for what it cut off
    (see _window). `trigger`: what else to open windows around (payment.py: a URL's
    percent-encoded characters), those of its finds that `keep` keeps.
    """
    if trigger is None and _INVISIBLE_FAST.search(text) is not None:
        text = _INVISIBLE_RUNS.sub("\u200b", text)
    start = end = -1
    for found in (trigger or _READ_OTHERWISE).finditer(text):
        if trigger is None and found.group() > "\uffff" and found.group() not in _READ_OTHERWISE_PAST_BMP:
            continue  # (an emoji, a letter of another plane)
        if keep is not None and not keep(found.group()):
            continue
        at = found.start()
        if end != -1 and at - _REACH <= end:
            if end - start < _MOST_WINDOW:
                end = at + _REACH + 1
                continue
            # Too long: the next window takes over the last _OVERLAP characters, so a card
            # that the cut falls across is whole in it (helper-133: with 161 in common, a
            # percent-encoded full-width card, 171 characters, was in neither).
            if (window := _window(text, start, end)) is not None:
                yield window
            start, end = _continuation_start(text, end - _OVERLAP), at + _REACH + 1
            continue
        if end != -1 and (window := _window(text, start, end)) is not None:
            yield window
        start, end = max(0, at - _REACH), at + _REACH + 1
    if end != -1 and (window := _window(text, start, end)) is not None:
        yield window


def _continuation_start(text: str, at: int) -> int:
    """Just after the last character before `at` that no token reaches across
    (_BOUNDARY_BEFORE), looking back _BOUNDARY_LOOKBACK characters; else `at` (where
    _window's stand-ins are all there is)."""
    boundary = _BOUNDARY_BEFORE.match(text, max(0, at - _BOUNDARY_LOOKBACK), at)
    return boundary.end() if boundary is not None else at


def _window(text: str, start: int, end: int) -> str | None:
    """text[start:end] with what its edges cut off stood in for; None when it holds fewer
    than twelve digits. Before it: a run's digits or separators by a first group too
    long to start a card, a decimal point by "0." (a fraction), a letter by itself (a
    Chinese one is still no glue); after it, a run's digits or separators by "x" (the
    last group glued) and a letter by itself (helper-131: a window starting at the digits
    of "0.4111…" or "ABC4111…" read them as a card)."""
    window = text[start:end]
    if len(_ANY_DIGIT.findall(window)) < 12:
        return None
    if start > 0:
        before = text[start - 1]
        if before.isalnum() and not _ANY_DIGIT.match(before):
            window = before + window
        elif before == ".":
            window = "0." + window
        elif _ANY_DIGIT.match(before) or (_in_run(before) and _digit_before_separators(text, start)):
            window = _CUT_RUN_BEFORE + window
    if end < len(text):
        after = text[end]
        if after.isalnum() and not _ANY_DIGIT.match(after):
            window += after
        elif after == "." or _ANY_DIGIT.match(after) or _in_run(after):
            window += "x"
    return window


def _digit_before_separators(text: str, start: int) -> bool:
    """Whether the separators and invisible characters just before `start` follow a digit (so
    the run goes on across a cut there), looking back at most 64 characters (past them:
    no, which only digits 64 invisible characters apart, never sent by mistake, could
    make wrong). Separators alone before a run do not glue it (helper-133's card after
    1,883 zero-width spaces: the cut stood for digits, and the card read as a longer run)."""
    for at in range(start - 1, max(-1, start - 65), -1):
        char = text[at]
        if _ANY_DIGIT.match(char):
            return True
        if not _in_run(char):
            return False
    return False


def _in_run(char: str) -> bool:
    """Whether `char` may stand between two digits of a run (a separator, any reading of it)."""
    return char in " +-%" or read_otherwise(char)


def read_otherwise(char: str) -> bool:
    """Whether an ASCII reader reads `char` otherwise than a reading of it (see _READ_OTHERWISE)."""
    return _READ_OTHERWISE.match(char) is not None and (char <= "\uffff" or char in _READ_OTHERWISE_PAST_BMP)


def holds_run_read_otherwise(window: str) -> bool:
    """Whether `window` may hold a run of twelve digits or more (of any script, up to three
    separators between two, invisible characters anywhere) that an ASCII reader does
    not read as one: a pre-filter's question, answered loosely (runs all ASCII are left
    to the ASCII scans, which know more: a timestamp is no card). Invisible characters
    are taken out first, in one fast pass, so the run regex stays simple (with them in
    it, it read 800 ns a character)."""
    if _INVISIBLE_FAST.search(window) is not None:
        # (any long run may be one that an invisible character split: say so)
        return _RUN_OF_12.search(_INVISIBLE_FAST.sub("", window)) is not None
    for found in _RUN.finditer(window):
        run = found.group()
        if (not run.isascii() or _ASCII_LINE_BREAK.search(run)) and len(_ANY_DIGIT.findall(run)) >= 12:
            return True
    return False


def run_readings(text: str) -> Iterator[str]:
    """ASCII readings of the windows of `text` (changed_windows) that may hold a run an
    ASCII reader does not read as one (holds_run_read_otherwise: a line break after a
    date does not), both readings of their invisible characters. Every such window: a
    budget let a card through in ordinary text, a long table of numbers (helper-131,
    helper-132); windows hold the text between them about 1.6 times at most (_OVERLAP
    of _MOST_WINDOW), so the cost stays linear."""
    for window in changed_windows(text):
        if not holds_run_read_otherwise(window):
            continue
        yield window.translate(_DROPPING_INVISIBLE)
        if _INVISIBLE_FAST.search(window) is not None:
            yield window.translate(_SPACING_INVISIBLE)
