"""A click's `element.text`, scrubbed of personal data before it is stored (spec 2.3).

The spec's rule for the field is "scrubbed of personal data"; an SDK may
scrub already, and the collector does not count on it. Button and link texts
are full of numbers that are not a person's (prices, dates and times,
versions, order, tracking and ISBN numbers, sizes), so a number is taken for
a phone number only in a form that says so:

- international, with a leading `+` (`+49 30 12345678`, `+1 (415) 555-0100`);
- after a word that names one (`Tel.: 030/1234567`, `call 555-0100`);
- North American `415-555-0100`, `(415) 555-0100`, `415.555.0100`;
- national, starting with 0 (`0612 345 678`, `030/12345678`, `01 23 45 67 89`);

each with the digit count of a phone number. Email addresses and US social
security numbers (`123-45-6789`, `123 45 6789`, or nine digits after `SSN`)
are scrubbed wherever they are. Each becomes a marker (`[email]`, `[phone]`,
`[ssn]`), so the text still reads as the label it was. Card numbers never get
here: the payment scan refuses the whole request (spec 4.1 rule 5).

Text outside ASCII is also read plainly: full-width and small forms of ASCII
(`＠`, `．`, `Ｔｅｌ`) as ASCII, every script's digits, spaces and dashes as
ASCII ones, combining marks and invisible characters left out (unicode_digits),
an ideographic full stop as a dot, telephone signs as the word "tel": an
address written `john\\u200b@example.com` or `john＠example。com`, or a phone
number in Arabic-Indic digits, is found there. Those finds replace their own
stretches of the text, and the text as sent is scrubbed as well (helper-128:
all were kept).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from functools import partial

from collector.ingest.unicode_digits import ascii_digits

MAX_TEXT = 512  # spec 8.1; a marker can be longer than what it replaced

# Tried only where a run of local-part characters starts, so a text of them
# without a domain costs one pass, not one per starting position.
_EMAIL = re.compile(r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+")
_SSN = re.compile(
    r"(?<![\w.-])(?!000|666|9\d\d)\d{3}(?P<sep> ?[-.] ?| )(?!00)\d{2}(?P=sep)(?!0000)\d{4}(?![\w-]|\.\d)"
)
# Nine digits after a word that names them ("My SSN is 123456789", "Social Security No. 123456789").
_SSN_AFTER_WORD = re.compile(
    r"(?i:(?<!\w)(?:ssn|social security(?: number| no\.?)?)(?!\w)[\s:#.]*(?:is\s+)?)(?P<number>\d{9})(?!\w)"
)
_END = r"(?![\w-]|[.,]\d)"  # not glued to a word, and not the integer part of a decimal
# A date and what follows it ("01/02/2024 10", "01 02 2024 10", "2024 12 31"), years
# ("2024 2025 2026"), a US ZIP+4 and a grouped amount ("+12 345 678", "15.000.000")
# are not phone numbers, whatever the digit count.
_NOT_A_PHONE = re.compile(
    r"(?:0?\d[/.-][0-3]?\d[/.-]\d{2,4}|0?\d\s[0-3]?\d\s(?:19|20)\d\d)\b.*"
    r"|(?:19|20)\d\d(?:[\s/.-]+(?:(?:19|20)\d\d|\d{1,2}))+"
    r"|\d{5}-\d{4}|\+?\d{1,3}(?:(?P<sep>[.,\s])\d{3})(?:(?P=sep)\d{3})*",
    re.S,
)
# Where a number starts: not glued to a word or another number, nor the next group
# of one written in groups (an IBAN's "DE89 3704 0044 0532").
_NEW_NUMBER = r"(?<![\w.,+/-])(?<!\d\s)"
_WORD = (
    r"(?i:(?<!\w)(?:tel|phone|call|mobile|mob|cell|fax|whatsapp|telefon|tel[eé]fono|t[eé]l[eé]phone|tlf"
    r"|handy|mobil|natel|m[oó]vil|celular|portable|telefone|telefono|телефон|моб|电话|電話|手机|携帯|هاتف|جوال|تلفن)"
    r"(?!\w))"
)
# (up to 60 characters: two numbers in a row are read whole, then apart; _numbers_in_a_row)
_AFTER_WORD_NUMBER = r"\+?[\d(][\d\s().\-/]{4,60}\d"
_INTERNATIONAL = (re.compile(r"(?<![\d+])\+\d[\d\s().\-/]{5,60}\d" + _END), 8, 15)
_INTERNATIONAL_00 = (re.compile(_NEW_NUMBER + r"00\s?[1-9][\d\s().\-/]{6,60}\d" + _END), 10, 17)
_NORTH_AMERICAN = (
    re.compile(r"(?<![\w.+-])(?:1[-.\s])?(?:\(\d{3}\)\s?|\d{3}[-.\s])\d{3}[-.\s]\d{4}" + _END), 10, 11
)
# national, starting with 0 or with an area code in brackets; each group possessive: a long
# run of digits fails at once instead of trying every way to split it (many groups: numbers
# in a row are read whole, then apart; fewer when the last is glued to what follows)
_NATIONAL = (re.compile(_NEW_NUMBER + r"(?:0\d{1,4}+|\(0\d{1,4}\)\s?)(?:[\s/-]?\d{2,8}+){1,16}" + _END), 9, 11)
# after a word that names a phone
_AFTER_WORD = (re.compile(_WORD + r"[.:：]*\s*(?P<number>" + _AFTER_WORD_NUMBER + ")" + _END), 7, 15)
_PHONES = (_INTERNATIONAL, _INTERNATIONAL_00, _AFTER_WORD, _NORTH_AMERICAN, _NATIONAL)
# What each of numbers in a row must be on its own: one of the forms that need no word.
_ONE_NUMBER = (_INTERNATIONAL, _INTERNATIONAL_00, _NORTH_AMERICAN, _NATIONAL)
_FEWEST_DIGITS = min(fewest for _, fewest, _ in _ONE_NUMBER)
_MOST_DIGITS = max(most for _, _, most in _ONE_NUMBER)
_DIGIT_GROUPS = re.compile(r"\d+")
_MOST_SEPARATORS = 20  # in a run read as numbers in a row (three numbers of five groups have 14)
_ANY_NUMBER = re.compile(r"\+?[\d(][\d\s().\-/]*\d")
# The first number of a run as each pattern read it before numbers in a row were (a few
# groups, or 24 characters, at most)
_FIRST_NUMBER = {
    _INTERNATIONAL[0]: re.compile(r"\+\d[\d\s().\-/]{5,22}\d" + _END),
    _INTERNATIONAL_00[0]: re.compile(r"00\s?[1-9][\d\s().\-/]{6,22}\d" + _END),
    _AFTER_WORD[0]: re.compile(r"\+?[\d(][\d\s().\-/]{4,22}\d" + _END),
    _NORTH_AMERICAN[0]: _NORTH_AMERICAN[0],
    _NATIONAL[0]: re.compile(r"(?:0\d{1,4}+|\(0\d{1,4}\)\s?)(?:[\s/-]?\d{2,8}+){1,4}+" + _END),
}
# Where one number in a row ends and the next begins: spaces, a comma or semicolon, a slash
# or dash with spaces around it, or a slash before a number's start (`+`, `0`, a bracket:
# "06 12 34 56 78/06 98 76 54 32"; other slashes are inside a number, "030/1234567", or a
# date; helper-141).
_BETWEEN_NUMBERS = re.compile(r"\s*[,;]\s*|\s+[/-]\s+|/(?=[+0(])|\s+")
_DIGIT = re.compile(r"\d")
_SEVEN_DIGITS = re.compile(r"(?:\D*\d){7}")  # fewer: no phone number or SSN can be there


def scrub_text(text: str) -> str:
    """`text` with email addresses, phone numbers and SSNs replaced by markers (equal to it when none)."""
    scrubbed = text
    if not text.isascii():
        reading, origin = _plain_reading(text)
        if reading != text:
            found = _scrubbed(reading, _unmarked)
            if _MARKED_RUN.search(found):
                scrubbed = _marked_in_place(text, found, origin)
    # The text as sent is scrubbed too, the reading's finds marked or not (helper-132: a
    # find in the reading, or a near-find, returned early, and a phone number that the
    # reading glued to a superscript was kept).
    scrubbed = _scrubbed(scrubbed, _marker)
    return text if scrubbed == text else _cut(scrubbed)


# Ideographic and halfwidth ideographic full stops read as dots; telephone signs as the
# word (NFKC makes "℡" "TEL", glued to the number after it: helper-131).
_READ_AS = {"\u3002": ".", "\uff61": ".", "\u2121": " tel ", "\u260e": " tel ", "\u260f": " tel ",
            "\U0001f4de": " tel ", "\U0001f4f1": " tel "}


@functools.lru_cache(maxsize=4096)
def _read_char(char: str) -> str:
    """How the scrub's patterns read one character outside ASCII (see the module docstring)."""
    if unicodedata.category(char) == "Mn":
        return ""  # a combining mark: "e\u0301mile@" is an address from its first letter
    if "\ufdd0" <= char <= "\ufdef":
        return "?"  # (a noncharacter: the sentinels below are three of them)
    if char in _READ_AS:
        return _READ_AS[char]
    if "\uff01" <= char <= "\uff5e" or "\ufe50" <= char <= "\ufe6b":
        # Full-width and small forms of ASCII (＠, ．, Ｔｅｌ) by their compatibility form;
        # not other characters, whose compatibility forms glue letters or digits to what
        # is next to them (helper-132: ™ made "TMjane@…" one address, ¹ a digit of a phone).
        return unicodedata.normalize("NFKC", char)
    return ascii_digits(char)


def _plain_reading(text: str) -> tuple[str, list[int]]:
    """`text` as the scrub's patterns read it, and for each of its characters (and its end)
    the position in `text` of the character it comes from."""
    pieces, origin = [], []
    for at, char in enumerate(text):
        piece = char if char.isascii() else _read_char(char)
        pieces.append(piece)
        origin.extend([at] * len(piece))
    origin.append(len(text))
    return "".join(pieces), origin


# A find in the reading is overwritten by a sentinel character, as long as it was: the
# reading's positions stay those of `origin`, and only those stretches of the text are
# replaced (helper-130: the whole label was stored as its reading, a family emoji split
# in three, `x²` made `x2`). The sentinels are noncharacters, which the reading never
# holds (_read_char reads them as "?"; helper-131: U+E000, an icon font's glyph in a
# label, was taken for a find).
_SENTINELS = {"email": "\ufdd0", "ssn": "\ufdd1", "phone": "\ufdd2"}
_MARKED = {sentinel: f"[{kind}]" for kind, sentinel in _SENTINELS.items()}
_MARKED_RUN = re.compile("\ufdd0+|\ufdd1+|\ufdd2+")


def _marker(kind: str, found: str) -> str:
    return f"[{kind}]"


def _unmarked(kind: str, found: str) -> str:
    return _SENTINELS[kind] * len(found)


def _marked_in_place(text: str, found: str, origin: list[int]) -> str:
    """`text` with the stretches that `found` (its reading, finds overwritten) marks replaced
    by markers: from the character the find's first comes from to the one its last comes
    from, whole (an invisible character after a find is kept: helper-131 lost the U+202C
    that closed a right-to-left run; a character that reads as several, ⒎ as "7.", goes
    with the find when part of it does)."""
    out, kept_from = [], 0
    for run in _MARKED_RUN.finditer(found):
        start, end = origin[run.start()], origin[run.end() - 1] + 1
        out.append(text[kept_from:start])
        out.append(_MARKED[run.group()[0]])
        kept_from = end
    out.append(text[kept_from:])
    return "".join(out)


def _scrubbed(text: str, mark: Callable[[str, str], str]) -> str:
    scrubbed = text
    if "@" in scrubbed:
        scrubbed = _EMAIL.sub(lambda found: mark("email", found.group()), scrubbed)
    if _SEVEN_DIGITS.match(scrubbed):
        scrubbed = _SSN.sub(lambda found: mark("ssn", found.group()), scrubbed)
        scrubbed = _SSN_AFTER_WORD.sub(partial(_ssn_after_word, mark=mark), scrubbed)
        for pattern, fewest, most in _PHONES:
            scrubbed = pattern.sub(partial(_phone, fewest=fewest, most=most, mark=mark), scrubbed)
    return scrubbed


def _ssn_after_word(found: re.Match[str], *, mark: Callable[[str, str], str]) -> str:
    start, end = found.span("number")
    whole = found.group()
    return whole[: start - found.start()] + mark("ssn", found.group("number")) + whole[end - found.start() :]


def _phone(found: re.Match[str], *, fewest: int, most: int, mark: Callable[[str, str], str]) -> str:
    whole = found.group("number") if found.re is _AFTER_WORD[0] else found.group()
    number = _before_a_late_bracket(whole)
    if number is not whole and not _phone_shaped(number, fewest, most):
        number = whole  # (cut, it is no phone: "+49 301 234 (5678)" reads as an amount then; helper-133)
    if _phone_shaped(number, fewest, most):
        return found.group().replace(number, mark("phone", number), 1)
    # Too many digits for one: numbers in a row, each in a form of its own, the reading
    # that takes in the most digits ("030 1234567 030 7654321" was kept whole, its 17
    # digits no phone number, and "Tel: 030 1234567 / 030 7654321" kept 7654321;
    # helper-133). What follows the last is kept ("+49 30 1234567 12345").
    numbers = _numbers_in_a_row(whole)
    if not numbers and found.re is _AFTER_WORD[0]:
        # (numbers of no form of their own count when written alike: "08 00 - 20 00" after
        # a phone number is opening hours, "22 33 44 55 / 99 88 77 66" two numbers)
        numbers = _numbers_in_a_row(whole, (fewest, most))
        if len({_grouping(number) for number in numbers}) != 1:
            numbers = []
    # The first number as the patterns read it before numbers in a row were, when no
    # reading is found or it takes in more digits than the reading (helper-141: "+49 30
    # 1234567/33-12-34-56" was kept whole; "+33 1 23 45 67 89/..." kept its 89).
    first = _FIRST_NUMBER[found.re].match(whole)
    if first is not None and _phone_shaped(first.group(), fewest, most) and (
        _digit_count(first.group()) > sum(map(_digit_count, numbers))
    ):
        numbers = [first.group()]
    text = found.group()
    for number in numbers:
        at = text.index(number)
        text = text[:at] + text[at:].replace(number, mark("phone", number), 1)
    return text


def _numbers_in_a_row(run: str, after_word: tuple[int, int] | None = None) -> list[str]:
    """The phone numbers `run` starts with, one after the other where _BETWEEN_NUMBERS is,
    each one that one of _ONE_NUMBER finds whole (or, `after_word`, any run of digits
    with that many), of the ways to read it so the one that takes in the most digits
    (helper-137: the shortest first, "0612 345" of "0612 345 678 / 0612 345 679", cut the
    second in two; the longest, "+49 30 1234567 030" of "+49 30 1234567 030 1234567",
    left 1234567). None for a run with more than _MOST_SEPARATORS (the cost stays small)."""
    betweens = [(between.start(), between.end()) for between in _BETWEEN_NUMBERS.finditer(run)]
    if len(betweens) > _MOST_SEPARATORS:
        return []
    ends: list[tuple[int, int | None]] = [*betweens, (len(run), None)]
    digits_before = [0]  # digits_before[i]: the digits in run[:i]
    for char in run:
        digits_before.append(digits_before[-1] + char.isdigit())
    best: dict[int, tuple[int, list[str]]] = {}  # start -> (digits taken in from there, numbers)
    for start in reversed([0, *(after for _, after in betweens)]):
        taken, numbers = 0, []
        for end, after in ends:
            digits = digits_before[end] - digits_before[start]
            if end <= start or digits < _FEWEST_DIGITS:
                continue
            if digits > _MOST_DIGITS:
                break  # (and every longer one)
            number = run[start:end]
            if run[end : end + 1] == "/" and not any(char.isspace() for char in number):
                # (a bare slash ends a number written with spaces only, "06 12 34 56 78/06 98
                # 76 54 32": "Los 052/042/040/002" was a phone number and 002, helper-142)
                continue
            if not _one_number(number, after_word):
                continue
            rest_taken, rest = best.get(after, (0, [])) if after is not None else (0, [])
            if digits + rest_taken > taken:
                taken, numbers = digits + rest_taken, [number, *rest]
        best[start] = (taken, numbers)
    return best[0][1]


def _digit_count(text: str) -> int:
    return len(_DIGIT.findall(text))


def _grouping(number: str) -> tuple[int, ...]:
    return tuple(len(group) for group in _DIGIT_GROUPS.findall(number))


def _one_number(text: str, after_word: tuple[int, int] | None) -> bool:
    if after_word is not None and _ANY_NUMBER.fullmatch(text) and _phone_shaped(text, *after_word):
        return True
    return any(pattern.fullmatch(text) and _phone_shaped(text, fewest, most) for pattern, fewest, most in _ONE_NUMBER)


def _phone_shaped(number: str, fewest: int, most: int) -> bool:
    """A phone number's digit count, and not a date, a year list or an amount (_NOT_A_PHONE)."""
    return fewest <= _digit_count(number) <= most and not _NOT_A_PHONE.fullmatch(number)


def _before_a_late_bracket(number: str) -> str:
    """`number` up to an opening bracket after eight digits or more: an area code is in
    one earlier ("+1 (415) 555-0100", "+49 (0)30 …"); one this late opens the label's own
    words (helper-132: "Call +1 415 555 0100 (24/7)" was stored "Call [phone])")."""
    at = number.find("(")
    while at != -1:
        if len(_DIGIT.findall(number, 0, at)) >= 8:
            return number[:at].rstrip()
        at = number.find("(", at + 1)
    return number


def _cut(text: str) -> str:
    """`text` within MAX_TEXT characters, never ending in half a marker."""
    if len(text) <= MAX_TEXT:
        return text
    cut = text[:MAX_TEXT]
    opened = cut.rfind("[")
    return cut[:opened] if opened != -1 and "]" not in cut[opened:] else cut
