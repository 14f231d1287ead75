"""`usage invoice`'s per-account totals."""

from __future__ import annotations

from collector.usage_admin import AccountTotal, InvoiceLine, account_totals


def _line(account: str, unit: str, amount: int) -> InvoiceLine:
    return InvoiceLine(account, "2026-11", unit, 0, 0, 0, 0, 1, amount, amount)


def test_one_total_per_account_that_owes_something() -> None:
    lines = [_line("b", "pageview", 50), _line("b", "coverage", 170), _line("a", "pageview", 0),
             _line("c", "coverage", 170)]
    assert account_totals(lines, "2026-11") == [
        AccountTotal("b", "2026-11", 220),
        AccountTotal("c", "2026-11", 170),
    ]
