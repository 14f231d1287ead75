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
security numbers (`123-45-6789`) are scrubbed wherever they are. Each becomes
a marker (`[email]`, `[phone]`, `[ssn]`), so the text still reads as the
label it was. Card numbers never get here: the payment scan refuses the
whole request (spec 4.1 rule 5).
"""

from __future__ import annotations

import re
from functools import partial

MAX_TEXT = 512  # spec 8.1; a marker can be longer than what it replaced

# Tried only where a run of local-part characters starts, so a text of them
# without a domain costs one pass, not one per starting position.
_EMAIL = re.compile(r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+")
_SSN = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])")
_END = r"(?![\w-]|[.,]\d)"  # not glued to a word, and not the integer part of a decimal
_PHONES = (
    (re.compile(r"(?<![\d+])\+\d[\d\s().\-/]{5,22}\d" + _END), 8, 15),
    (re.compile(r"(?i:(?<!\w)(?:tel|phone|call|mobile|mob|cell|fax|whatsapp|telefon|t[eé]l[eé]phone)\b)"
                r"[.:]*\s*(?P<number>\+?[\d(][\d\s().\-/]{4,22}\d)" + _END), 7, 15),
    (re.compile(r"(?<![\w.+-])(?:\(\d{3}\)\s?|\d{3}[-.\s])\d{3}[-.\s]\d{4}" + _END), 10, 10),
    # possessive: a long run of digits fails at once instead of trying every way to split it
    (re.compile(r"(?<![\w.,+/-])0\d{1,4}+(?:[\s/-]?\d{2,8}+){1,4}+" + _END), 9, 11),
)
_DIGIT = re.compile(r"\d")
_SEVEN_DIGITS = re.compile(r"(?:\D*\d){7}")  # fewer: no phone number or SSN can be there


def scrub_text(text: str) -> str:
    """`text` with email addresses, phone numbers and SSNs replaced by markers (equal to it when none)."""
    scrubbed = text
    if "@" in scrubbed:
        scrubbed = _EMAIL.sub("[email]", scrubbed)
    if _SEVEN_DIGITS.match(scrubbed):
        scrubbed = _SSN.sub("[ssn]", scrubbed)
        for pattern, fewest, most in _PHONES:
            scrubbed = pattern.sub(partial(_phone, fewest=fewest, most=most), scrubbed)
    return scrubbed[:MAX_TEXT] if scrubbed is not text else text


def _phone(found: re.Match[str], *, fewest: int, most: int) -> str:
    number = found.group("number") if "number" in found.re.groupindex else found.group()
    if not fewest <= len(_DIGIT.findall(number)) <= most:
        return found.group()
    return found.group().replace(number, "[phone]")
