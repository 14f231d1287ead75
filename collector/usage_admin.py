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


def _period_counters(storage: Storage, period: str) -> dict[tuple[str, str], int]:
    """(account, kind) -> units of every readable counter of `period`."""
    return {(account, kind): used for account, stored, kind, used in counters.iter_counters(storage)
            if stored == period}


def usage_rows(
    storage: Storage,
    *,
    account: str | None = None,
    period: str | None = None,
    on_unreadable: Unreadable | None = None,
) -> list[UnitUsage]:
    """Every account with a key or with usage in the period: an account no key names any
    more (its keys moved to another) still shows what it used."""
    period = period or billing_period(int(time.time() * 1000))
    policies = account_policies(storage, on_unreadable)
    return _rows(policies, _period_counters(storage, period), period, account)


def _rows(
    policies: dict[str, UsagePolicy], stored: dict[tuple[str, str], int], period: str, account: str | None = None
) -> list[UnitUsage]:
    names = set(policies) | {name for name, kind in stored if kind in (PAGEVIEW_UNIT, COVERAGE_UNIT)}
    rows = []
    for name in sorted(names):
        if account and name != account:
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


def invoice_lines(storage: Storage, period: str, on_unreadable: Unreadable | None = None) -> list[InvoiceLine]:
    """Overage priced in whole blocks (spec 8.4).

    The overage billed is what was served as overage: the units admitted
    beyond the included ones while paid overage was on, counted as they were
    admitted (`<unit>_overage` counters), so terms changed later (overage
    switched off, a new contract, the account's keys moved away) do not
    rewrite a past period. A period metered before those counters existed
    has none: it is priced with the account's current terms, as before (in
    the month of an upgrade the counter starts from that figure). In a later
    period a missing counter means that no overage was served.
    """
    lines = []
    policies = account_policies(storage, on_unreadable)
    stored = _period_counters(storage, period)
    began = counters.overage_counted_from(storage)
    counted = began is not None and period > began  # a missing counter then means no overage served
    for row in _rows(policies, stored, period):
        policy = policies.get(row.account)
        served = stored.get((row.account, row.unit + counters.OVERAGE_SUFFIX))
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
