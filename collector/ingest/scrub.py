"""A click's `element.text`, scrubbed of personal data before it is stored (spec 2.3).

The spec's rule for the field is "scrubbed of personal data"; an SDK may
scrub already, and the collector does not count on it. What is scrubbed is
what a button or link text carries of a person: an email address, a phone
number (9 to 15 digits, the length of a national or international number:
prices, dates, years and short codes stay), and a US social security number.
Each is replaced by a marker (`[email]`, `[phone]`, `[ssn]`), so the text
still reads as the label it was. Card numbers never get here: the payment
scan refuses the whole request (spec 4.1 rule 5).
"""

from __future__ import annotations

import re

# Tried only where a run of local-part characters starts, so a text of them
# without a domain costs one pass, not one per starting position.
_EMAIL = re.compile(r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+")
# A digit, then digits and the separators people write numbers with, then a digit;
# not glued to a letter, digit or decimal point on either side.
_NUMBER = re.compile(r"(?<![\w.])\+?(?:\(\d+\)[\s.-]?)?\d[\d\s().-]{6,22}\d(?![\w]|\.\d)")
_SSN = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])")
_DIGITS = re.compile(r"\d")
_NINE_DIGITS = re.compile(r"(?:\D*\d){9}")  # fewer: no phone number or SSN can be there


def scrub_text(text: str) -> str:
    """`text` with email addresses, phone numbers and SSNs replaced by markers (the same object when none)."""
    if "@" in text:
        text = _EMAIL.sub("[email]", text)
    if _NINE_DIGITS.match(text):
        text = _SSN.sub("[ssn]", text)
        text = _NUMBER.sub(_phone_or_kept, text)
    return text


_CENTS = re.compile(r"\.\d{1,2}$")  # "1 234 567.89": an amount, not a number to call


def _phone_or_kept(match: re.Match[str]) -> str:
    found = match.group()
    digits = len(_DIGITS.findall(found))
    return "[phone]" if 9 <= digits <= 15 and not _CENTS.search(found) else found
