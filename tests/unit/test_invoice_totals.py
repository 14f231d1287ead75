"""Spec 8.4's interim invoice threshold on `usage invoice`'s per-account totals."""

from __future__ import annotations

import calendar

from collector.usage_admin import AccountTotal, InvoiceLine, account_totals


def _line(account: str, unit: str, amount: int) -> InvoiceLine:
    return InvoiceLine(account, "2026-11", unit, 0, 0, 0, 0, 1, amount, amount)


def test_an_open_period_owing_the_threshold_is_due_an_interim_invoice() -> None:
    lines = [_line("a", "pageview", 50), _line("a", "coverage", 170), _line("b", "pageview", 0),
             _line("c", "coverage", 20)]
    during = calendar.timegm((2026, 11, 20, 0, 0, 0)) * 1000
    assert account_totals(lines, "2026-11", during) == [
        AccountTotal("a", "2026-11", 220, True),
        AccountTotal("c", "2026-11", 20, False),  # under 25 USD
    ]
    # once the month has closed, the invoice is the month's own: no interim one
    after = calendar.timegm((2026, 12, 1, 0, 0, 0)) * 1000
    assert [total.interim_invoice_due for total in account_totals(lines, "2026-11", after)] == [False, False]
