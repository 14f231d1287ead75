"""Operator views of usage: `collector usage show` and `collector usage invoice` (spec 8.4)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgspec

from collector.access.tenants import KeyRecord
from collector.limits.usage import (
    COVERAGE_UNIT,
    PAGEVIEW_UNIT,
    UNITS,
    UsagePolicy,
    billing_period,
    current_snapshot,
    policy_for,
)
from collector.tenants_admin import list_records
from storage import counters
from storage.env import Storage

PAGEVIEW_BLOCK, PAGEVIEW_BLOCK_USD = 100_000, 50
COVERAGE_BLOCK, COVERAGE_BLOCK_USD = 1_000_000, 170


class AccountTotal(msgspec.Struct, frozen=True):
    """What an account owes for a period's overage, all units together."""

    account: str
    period: str
    account_total_usd: int


def account_totals(lines: list[InvoiceLine], period: str) -> list[AccountTotal]:
    """One total per account that owes something in `period`.

    (Spec 8.4's 25 USD interim invoice threshold is passed by any overage at
    all, priced in whole 50 and 170 USD blocks: an open period's total that is
    not zero is due an interim invoice. Which invoices were issued is the
    billing system's record, not the collector's.)
    """
    owed: dict[str, int] = {}
    for line in lines:
        owed[line.account] = owed.get(line.account, 0) + line.amount_usd
    return [AccountTotal(account, period, amount) for account, amount in sorted(owed.items()) if amount]


class UnitUsage(msgspec.Struct, frozen=True):
    account: str
    period: str
    unit: str
    used: int
    included: int | None  # None: no key of the account is left to say its terms
    ceiling: int | None
    mode: str  # "unknown" with them


class InvoiceLine(msgspec.Struct, frozen=True):
    account: str
    period: str
    unit: str
    used: int
    included: int | None
    overage: int
    blocks: int
    block_size: int
    block_price_usd: int
    amount_usd: int


Unreadable = Callable[[str, Exception], None]


def account_policies(storage: Storage, on_unreadable: Unreadable | None = None) -> dict[str, UsagePolicy]:
    """One policy per billing account, from its first live key (keys of one account agree).

    A key record that does not decode goes to `on_unreadable` (see list_records).
    """
    policies: dict[str, UsagePolicy] = {}
    records: list[KeyRecord] = sorted(
        list_records(storage, on_unreadable), key=lambda r: (bool(r.revokedAt), r.key)
    )
    for record in records:
        policies.setdefault(record.billing_account, policy_for(record))
    return policies


class PeriodCounters(msgspec.Struct, frozen=True):
    used: dict[tuple[str, str], int]  # (account, kind) -> units, of every readable counter
    damaged: list[counters.DamagedCounter]  # those that may be the period's: never read as 0


def _period_counters(storage: Storage, period: str) -> PeriodCounters:
    used: dict[tuple[str, str], int] = {}
    damaged: list[counters.DamagedCounter] = []
    for account, stored, kind, units in counters.iter_counters(storage, on_damaged=damaged.append):
        if stored == period:
            used[(account, kind)] = units
    return PeriodCounters(used, [row for row in damaged if row.period in (None, period)])


def usage_rows(
    storage: Storage,
    *,
    account: str | None = None,
    period: str | None = None,
    on_unreadable: Unreadable | None = None,
    on_damaged_counter: Unreadable | None = None,
) -> list[UnitUsage]:
    """Every account with a key or with usage in the period: an account no key names any
    more (its keys moved to another) still shows what it used.

    A counter of the period that cannot be read goes to `on_damaged_counter`
    (its name, the problem) and its row is left out: used 0 would be a guess.
    """
    period = period or billing_period(int(time.time() * 1000))
    policies = account_policies(storage, on_unreadable)
    stored = _period_counters(storage, period)
    left_out = _rows_left_out(stored.damaged, account, on_damaged_counter)
    rows = _rows(policies, stored.used, period, account)
    return [row for row in rows if (row.account, row.unit) not in left_out]


def _rows_left_out(
    damaged: list[counters.DamagedCounter], account: str | None, on_damaged: Unreadable | None
) -> set[tuple[str, str]]:
    """(account, unit) of the rows `damaged` leaves unknown; each damaged counter of the
    listed accounts is reported."""
    left_out: set[tuple[str, str]] = set()
    overage = {unit + counters.OVERAGE_SUFFIX for unit in UNITS}
    for row in damaged:
        if account is not None and row.account not in (None, account):
            continue  # not an account this listing shows
        if row.kind in overage:
            # Not read here (the row is right), but the service refuses the account's
            # overage until it is repaired: the operator must hear of it (helper-72).
            _report(on_damaged, row, "the account's overage past its allowance is refused until it is repaired")
            continue
        if row.kind not in (None, *UNITS):
            continue  # not a usage counter
        if row.account is not None:
            units = UNITS if row.kind is None else (row.kind,)
            left_out |= {(row.account, unit) for unit in units}
            consequence = f"its row of account {row.account!r} is left out"
        else:
            consequence = "an account's row may be missing or short"
        _report(on_damaged, row, consequence)
    return left_out


def _report(on_damaged: Unreadable | None, damaged: counters.DamagedCounter, consequence: str) -> None:
    if on_damaged is not None:
        on_damaged(damaged.name, ValueError(f"{damaged.problem}; {consequence}"))


def _rows(
    policies: dict[str, UsagePolicy], stored: dict[tuple[str, str], int], period: str, account: str | None = None
) -> list[UnitUsage]:
    names = set(policies) | {name for name, kind in stored if kind in UNITS}
    rows = []
    for name in sorted(names):
        if account is not None and name != account:
            continue
        pageviews = stored.get((name, PAGEVIEW_UNIT), 0)
        coverage = stored.get((name, COVERAGE_UNIT), 0)
        policy = policies.get(name)
        if policy is None:
            rows.append(UnitUsage(name, period, PAGEVIEW_UNIT, pageviews, None, None, "unknown"))
            rows.append(UnitUsage(name, period, COVERAGE_UNIT, coverage, None, None, "unknown"))
            continue
        snapshot = current_snapshot(policy, period, pageviews=pageviews, coverage=coverage)
        rows.append(UnitUsage(name, period, PAGEVIEW_UNIT, pageviews, policy.pageview_included,
                              policy.pageview_ceiling, snapshot.billing_mode.value))
        rows.append(UnitUsage(name, period, COVERAGE_UNIT, coverage, policy.coverage_included,
                              policy.coverage_ceiling, snapshot.coverage_mode.value))
    return rows


def invoice_lines(
    storage: Storage,
    period: str,
    on_unreadable: Unreadable | None = None,
    on_damaged_counter: Unreadable | None = None,
) -> list[InvoiceLine]:
    """Overage priced in whole blocks (spec 8.4).

    The overage billed is what was served as overage: the units admitted
    beyond the included ones while paid overage was on, counted as they were
    admitted (`<unit>_overage` counters), so terms changed later (overage
    switched off, a new contract, the account's keys moved away) do not
    rewrite a past period. A period metered before those counters existed
    has none: it is priced with the account's current terms, as before (in
    the month of an upgrade the counter starts from that figure). In a later
    period a missing counter means that no overage was served.

    A counter of the period that cannot be read goes to `on_damaged_counter`
    (its name, the problem), and its account is left out of the invoice
    altogether: a line or total priced as if it were 0 would bill short, and
    one billed from part of its lines too.
    """
    lines = []
    policies = account_policies(storage, on_unreadable)
    stored = _period_counters(storage, period)
    left_out = _accounts_left_out(stored.damaged, on_damaged_counter)
    began = counters.overage_counted_from(storage)
    counted = began is not None and period > began  # a missing counter then means no overage served
    for row in _rows(policies, stored.used, period):
        if row.account in left_out:
            continue
        policy = policies.get(row.account)
        served = stored.used.get((row.account, row.unit + counters.OVERAGE_SUFFIX))
        if served is not None:
            overage = served
        elif policy is not None and policy.overage and row.included is not None:
            overage = 0 if counted else max(0, row.used - row.included)
        else:
            continue
        size, price = (
            (PAGEVIEW_BLOCK, PAGEVIEW_BLOCK_USD) if row.unit == PAGEVIEW_UNIT else (COVERAGE_BLOCK, COVERAGE_BLOCK_USD)
        )
        blocks = math.ceil(overage / size)
        lines.append(InvoiceLine(row.account, period, row.unit, row.used, row.included, overage,
                                 blocks, size, price, blocks * price))
    return lines


def _accounts_left_out(damaged: list[counters.DamagedCounter], on_damaged: Unreadable | None) -> set[str]:
    """The accounts of `damaged`, which an invoice cannot price; each damaged counter is reported."""
    left_out: set[str] = set()
    for row in damaged:
        if row.account is not None:
            left_out.add(row.account)
            consequence = f"account {row.account!r} is left out of the invoice"
        else:
            consequence = "the account it counts is unknown and may be billed short"
        _report(on_damaged, row, consequence)
    return left_out
