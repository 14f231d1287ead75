"""element.text scrubbing (collector/ingest/scrub.py): a person's details go, the label stays.

The lists are helper-64's: its first version turned dates with times, long
prices, ISBNs, zip codes and size lists into `[phone]`.
"""

from __future__ import annotations

import pytest

from collector.ingest.scrub import MAX_TEXT, scrub_text

KEPT = [
    "Buy now", "Add 2 to cart", "Only $1,299.99", "Kaufen für 1.299,99 €", "Prix : 1 299,99 €",
    "Preis 12.345.678,90 EUR", "₹1,23,45,678.00", "Total: 123,456,789 VND", "¥123,456,789", "1.234.567.890 ₫",
    "Sale ends 2026-11-24", "24.11.2026 14:30", "11/24/2026 2:30 PM", "2026-11-24 14:30:00",
    "Termin: 24.11.2026, 14:30–15:30", "Version 10.15.7", "v2.3.4.5678", "Build 2026.11.24.1", "Order #123456789",
    "Order 1234-5678-90", "Tracking 1Z999AA10123456784", "Tracking 9400 1000 0000 0000 0000 00",
    "ISBN 978-3-16-148410-0", "ISBN 0-306-40615-2", "ISBN 9783161484100", "Ref 2026-000123", "Pay 1 234 567,89 EUR",
    "Pay 1 234 567 EUR", "1 234 567 890 VND", "IBAN DE89 3704 0044 0532 0130 00", "Zip 90210-1234",
    "Invoice INV-2026-0001234", "12:30 - 13:45 - 14:15", "2024 - 2025 - 2026", "1999-2004 2005-2010",
    "Ticket 202611241234", "Seat 12 Row 34 Gate 56 Flight 789", "(2024) (2025) (2026)",
    "Coordinates 52.520008, 13.404954", "Größe 38 - 40 - 42 - 44 - 46", "Sizes 36 38 40 42 44",
    "Items 1 2 3 4 5 6 7 8 9 10", "Page 1 of 123456789", "Model ABC 123 456 789", "第1234567890号",
    "注文番号 123-4567-8901", "Bestellnummer 303-1234567-1234567", "Population: 331,449,281", "Population 331 449 281",
    "Since 1.1.2000 – 31.12.2025", "$1,000,000.00", "1.000.000 Kč", "100 000 000 ₽", "+25% off 2026",
    "SKU 123-456-789", "EAN 4006381333931", "UPC 036000291452", "@handle", "a@b",
    # text outside ASCII that holds no one's details keeps its own characters
    "Sale ends 25.11.2024 10:00", "Termin 31.12.2024 / 01.01.2025",
    "Los 052/042/040/002", "Modell 0589-915-195/0736",  # (helper-142: scrubbed but their last group)
    "Caf\u00e9 \u2013 ouvert 9h\u201318h", "\u6ce8\u6587\u756a\u53f7 \uff11\uff12\uff13\uff14",
    "\uff12\uff10\uff12\uff16\u5e74\uff11\uff11\u6708\uff12\uff14\u65e5", "Seite 1\u202f234", "Zeit 14:30\u201315:30 Uhr",
]

SCRUBBED = [
    ("Email jane.doe@example.com or call +1 415 555 0100", "Email [email] or call [phone]"),
    ("Call 415-555-0100", "Call [phone]"), ("Call +1 (415) 555-0100", "Call [phone]"),
    ("Call 415.555.0100", "Call [phone]"), ("+49 30 12345678", "[phone]"), ("+49 (0)30 1234 5678", "[phone]"),
    ("030 1234567", "[phone]"), ("+33 1 23 45 67 89", "[phone]"), ("01 23 45 67 89", "[phone]"),
    ("07911 123456", "[phone]"), ("+86 138 0013 8000", "[phone]"), ("tel:+14155550100", "tel:[phone]"),
    ("+1 415 555 0100 ext. 23", "[phone] ext. 23"), ("0800 123 4567", "[phone]"),
    ("Tel.: 0 30/12 34 56 78", "Tel.: [phone]"), ("030/12345678", "[phone]"), ("+7 (495) 123-45-67", "[phone]"),
    ("call 555-0100", "call [phone]"), ("0612345678", "[phone]"),
    ("JANE.DOE@EXAMPLE.COM", "[email]"), ("mailto:jane@example.com", "mailto:[email]"),
    ("Reply to j_smith+news@mail.example.co.uk.", "Reply to [email]."), ("SSN 123-45-6789 on file", "SSN [ssn] on file"),
    # helper-128: each was kept in clear
    ("SSN 123 45 6789", "SSN [ssn]"), ("My SSN is 123456789", "My SSN is [ssn]"),
    ("Social Security No. 123456789", "Social Security No. [ssn]"), ("Handy 0151 23456789", "Handy [phone]"),
    ("Mail john\u200b@example.com", "Mail [email]"), ("john\uff20example.com", "[email]"),
    ("john@example\u3002com", "[email]"), ("e\u0301mile@example.com", "[email]"),
    ("\u0647\u0627\u062a\u0641 \u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669", "\u0647\u0627\u062a\u0641 [phone]"),
    ("Call +1\u2011415\u2011555\u20110123", "Call [phone]"),
    ("\uff34\uff45\uff4c: \uff10\uff13\uff10 \uff11\uff12\uff13\uff14\uff15\uff16\uff17", "\uff34\uff45\uff4c: [phone]"),
    # only the finds are replaced; the rest of the label stays as sent (helper-130: it was
    # stored as its reading, a family emoji split in three, x\u00b2 made x2, a Persian word misspelt)
    ("\U0001f468\u200d\U0001f469\u200d\U0001f467 jane\u200b@example.com", "\U0001f468\u200d\U0001f469\u200d\U0001f467 [email]"),
    ("x\u00b2 + y\u00b2, call 030\u20111234567", "x\u00b2 + y\u00b2, call [phone]"),
    ("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \u0627\u06cc\u0645\u06cc\u0644 a\uff20b.co", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \u0627\u06cc\u0645\u06cc\u0644 [email]"),
    ("\ufdfa" * 30 + " tel 030 1234567 END", "\ufdfa" * 30 + " tel [phone] END"),
    ("Mail: e\u0301mile@example.com \u2014 merci", "Mail: [email] \u2014 merci"),    ("SSN 123.45.6789", "SSN [ssn]"), ("SSN 123 - 45 - 6789", "SSN [ssn]"),
    # helper-131: an icon font's U+E000 and a noncharacter stay, an invisible character
    # after a find stays, a character read as several goes with the find, ℡ is a phone word
    ("\ue000 Contact: support\uff20acme.com", "\ue000 Contact: [email]"),
    ("\ufdd0\ufdd1 SSN\uff1a\uff11\uff12\uff13\u2212\uff14\uff15\u2212\uff16\uff17\uff18\uff19", "\ufdd0\ufdd1 SSN\uff1a[ssn]"),
    ("\u202b\u0647\u0627\u062a\u0641: \u0660\u0665\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u202c ok",
     "\u202b\u0647\u0627\u062a\u0641: [phone]\u202c ok"),
    # helper-132: a find in the reading no longer keeps the text as sent from being
    # scrubbed; only full-width forms are read by their compatibility form; a late bracket
    ("support@acme.com \u00b7 Hotline\u00b9 030 1234567", "[email] \u00b7 Hotline\u00b9 [phone]"),
    ("Kontakt: info@acme.de, Fax\u00b2 030 1234567", "Kontakt: [email], Fax\u00b2 [phone]"),
    ("Tel\u2460 030 1234567 jane@example.com", "Tel\u2460 [phone] [email]"),
    ("030 1234567 \u246b Termine", "[phone] \u246b Termine"),
    ("Call +1 415 555 0100 (24/7)", "Call [phone] (24/7)"), ("\u2122jane@example.com", "\u2122[email]"),
    ("+49 301 234 (5678)", "[phone])"),  # (the bracket is not the label's here: scrubbed whole)
    # numbers in a row: a run too long for one, and the rest of one that a find cut short
    ("030 1234567 030 7654321", "[phone] [phone]"), ("Tel: 030 1234567 / 030 7654321", "Tel: [phone] / [phone]"),
    # (helper-137: the shortest first number cut the second in two; the most digits win)
    ("Tel 0612 345 678 / 0612 345 679", "Tel [phone] / [phone]"),
    ("Tel 030 1234567 / 0171 234 5678", "Tel [phone] / [phone]"), ("Tel 415-555-0100 06 12 34 56 78", "Tel [phone] [phone]"),
    ("+49 30 1234567 / 030 1234567", "[phone] / [phone]"), ("Tel. +49 30 1234567 12345 Berlin", "Tel. [phone] 12345 Berlin"),
    ("030 1234567 040 7654321 089 1111111 0221 222222", "[phone] [phone] [phone] [phone]"),
    # what follows a phone number is not one for following it (helper-137)
    ("Tel. 030 123456, 10115 Berlin", "Tel. [phone], 10115 Berlin"), ("+44 20 7946 0958, 31.12.2024", "[phone], 31.12.2024"),
    ("Tel 030 1234567 / 25.11.2024", "Tel [phone] / 25.11.2024"), ("Call +1 415 555 0100, 94105", "Call [phone], 94105"),
    ("+44 20 7946 0958 / 978-3-16-148410-0", "[phone] / 978-3-16-148410-0"),
    ("Tel. 030 1234567 / 08 00 - 20 00", "Tel. [phone] / 08 00 - 20 00"),
    # after a word, numbers of no form of their own, written alike (helper-140: kept whole)
    ("Tlf: 22 33 44 55 / 99 88 77 66", "Tlf: [phone] / [phone]"), ("Tel 13800138000 / 13800138001", "Tel [phone] / [phone]"),
    ("Tel 4711 123456 / 4711 654321", "Tel [phone] / [phone]"),
    ("Tel 030 1234567 / 12/31/2024", "Tel [phone] / 12/31/2024"), ("Tel: 030/1234567", "Tel: [phone]"),
    # (helper-141: my third version kept these whole)
    ("Tel.: 06 12 34 56 78/06 98 76 54 32", "Tel.: [phone]/[phone]"), ("Tlf. 33-12-34-56", "Tlf. [phone]"),
    ("Telefon: 21.34.56.78", "Telefon: [phone]"), ("Tel: +43 1 234 5678 - 0049 30 1234567", "Tel: [phone] - [phone]"),
    ("+33 1 23 45 67 89/33-12-34-56", "[phone]/33-12-34-56"), ("06 12 34 56 78 21.34.56.78", "[phone] 21.34.56.78"),
    ("Tel 06 12 34 56 78 / 06 98 76 54 32 / 07 11 22 33 44", "Tel [phone] / [phone] / [phone]"),
    ("Call 2024-12-31 / 030/4058354", "Call 2024-12-31 / [phone]"),  # (helper-142: kept 4058354)
    ("030 1234567 030 7654321 030 1111111", "[phone] [phone] [phone]"),
    ("Tel: 0301234567 0307654321", "Tel: [phone] [phone]"), ("+49 30 1234567 +49 30 7654321", "[phone] [phone]"),
    ("030 1234567, 030 7654321; 030 1111111", "[phone], [phone]; [phone]"),
    ("Hotline 030 1234567, Mo-Fr 08:00-18:00", "Hotline [phone], Mo-Fr 08:00-18:00"),
    ("Tel. 030 1234567 / 1999-2004", "Tel. [phone] / 1999-2004"), ("Call 030 1234567 ext 1234", "Call [phone] ext 1234"),
    ("Tel: \uff10\uff13\uff10 \uff11\uff12\uff13\uff14\uff15\uff16\uff17 / \uff10\uff13\uff10 \uff17\uff16\uff15\uff14\uff13\uff12\uff11",
     "Tel: [phone] / [phone]"),
    ("\u2121\uff10\uff13\uff0d\uff11\uff12\uff13\uff14\uff0d\uff15\uff16\uff17\uff18", "\u2121[phone]"),
    ("\u96fb\u8a71\uff1a\uff10\uff13\u30fc\uff11\uff12\uff13\uff14\u30fc\uff15\uff16\uff17\uff18", "\u96fb\u8a71\uff1a[phone]"),
]


@pytest.mark.parametrize(("text", "scrubbed"), SCRUBBED)
def test_personal_data_is_replaced_by_a_marker(text: str, scrubbed: str) -> None:
    assert scrub_text(text) == scrubbed


@pytest.mark.parametrize("text", KEPT)
def test_labels_without_personal_data_are_kept_as_they_are(text: str) -> None:
    assert scrub_text(text) == text


def test_markers_never_take_the_text_past_its_limit() -> None:
    text = ("a@b.co " * 80)[:511]  # each 6-character address becomes the 7-character marker
    assert len(scrub_text(text)) == MAX_TEXT
