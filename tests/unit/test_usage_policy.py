"""The usage policy and admission decision (spec 3, 7.2, 8.2, 8.4), pure."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.access.tenants import Contract, KeyRecord
from collector.limits.usage import (
    BillingMode,
    CoverageMode,
    UsageRefusal,
    UsageSnapshot,
    billing_period,
    coverage_read_allowed,
    decide,
    policy_for,
    term_notes,
)


def key(**fields: object) -> KeyRecord:
    return msgspec.convert({"key": "cs_live_x0000000", "clientId": "acme", **fields}, KeyRecord)


def test_package_allowances_and_ceilings() -> None:
    free = policy_for(key(plan="free"))
    assert (free.pageview_included, free.pageview_ceiling) == (5_000, 5_000)
    assert (free.coverage_included, free.coverage_ceiling) == (25_000, 50_000)
    assert free.overage is False
    paid = policy_for(key(plan="paid"))
    assert (paid.pageview_included, paid.pageview_ceiling) == (25_000, 25_000)
    # "twice the lower-tier allowance": with overage on, twice the account's own tier allowance
    paid_overage = policy_for(key(plan="paid", overage=True))
    assert (paid_overage.pageview_ceiling, paid_overage.coverage_ceiling) == (50_000, 500_000)
    assert paid_overage.overage is True
    # free accounts never get paid overage, whatever the flag says
    assert policy_for(key(plan="free", overage=True)).overage is False


def test_contract_replaces_package_values() -> None:
    policy = policy_for(key(plan="paid", overage=True, contract=Contract(monthlyPageviews=10, pageviewCeiling=12)))
    assert (policy.pageview_included, policy.pageview_ceiling) == (10, 12)
    assert policy.coverage_included == 250_000


def test_with_overage_off_the_stop_is_the_allowance() -> None:
    # Spec 8.3: the Budget-Ceiling "equals the allowance with overage off".
    for ceiling in (8, 3):
        policy = policy_for(key(plan="paid", contract=Contract(monthlyPageviews=5, pageviewCeiling=ceiling)))
        assert policy.pageview_ceiling == 5
        refused = decide(policy, "p", used_pageviews=5, used_coverage=0, add_pageviews=1, add_coverage=0)
        assert isinstance(refused, UsageRefusal) and refused.reason == "included_limit_reached"


@given(
    used=st.integers(0, 20),
    add=st.integers(1, 5),
    overage=st.booleans(),
    allowance=st.integers(0, 12),
    ceiling=st.integers(0, 15) | st.none(),
)
def test_an_admitted_batch_never_reports_blocked(
    used: int, add: int, overage: bool, allowance: int, ceiling: int | None
) -> None:
    policy = policy_for(
        key(plan="paid", overage=overage, contract=Contract(monthlyPageviews=allowance, pageviewCeiling=ceiling))
    )
    verdict = decide(policy, "p", used_pageviews=used, used_coverage=0, add_pageviews=add, add_coverage=0)
    if isinstance(verdict, UsageSnapshot):
        assert verdict.billing_mode is not BillingMode.BLOCKED
        assert verdict.pageviews_used <= policy.pageview_ceiling


def test_coverage_is_full_up_to_the_allowance_and_never_past_the_ceiling() -> None:
    free = policy_for(key(plan="free", contract=Contract(signalsCoverage=2, coverageCeiling=3)))
    at = decide(free, "p", used_pageviews=0, used_coverage=0, add_pageviews=0, add_coverage=2)
    assert isinstance(at, UsageSnapshot) and at.coverage_mode is CoverageMode.FULL
    assert coverage_read_allowed(free, 1, 1) and not coverage_read_allowed(free, 2, 1)
    # a ceiling below the allowance ends full coverage there (spec 3: "or safety ceiling reached")
    low = policy_for(key(plan="paid", contract=Contract(signalsCoverage=10, coverageCeiling=4)))
    assert coverage_read_allowed(low, 3, 1) and not coverage_read_allowed(low, 4, 1)
    at_ceiling = decide(low, "p", used_pageviews=0, used_coverage=0, add_pageviews=0, add_coverage=4)
    assert isinstance(at_ceiling, UsageSnapshot) and at_ceiling.coverage_mode is CoverageMode.FULL
    low_overage = policy_for(key(plan="paid", overage=True, contract=Contract(signalsCoverage=10, coverageCeiling=4)))
    assert not coverage_read_allowed(low_overage, 4, 1)


def test_the_account_plan_decides_metering() -> None:
    # A free key of an account whose plan (set by the import) is paid meters on the paid package.
    policy = policy_for(key(plan="free", overage=True, accountTerms=True, accountOverage=True, accountPlan="paid"))
    assert (policy.plan.value, policy.overage, policy.pageview_included) == ("paid", True, 25_000)


def test_billing_account_pools() -> None:
    assert policy_for(key(billingAccount="parent")).account == "parent"
    assert policy_for(key()).account == "acme"


def test_old_plan_values_are_normalised() -> None:
    assert policy_for(key(plan="Pro")).pageview_included == 25_000
    assert policy_for(key(plan="explore")).pageview_included == 5_000


def test_modes_and_refusals() -> None:
    free = policy_for(key(plan="free"))
    ok = decide(free, "2026-11", used_pageviews=4_975, used_coverage=0, add_pageviews=25, add_coverage=0)
    assert isinstance(ok, UsageSnapshot) and ok.billing_mode is BillingMode.FULL
    refused = decide(free, "2026-11", used_pageviews=4_976, used_coverage=0, add_pageviews=25, add_coverage=0)
    assert isinstance(refused, UsageRefusal)
    assert (refused.code, refused.reason, refused.upgrade_required) == (
        "usage_limit_exceeded",
        "included_limit_reached",
        True,
    )
    assert (refused.used, refused.included, refused.ceiling, refused.attempted) == (4_976, 5_000, 5_000, 25)

    paid = policy_for(key(plan="paid", overage=True))
    over = decide(paid, "2026-11", used_pageviews=25_000, used_coverage=0, add_pageviews=1, add_coverage=0)
    assert isinstance(over, UsageSnapshot) and over.billing_mode is BillingMode.METERED_OVERAGE
    stop = decide(paid, "2026-11", used_pageviews=50_000, used_coverage=0, add_pageviews=1, add_coverage=0)
    assert isinstance(stop, UsageRefusal) and stop.reason == "safety_ceiling_reached"
    assert stop.upgrade_required is False


def test_coverage_degrades_then_stops() -> None:
    free = policy_for(key(plan="free"))
    degraded = decide(free, "p", used_pageviews=0, used_coverage=25_000, add_pageviews=0, add_coverage=1)
    assert isinstance(degraded, UsageSnapshot) and degraded.coverage_mode is CoverageMode.DEGRADED
    stop = decide(free, "p", used_pageviews=0, used_coverage=50_000, add_pageviews=0, add_coverage=1)
    assert isinstance(stop, UsageRefusal) and stop.code == "accepted_event_safety_ceiling_reached"


def test_nothing_new_is_never_refused() -> None:
    free = policy_for(key(plan="free"))
    verdict = decide(free, "p", used_pageviews=5_000, used_coverage=50_000, add_pageviews=0, add_coverage=0)
    assert isinstance(verdict, UsageSnapshot)


def test_billing_period_is_the_utc_month() -> None:
    assert billing_period(1_764_547_199_999) == "2025-11"  # 2025-11-30T23:59:59.999Z
    assert billing_period(1_764_547_200_000) == "2025-12"


@given(
    used=st.integers(0, 60_000),
    add=st.integers(0, 25),
    overage=st.booleans(),
    plan=st.sampled_from(["free", "paid"]),
)
def test_never_admits_past_the_ceiling(used: int, add: int, overage: bool, plan: str) -> None:
    policy = policy_for(key(plan=plan, overage=overage))
    verdict = decide(policy, "p", used_pageviews=used, used_coverage=0, add_pageviews=add, add_coverage=0)
    if isinstance(verdict, UsageSnapshot):
        assert verdict.pageviews_used <= max(policy.pageview_ceiling, used)
    else:
        assert used + add > policy.pageview_ceiling


@pytest.mark.parametrize("month", ["2026-01", "2026-12"])
def test_period_format(month: str) -> None:
    import calendar

    year, mon = map(int, month.split("-"))
    assert billing_period(calendar.timegm((year, mon, 1, 0, 0, 0)) * 1000) == month


def test_a_contract_ceiling_below_the_allowance_is_noted_with_both_numbers() -> None:
    # The allowance can never be reached: `tenants import` and `serve` say so (review helper-70 #2).
    low = Contract(monthlyPageviews=20, pageviewCeiling=10, signalsCoverage=10, coverageCeiling=5)
    notes = term_notes(key(plan="paid", overage=True, contract=low))
    assert [note.split(":")[0] for note in notes] == [
        "billing account 'acme' has a contract pageviewCeiling of 10, below its 20 included pageviews (monthlyPageviews)",
        "billing account 'acme' has a contract coverageCeiling of 5, below its 10 included coverage units"
        " (signalsCoverage)",
    ]
    # With overage off the pageview ceiling does nothing (its own note); the coverage ceiling still stops.
    notes = term_notes(key(plan="paid", contract=low))
    assert ["overage off" in note for note in notes] == [True, False]
    # The plan's package counts as the allowance too; at or above it, nothing to say.
    assert "below its 25000 included pageviews" in term_notes(
        key(plan="paid", overage=True, contract=Contract(pageviewCeiling=24_999)))[0]
    for fine in (Contract(monthlyPageviews=20, pageviewCeiling=20, signalsCoverage=10, coverageCeiling=10),
                 Contract(monthlyPageviews=20)):
        assert term_notes(key(plan="paid", overage=True, contract=fine)) == []
    assert term_notes(key(plan="paid", overage=True)) == []
