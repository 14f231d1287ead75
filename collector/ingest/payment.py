"""Payment-instrument detection over a whole request (spec 4.1 rule 5).

A request is refused whole when any string anywhere in it holds a card
number, or an object key names a card-number, CVV or expiry field with a
non-empty value. A card number is 14-19 digits, optionally grouped by single
spaces or dashes, not part of a longer alphanumeric token (where in a run of
digit groups it may start: see _has_card), that passes Luhn AND starts with an
issuer prefix (IIN) valid for that length. The IIN check
is what keeps millisecond timestamps (they start with 17), phone numbers and
order ids from matching: Luhn alone passes one random number in ten.

Cost: card numbers are looked for in the raw body (a byte translation and a
substring search find the digit runs; the card regex runs only around
them), card field names in the distinct object keys (a few dozen per
request, their verdicts cached): those of the decoded body, or on the
pipeline's common path only those the key probe leaves to the caller
(`keyprobe.py`). Only when one of these fires is the decoded body walked to
confirm (a JSON number is not payment material). A body whose \\u escapes
could hide digits, spaces or dashes from the raw scan is always walked.

An object may repeat a key, and the decoders keep only its last value, so
material in an earlier one would pass unseen (and an earlier `{"cvv": ...}`
map would hide its key). The raw scans see every member; so does the
confirming walk, which parses the body keeping every member
(`decode_members`). Card field names are flagged from the decoded keys and,
for what a repeated key may hide, by a raw scan for a JSON string that is
one (`_RAW_CARD_NAME`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

from collector.ingest.unicode_digits import (
    changed_windows,
    holds_run_read_otherwise,
    read_otherwise,
    run_readings,
)

# (prefix low, prefix high, lengths): prefixes compared on the leading digits.
_IIN_TABLE: tuple[tuple[int, int, frozenset[int]], ...] = (
    # 13 digits are left out (old Visa and Maestro numbers): EAN-13 barcodes, in
    # product URLs and labels, passed Luhn and a prefix one time in ten.
    (4, 4, frozenset({16, 19})),  # Visa
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
    # Maestro also issued 12-digit numbers, but a 12-digit number is far more often an
    # order or an id: refusing a request on one is not worth the rare old card.
    (50, 50, frozenset(range(14, 20))),  # Maestro
    (56, 69, frozenset(range(14, 20))),  # Maestro
)

# Separators people and forms put inside a card number: a space, a dash, a
# plus or %20 (a URL-encoded space, read as a space first), a no-break space;
# up to three in a row ("4111 - 1111"). A dot is not one: "0.4111..." is a
# decimal fraction. Grouped digits count only in a card's grouping (see
# _card_grouping): a date, a phone number or a UUID is grouped otherwise.
_DIGIT_RUN = re.compile(r"[0-9](?:[ +\-\u00a0]{0,3}[0-9])*")
_DIGIT_GROUP = re.compile(r"[0-9]+")
_SEPARATORS = re.compile(r"[\s_\-.]")
CARD_FIELD_NAMES = frozenset(
    {
        "cardnumber", "ccnumber", "ccnum", "cardnum", "creditcard", "creditcardnumber",
        "debitcard", "pan", "cvv", "cvv2", "cvc", "cvc2", "csc", "cid", "cardcvc", "cardcvv",
        "cccsc", "cccvv", "securitycode", "cardsecuritycode", "ccexp", "cardexpiry",
        "cardexpiration", "expdate", "expirydate", "expirationdate", "ccexpmonth", "ccexpyear",
        "cardexpmonth", "cardexpyear",
    }
)  # fmt: skip
# Verdicts of is_card_field_name for the object keys seen so far: requests
# repeat the same few dozen keys. Bounded; longer keys are never cached.
_KEY_VERDICTS: dict[str, bool] = {}
_KEY_VERDICTS_MAX = 4096
_KEY_VERDICT_MAX_LEN = 64
# A \u escape the raw scan cannot see through: one of a digit, a separator,
# "%" or ".", or any escape right before a digit, a decimal point or separators
# and a digit (it may decode to a boundary, and its last hex digit looks like a
# digit glued to the run: "\u00b9+3780..." hid an Amex number behind a "+").
_HIDING_ESCAPE = re.compile(
    rb"\\u00(?:3[0-9]|2[05bBdDeE]|[aA]0)|\\u[0-9a-fA-F]{4}(?=(?:\.|(?:[ +\-]|%20|\xc2\xa0){1,3})?[0-9])"
)
_RAW_ESCAPE = re.compile(rb"\\(?:u[0-9a-fA-F]{4}|.)")


# Digits and separator bytes (those of %20 and of a UTF-8 no-break space
# included) become "0", everything else "x": runs of twelve "0"s are then
# found by substring search at C speed, and the (slower) card check only runs
# on the few short regions around such runs.
_RUN_TABLE = bytes(48 if chr(b) in "0123456789 -+%" or b in (0xC2, 0xA0) else 120 for b in range(256))
_RUN = b"0" * 12
_NO_ISSUER = frozenset(b"01789")


def _raw_has_card(raw: bytes) -> bool:
    # Each maximal run of twelve or more "0"s, found by substring search (a
    # regex over the whole body costs ~10x more); a run ends at the next "x".
    mapped = raw.translate(_RUN_TABLE)
    start = mapped.find(_RUN)
    while start != -1:
        end = mapped.find(b"x", start)
        if end == -1:
            end = len(mapped)
        run = raw[start:end].strip(b" -+")  # a leading "%" stays: "%20" reads as a space
        # Bare digits can only be one card from their first digit to their
        # last, and one that no issuer uses (every millisecond timestamp
        # starts with 1), of the wrong length or failing Luhn's check never is.
        if run and not (
            run.isdigit() and (run[0] in _NO_ISSUER or not 12 <= len(run) <= 19 or not _luhn_ascii(run))
        ):
            # Context each side: on the left enough that the escapes just before
            # the run are whole (\n, or \u0019 whose hex digits the run may have
            # taken in; helper-111: "\u00dfX23+..." cut after its backslash read
            # "fX" as an IBAN's country), on the right a decimal point. Escapes
            # and non-ASCII bytes become U+FFFD, which may stand for a letter
            # or not: both readings are checked, a superset of text_has_card.
            window = raw[max(0, start - 32) : end + 2].replace(b"\xc2\xa0", b" ")
            if _has_card(_RAW_ESCAPE.sub(b"\xff", window).decode("ascii", "replace"), unsure="\ufffd"):
                return True
        start = mapped.find(_RUN, end)
    return False


_DOUBLED = bytes.maketrans(b"0123456789", b"0246813579")  # each digit doubled, its digits summed


def _luhn_ascii(digits: bytes) -> bool:
    """luhn_valid for ASCII digits, with the arithmetic in C (a hostile body holds a million runs)."""
    backwards = digits[::-1]
    kept, doubled = backwards[0::2], backwards[1::2].translate(_DOUBLED)
    return (sum(kept) + sum(doubled) - 48 * len(digits)) % 10 == 0


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


def looks_like_card(digits: str) -> bool:
    """Whether a string of digits (separators already removed) is a card number."""
    if digits[0] not in "23456":  # no issuer starts with 0, 1, 7, 8 or 9 (timestamps do)
        return False
    return 12 <= len(digits) <= 19 and has_card_iin(digits) and luhn_valid(digits)


def is_card_field_name(name: str) -> bool:
    return _SEPARATORS.sub("", name).lower() in CARD_FIELD_NAMES


def _is_card_key(name: str) -> bool:
    verdict = _KEY_VERDICTS.get(name)
    if verdict is None:
        verdict = is_card_field_name(name)
        if len(name) <= _KEY_VERDICT_MAX_LEN and len(_KEY_VERDICTS) < _KEY_VERDICTS_MAX:
            _KEY_VERDICTS[name] = verdict
    return verdict


class Members(list):  # type: ignore[type-arg]
    """A JSON object as all its (key, value) members, a repeated key kept every time."""


class UnscannableBody(ValueError):
    """The body parses for msgspec but not for the member-keeping parse (nesting near its limit).

    No walk that keeps a repeated key's every value can run, so the body is refused.
    """


def decode_members(raw: bytes) -> Any:
    """The body with objects as Members; UnscannableBody when this parser refuses what msgspec took."""
    try:
        return json.loads(raw, object_pairs_hook=Members)
    except (ValueError, RecursionError):
        raise UnscannableBody("the body is nested too deeply to scan for payment data") from None


# The raw body as is_card_field_name reads a name: ASCII upper case lowered,
# the separators it ignores deleted, and every non-ASCII byte deleted too (a
# superset: that drops the Unicode spaces among them, and more). JSON writes
# the other separators as escapes: the short ones are deleted first, and a
# \u escape that could spell a letter or a space flags the body outright.
_LOWER = bytes(range(65)) + bytes(range(97, 123)) + bytes(range(91, 256))
_NOT_IN_NAMES = b" _-." + bytes(range(0x80, 0x100))
_SHORT_ESCAPES = (b"\\t", b"\\n", b"\\r", b"\\f")
_CARD_NAMES = frozenset(name.encode() for name in CARD_FIELD_NAMES)
_NAME_ESCAPE = re.compile(rb"\\u(?:00[0-7][0-9a-fA-F]|0085|00[aA]0|1680|20[0-5][0-9a-fA-F]|3000)")


def may_hide_card_key(raw: bytes) -> bool:
    """True when some JSON string of the raw body may be a card field name (False: certainly none).

    About 10 ms a MiB: the body's strings, flattened as names are compared,
    looked up among the card field names.
    """
    if b"\\" in raw:
        if _NAME_ESCAPE.search(raw):
            return True
        for escape in _SHORT_ESCAPES:
            raw = raw.replace(escape, b"")
    return not _CARD_NAMES.isdisjoint(raw.translate(_LOWER, _NOT_IN_NAMES).split(b'"'))


def _object_keys(value: Any) -> set[str]:
    """Every distinct object key at any depth of a decoded JSON value (dicts or Members)."""
    keys: set[str] = set()
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            keys.update(item)
            for element in item.values():
                if type(element) in _CONTAINERS:
                    push(element)
        elif kind is Members:
            for key, element in item:
                keys.add(key)
                if type(element) in _CONTAINERS:
                    push(element)
        elif kind is list:
            for element in item:
                if type(element) in _CONTAINERS:
                    push(element)
    return keys


_CONTAINERS = frozenset({dict, list, Members})


def text_has_card(text: str) -> bool:
    """True when `text` holds a card number: see the module docstring for what counts.

    Digits and separators outside ASCII (full-width digits from an input method,
    Arabic-Indic digits, thin spaces, en dashes, zero-width joiners), tabs and line
    breaks are read as the ASCII digits and separators they stand for in the runs
    that hold them (unicode_digits.run_readings), and a URL's percent-encoded UTF-8
    (how a browser writes `４` in a URL) decoded (helper-128, helper-130: all were stored).
    """
    if _reads_as_card(text):
        return True
    # Decoded around each percent-encoded byte past ASCII, not whole: every window of a
    # long text, not its first MiB (helper-131), and not the whole text again (helper-132).
    return any(_reads_as_card(window) for window in _decoded_url_windows(text))


def _decoded_url_windows(text: str) -> Iterator[str]:
    """The windows of `text` around its percent-encoded characters read otherwise, decoded."""
    for window in changed_windows(text, _PERCENT_ENCODED_CHAR, _encodes_a_character_read_otherwise):
        yield unquote(window, errors="replace")


def _reads_as_card(text: str) -> bool:
    """`text` as it is, or an ASCII reading of a run in it (unicode_digits.run_readings), holds a card."""
    return _has_card(text, unsure="") or any(_has_card(reading, unsure="") for reading in run_readings(text))


# One character past ASCII, percent-encoded whole (two to four UTF-8 bytes).
_PERCENT_ENCODED_CHAR = re.compile(
    r"%[cdCD][0-9a-fA-F]%[89abAB][0-9a-fA-F]|%[eE][0-9a-fA-F](?:%[89abAB][0-9a-fA-F]){2}"
    r"|%[fF][0-4](?:%[89abAB][0-9a-fA-F]){3}"
)


def _encodes_a_character_read_otherwise(encoded: str) -> bool:
    """Whether a percent-encoded character is one an ASCII reader reads otherwise (a digit,
    space, dash or invisible character past ASCII): only around those is a URL decoded
    (helper-133: bodies of lone encoded bytes cost 26 s of CPU decoded window by window)."""
    return read_otherwise(unquote(encoded, errors="replace"))


# A URL-encoded space, tab or line break (a textarea's value sent by a GET form writes its
# line breaks "%0D%0A"; helper-134: a card grouped so was stored): read as a space.
_PERCENT_ENCODED_SPACE = re.compile("%(?:20|0[9a-dA-D])")
_PERCENT_ENCODED_SPACE_BYTES = re.compile(b"%(?:20|0[9a-dA-D])")


# A URL's punctuation percent-encoded ("next=%2Fpay%3Fcard%3D4111…", a URL inside a
# parameter): read as itself, or the "D" of "%3D" is a letter glued to the card after it
# (helper-142: all stored).
_PERCENT_ENCODED_PUNCTUATION = re.compile("%(?:2[3569cCfF]|3[abdfABDF]|40)")


def _decoded_punctuation(found: re.Match[str]) -> str:
    return chr(int(found.group()[1:], 16))


def _has_card(text: str, *, unsure: str) -> bool:
    """text_has_card, where a character in `unsure` may stand for anything (see _raw_has_card)."""
    if "%" in text:
        text = _PERCENT_ENCODED_SPACE.sub(" ", text)
        text = _PERCENT_ENCODED_PUNCTUATION.sub(_decoded_punctuation, text)
    for match in _DIGIT_RUN.finditer(text):
        groups = _DIGIT_GROUP.findall(match.group())
        if sum(map(len, groups)) < 12:
            continue
        # A group glued to a letter or digit, or a decimal fraction, belongs to
        # a longer token; a later group of the run may still be a card in one piece.
        before = _glued_before(text, match.start(), unsure)
        after = _glued_after(text, match.end(), unsure)
        # Unsure (the raw pre-filter), both readings count: with the last group and
        # without it (helper-111: keeping it made 15 digits a phone's, and the card went).
        readings = [groups] if after is False else [groups[:-1]] if after else [groups, groups[:-1]]
        # (the pre-filter does not skip what looks like an IBAN: its few bytes of
        # context may lack the letter before "DE89", helper-111; the full walk decides)
        if not unsure and _inside_iban(text, match.start()):
            continue
        if any(_groups_from_run(text, match.start(), kept, before, unsure) for kept in readings):
            return True
    return False


def _groups_from_run(text: str, start_at: int, groups: list[str], before: bool | None, unsure: str) -> bool:
    """Whether a card starts at one of the run's groups (`before`: the first is glued to
    what precedes it; None when unsure)."""
    for start in range(len(groups)):
        if start == 0:
            cards = groups if before is not True and not _international_phone(text, start_at, groups, unsure) else []
        elif start == 1 and (before is None or (before and not _iban_check_digits(text, start_at, groups[0]))):
            # After a glued group ("rv:133.0 4111 1111 ...", "SKU A7 5555-5555-..."),
            # or one that may be: the rest, grouped as cards are; not after an IBAN's
            # country and check digits ("DE51 5001 0517 1703 7296 84").
            cards = groups[1:]
        elif len(groups[start]) in (15, 16):
            # A card in one piece after other digits ("Firefox/133 4111111111111111",
            # "year 2026 4111..."): the lengths nearly every card has. Shorter groups
            # there are barcodes and ids, and digits grouped after other groups are
            # IBANs ("DE 91 5906 6627 ...") and references.
            cards = groups[start : start + 1]
        else:
            continue
        if cards and _groups_hold_card(cards):
            return True
    return False


def _international_phone(text: str, start: int, groups: list[str], unsure: str) -> bool:
    """A run written after a lone "+" that can be an E.164 number ("+6281234567890": at
    most 15 digits, not grouped in fours); a "+" after a letter or digit is a
    URL-encoded space ("card+4111+1111..."), and "+4111 1111 1111 1111" is no phone.
    A "+" after a character in `unsure` may be after a letter: no phone then
    (helper-104: "Ω+3622..." sent as raw UTF-8 passed the pre-filter)."""
    if not (start > 0 and text[start - 1] == "+"):
        return False
    if start > 1 and (text[start - 2].isalnum() or text[start - 2] in unsure):
        return False
    return sum(map(len, groups)) <= 15 and not (len(groups) > 2 and all(len(g) == 4 for g in groups[:-1]))


def _iban_check_digits(text: str, start: int, first: str) -> bool:
    """The run's glued first group is an IBAN's check digits after its country code."""
    return len(first) == 2 and start >= 2 and text[start - 2 : start].isascii() and text[start - 2 : start].isalpha()


# The start of an IBAN written in groups, up to where a run of digits begins inside it:
# "IT17 K" before "030 6909 ..." (a letter glued to the bank code), "GB15 NWBK " before
# "6016 1359 4709 00" (the sort code and account: a 14-digit run).
# Its groups apart by a space or a no-break space, which _DIGIT_RUN reads as one too
# (helper-134: "GB15\u00a0NWBK\u00a06016\u00a0…" was read as a 14-digit Maestro number).
# Not by more, nor by `+`, nor in capitals only: a group may be any word, and each of those
# let cards after "FY24+CARD+" or "Order+AB12+Visa+" through (helper-140, helper-141); so an
# IBAN written with `%0D%0A` or `+` between its groups may be refused.
_IBAN_SO_FAR = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?:[ \u00a0]?[A-Za-z0-9]{4})*[ \u00a0]?[A-Za-z]{0,4}\Z")


def _inside_iban(text: str, start: int) -> bool:
    return _IBAN_SO_FAR.search(text, max(0, start - 48), start) is not None


# Letters of scripts written without spaces between words (Chinese, Japanese kana and
# kanji, Thai, Lao, Khmer, Myanmar; and Hangul, often written so with numbers): a
# number right after one is not part of a longer token ("カード番号４１１１…",
# helper-130: taken for an id and stored).
_UNSPACED_SCRIPT = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)


def _glued_before(text: str, start: int, unsure: str) -> bool | None:
    """Whether the run's first group is glued to what precedes it; None when unsure."""
    if start == 0:
        return False
    char = text[start - 1]
    if char in unsure:
        return None
    if char.isalnum() and not _UNSPACED_SCRIPT.match(char):
        return not (char == "B" and text[start - 2 : start] == "%B")  # magnetic track 1: %B<PAN>^
    if char != "." or start < 2:
        return False
    return None if text[start - 2] in unsure else text[start - 2].isdigit()


def _glued_after(text: str, end: int, unsure: str) -> bool | None:
    """Whether the run's last group is glued to what follows; None when unsure."""
    if end == len(text):
        return False
    if text[end] in unsure:
        return None
    char = text[end]
    if char.isalnum():
        return not _UNSPACED_SCRIPT.match(char)
    return char == "." and end + 1 < len(text) and text[end + 1].isdigit()


def _groups_hold_card(groups: list[str]) -> bool:
    """Whether the first digit groups join into a card number ("4111 1111 1111 1111 2026").

    Only from the first group: a card starts where its run does, and a window
    anywhere in a long digit run would match some 12-digit Maestro number.
    """
    digits = ""
    for count, group in enumerate(groups, start=1):
        digits += group
        if len(digits) > 19:
            return False
        if len(digits) >= 12 and _card_grouping(groups[:count]) and looks_like_card(digits):
            return True
    return False


def _card_grouping(groups: list[str]) -> bool:
    """Digits as cards are written: in one piece, in fours (the last group shorter), or 4-6-5 / 4-6-4."""
    if len(groups) == 1:
        return True
    lengths = [len(group) for group in groups]
    if lengths in ([4, 6, 5], [4, 6, 4]):  # American Express, Diners Club
        return True
    return all(length == 4 for length in lengths[:-1]) and 1 <= lengths[-1] <= 4


def _walk(value: Any) -> Iterator[tuple[str | None, Any]]:
    stack: list[tuple[str | None, Any]] = [(None, value)]
    while stack:
        key, item = stack.pop()
        yield key, item
        if isinstance(item, Members):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.items())
        elif isinstance(item, list):
            stack.extend((None, element) for element in item)


def _has_value(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, int | float) and not isinstance(value, bool)


def find_payment_data(raw: bytes, decoded: Any) -> str | None:
    """What payment material the request carries, or None. `decoded` is the parsed body.

    UnscannableBody when a pre-filter fired and the walk cannot run.
    """
    card_candidate = has_card_candidate(raw)
    key_candidate = has_card_key(_object_keys(decoded)) or may_hide_card_key(raw)
    return scan_payment_data(raw, card_candidate=card_candidate, key_candidate=key_candidate)


def scan_payment_data(raw: bytes, *, card_candidate: bool, key_candidate: bool) -> str | None:
    """Confirm what the pre-filters flagged by walking every member of the body (see decode_members)."""
    if not card_candidate and not key_candidate:
        return None
    return confirm_payment_data(decode_members(raw), card_candidate=card_candidate, key_candidate=key_candidate)


def has_card_candidate(raw: bytes) -> bool:
    """True when the raw body may hold a card number (False means it certainly does not)."""
    return (
        _raw_has_card(raw)
        or _HIDING_ESCAPE.search(raw) is not None
        or _may_hide_card_otherwise(raw)
    )


_PERCENT_ENCODED_UTF8_BYTES = re.compile(rb"%[89a-fA-F][0-9a-fA-F]")


def _may_hide_card_otherwise(raw: bytes) -> bool:
    """True when the body may write a card number as the scans above cannot see it (False:
    certainly not): with digits or separators outside ASCII, as UTF-8 or \\u escapes,
    with tabs or line breaks between the groups, or percent-encoded in a URL. A body all
    ASCII without a backslash or "%", the common case, costs three byte scans; others a
    decoding (C), a character-class scan, and a regex only around the characters read
    otherwise (unicode_digits.changed_windows)."""
    if b"%0" in raw and _raw_has_card(_PERCENT_ENCODED_SPACE_BYTES.sub(b" ", raw)):
        return True  # (groups between percent-encoded line breaks, which _raw_has_card takes as letters)
    if raw.isascii():
        # (one regex pass for every escape that matters: a `in` scan of 18 KB costs 14 µs)
        escape = _ESCAPE_KIND.search(raw)
        escaped = escape is not None and _ESCAPE_KIND_U.search(raw, escape.start()) is not None
        if not (escaped and _escapes_read_otherwise(raw)) and (
            b"%" not in raw or _PERCENT_ENCODED_UTF8_BYTES.search(raw) is None
        ):
            # Only ASCII to read: digits in groups across lines are all that is left.
            if escape is not None and _ESCAPE_KIND_LINE.search(raw, escape.start()) is not None:
                for line_escape in _LINE_ESCAPES:
                    raw = raw.replace(line_escape, b" ")
                return _raw_has_card(raw)
            return False
    text = raw.decode("utf-8", "replace")
    if "\\" in text:
        text = _json_unescaped(text)
    if _PERCENT_ENCODED_UTF8_BYTES.search(raw):  # (the decoded windows, apart: see text_has_card)
        text += "".join(" " + window for window in _decoded_url_windows(text))
    return any(holds_run_read_otherwise(window) for window in changed_windows(text))


_LINE_ESCAPES = (b"\\t", b"\\n", b"\\r", b"\\f")
_ESCAPE_KIND = re.compile(rb"\\[utnrf]")  # (an escaped backslash before one: a superset)
_ESCAPE_KIND_U = re.compile(rb"\\u")
_ESCAPE_KIND_LINE = re.compile(rb"\\[tnrf]")
_ESCAPE_HEX = re.compile(rb"\\u([0-9a-fA-F]{4})")
_MOST_ESCAPES_LOOKED_AT = 256  # past that many, the whole body is read (one pass in C is cheaper)


def _escapes_read_otherwise(raw: bytes) -> bool:
    """Whether a \\u escape of the body may write a character an ASCII reader reads otherwise
    (a surrogate: a character past U+FFFF); a body of many escapes is taken to."""
    if raw.count(b"\\u") > _MOST_ESCAPES_LOOKED_AT:
        return True
    return any(
        0xD800 <= (code := int(found.group(1), 16)) <= 0xDBFF or read_otherwise(chr(code))
        for found in _ESCAPE_HEX.finditer(raw)
    )


def _json_unescaped(text: str) -> str:
    """`text` (JSON) with its escapes read, in C: other characters outside ASCII written as
    Python's escapes first, then every escape read as Python reads them (JSON's are a
    subset), a \\u escape pair past U+FFFF joined. Not JSON's strings alone: a pre-filter."""
    escaped = text.encode("ascii", "backslashreplace").decode("unicode_escape", "replace")
    return escaped.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def has_card_key(keys: Iterable[str]) -> bool:
    """True when one of `keys` names a card field."""
    return any(_is_card_key(key) for key in keys)


def object_keys(values: Iterable[Any]) -> set[str]:
    """Every distinct object key at any depth of some decoded JSON values."""
    return _object_keys(list(values))


def confirm_payment_data(decoded: Any, *, card_candidate: bool, key_candidate: bool) -> str | None:
    """Walk the decoded body for what the raw pre-filters flagged; None when nothing was flagged."""
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
