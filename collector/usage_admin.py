"""Operator views of usage: `collector usage show` and `collector usage invoice` (spec 8.4)."""

from __future__ import annotations

import math
import time

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


class UnitUsage(msgspec.Struct, frozen=True):
    account: str
    period: str
    unit: str
    used: int
    included: int
    ceiling: int
    mode: str


class InvoiceLine(msgspec.Struct, frozen=True):
    account: str
    period: str
    unit: str
    used: int
    included: int
    overage: int
    blocks: int
    block_size: int
    block_price_usd: int
    amount_usd: int


def account_policies(storage: Storage) -> dict[str, UsagePolicy]:
    """One policy per billing account, from its first live key (keys of one account agree)."""
    policies: dict[str, UsagePolicy] = {}
    records: list[KeyRecord] = sorted(list_records(storage), key=lambda r: (bool(r.revokedAt), r.key))
    for record in records:
        policies.setdefault(record.billing_account, policy_for(record))
    return policies


def usage_rows(storage: Storage, *, account: str | None = None, period: str | None = None) -> list[UnitUsage]:
    period = period or billing_period(int(time.time() * 1000))
    rows = []
    for name, policy in sorted(account_policies(storage).items()):
        if account and name != account:
            continue
        pageviews = counters.read_counter(storage, name, period, PAGEVIEW_UNIT)
        coverage = counters.read_counter(storage, name, period, COVERAGE_UNIT)
        snapshot = current_snapshot(policy, period, pageviews=pageviews, coverage=coverage)
        rows.append(UnitUsage(name, period, PAGEVIEW_UNIT, pageviews, policy.pageview_included,
                              policy.pageview_ceiling, snapshot.billing_mode.value))
        rows.append(UnitUsage(name, period, COVERAGE_UNIT, coverage, policy.coverage_included,
                              policy.coverage_ceiling, snapshot.coverage_mode.value))
    return rows


def invoice_lines(storage: Storage, period: str) -> list[InvoiceLine]:
    """Overage priced in whole blocks, for accounts with paid overage on."""
    lines = []
    policies = account_policies(storage)
    for row in usage_rows(storage, period=period):
        policy = policies[row.account]
        if not policy.overage:
            continue
        overage = max(0, row.used - row.included)
        size, price = (
            (PAGEVIEW_BLOCK, PAGEVIEW_BLOCK_USD) if row.unit == PAGEVIEW_UNIT else (COVERAGE_BLOCK, COVERAGE_BLOCK_USD)
        )
        blocks = math.ceil(overage / size)
        lines.append(InvoiceLine(row.account, period, row.unit, row.used, row.included, overage,
                                 blocks, size, price, blocks * price))
    return lines
