"""Monthly usage policy and the admission decision (spec 3, 6.2, 7.2, 8.3, 8.4).

Pure: the admitting transaction reads the counters, calls `decide`, and
writes the new counters only when the decision admits the batch.

How we read the spec's constants (also in the README):
- Included allowances come from the package table of 8.2 (free = Explore,
  paid = Pro), replaced by the account's `contract` values where given.
- The plan is the billing account's (paid when any of its keys is paid;
  see tenants_admin), since the allowances it sets are pooled per account.
- Pageview ceiling (`X-Service-Budget-Ceiling`): the included allowance while
  overage is off (8.3: "equals the allowance with overage off"; a contract
  lowers it through `monthlyPageviews`, its `pageviewCeiling` applies only with
  overage on); with overage on (paid accounts only) the default safety
  ceiling of 8.4, "twice the lower-tier allowance", read as twice the
  allowance of the tier the account is on (the tier below the overage tier,
  where overage starts): Pro 2 x 25,000 = 50,000, which a contract's
  `pageviewCeiling` replaces.
- Signals Coverage: `full` while the units used are within the included units
  (within the coverage safety ceiling instead while paid overage is on), and
  never past that ceiling (spec 3: "or safety ceiling reached"); `degraded`
  beyond. Accepted non-pageview events are refused with
  `accepted_event_safety_ceiling_reached` only past the coverage safety
  ceiling, by default twice the included units (contract `coverageCeiling`
  replaces it).
"""

from __future__ import annotations

import enum
import time

import msgspec

from collector.access.tenants import Contract, KeyRecord, Plan


class BillingMode(enum.StrEnum):
    FULL = "full"
    METERED_OVERAGE = "metered_overage"
    BLOCKED = "blocked"


class CoverageMode(enum.StrEnum):
    FULL = "full"
    DEGRADED = "degraded"


PACKAGES: dict[Plan, tuple[int, int]] = {
    # plan: (human pageviews per month, Signals Coverage units per month)
    Plan.FREE: (5_000, 25_000),
    Plan.PAID: (25_000, 250_000),
}

PAGEVIEW_UNIT = "pageview"
COVERAGE_UNIT = "coverage"
UNITS = (PAGEVIEW_UNIT, COVERAGE_UNIT)  # every unit a usage counter meters (not the overage counters)


class UsagePolicy(msgspec.Struct, frozen=True):
    account: str
    plan: Plan
    overage: bool  # paid overage actually in force
    pageview_included: int
    pageview_ceiling: int
    coverage_included: int
    coverage_ceiling: int


def policy_for(key: KeyRecord) -> UsagePolicy:
    plan = key.accountPlan if key.accountTerms and key.accountPlan is not None else key.normalized_plan
    pageviews, coverage = PACKAGES[plan]
    contract = account_contract(key)
    if contract is not None:
        pageviews = contract.monthlyPageviews if contract.monthlyPageviews is not None else pageviews
        coverage = contract.signalsCoverage if contract.signalsCoverage is not None else coverage
    overage = (key.accountOverage if key.accountTerms else key.overage) and plan is Plan.PAID
    pageview_ceiling = 2 * pageviews if overage else pageviews
    coverage_ceiling = 2 * coverage
    if contract is not None:
        if contract.pageviewCeiling is not None and overage:
            # (With overage off the hard stop is the allowance itself, spec 8.3.)
            pageview_ceiling = contract.pageviewCeiling
        if contract.coverageCeiling is not None:
            coverage_ceiling = contract.coverageCeiling
    return UsagePolicy(
        account=key.billing_account,
        plan=plan,
        overage=overage,
        pageview_included=pageviews,
        pageview_ceiling=pageview_ceiling,
        coverage_included=coverage,
        coverage_ceiling=coverage_ceiling,
    )


def account_contract(key: KeyRecord) -> Contract | None:
    """The contract of the key's billing account (operator contract: `contract` and
    `overage` belong to the account); records imported before the account's terms
    were kept carry only their own."""
    return key.accountContract if key.accountTerms else key.contract


def term_notes(key: KeyRecord) -> list[str]:
    """What the terms of the key's billing account do that its contract does not say.

    A contract ceiling that does nothing (pageviewCeiling with overage off) or
    that stops the account before its allowance can be reached. Notes, not
    refusals: such a file was accepted before, and `serve --tenants` must
    still start on it.
    """
    contract, policy = account_contract(key), policy_for(key)
    if contract is None:
        return []
    notes, account = [], key.billing_account
    if contract.pageviewCeiling is not None and not policy.overage:
        notes.append(f"billing account {account!r} has a contract pageviewCeiling but overage off:"
                     " the stop is its allowance (spec 8.3); set monthlyPageviews to change it")
    elif contract.pageviewCeiling is not None and policy.pageview_ceiling < policy.pageview_included:
        notes.append(f"billing account {account!r} has a contract pageviewCeiling of {policy.pageview_ceiling},"
                     f" below its {policy.pageview_included} included pageviews (monthlyPageviews): it is"
                     " refused (safety_ceiling_reached) before it reaches its allowance")
    if contract.coverageCeiling is not None and policy.coverage_ceiling < policy.coverage_included:
        notes.append(f"billing account {account!r} has a contract coverageCeiling of {policy.coverage_ceiling},"
                     f" below its {policy.coverage_included} included coverage units (signalsCoverage): its"
                     " reads are degraded and its non-pageview events refused (accepted_event_safety_ceiling_reached)"
                     " before it reaches its allowance")
    return notes


class UsageSnapshot(msgspec.Struct, frozen=True):
    """Meter state after a request's own admission: what the headers report."""

    period: str
    pageviews_used: int
    coverage_used: int
    pageviews_attempted: int
    coverage_attempted: int
    billing_mode: BillingMode
    coverage_mode: CoverageMode


class UsageRefusal(msgspec.Struct, frozen=True):
    """A billing stop: the batch is refused whole and nothing is counted."""

    code: str  # usage_limit_exceeded | accepted_event_safety_ceiling_reached
    reason: str  # included_limit_reached | safety_ceiling_reached
    period: str
    used: int
    included: int
    ceiling: int
    attempted: int
    upgrade_required: bool


def billing_period(now_ms: int) -> str:
    """The UTC month of `now_ms` as YYYY-MM."""
    return time.strftime("%Y-%m", time.gmtime(now_ms / 1000))


def _pageview_mode(policy: UsagePolicy, used: int) -> BillingMode:
    if used > policy.pageview_ceiling:  # only after the terms were lowered mid-period
        return BillingMode.BLOCKED
    if used <= policy.pageview_included:
        return BillingMode.FULL
    return BillingMode.METERED_OVERAGE if policy.overage else BillingMode.BLOCKED


def _full_coverage_limit(policy: UsagePolicy) -> int:
    """The most coverage units that still leave the coverage mode `full`."""
    if policy.overage:
        return policy.coverage_ceiling
    return min(policy.coverage_included, policy.coverage_ceiling)


def _coverage_mode(policy: UsagePolicy, used: int) -> CoverageMode:
    return CoverageMode.FULL if used <= _full_coverage_limit(policy) else CoverageMode.DEGRADED


def decide(
    policy: UsagePolicy,
    period: str,
    *,
    used_pageviews: int,
    used_coverage: int,
    add_pageviews: int,
    add_coverage: int,
) -> UsageSnapshot | UsageRefusal:
    """Admit the whole batch's units or refuse it whole (spec 4.1 rule 6)."""
    pageviews = used_pageviews + add_pageviews
    if add_pageviews and pageviews > policy.pageview_ceiling:
        return UsageRefusal(
            code="usage_limit_exceeded",
            reason="safety_ceiling_reached" if policy.overage else "included_limit_reached",
            period=period,
            used=used_pageviews,
            included=policy.pageview_included,
            ceiling=policy.pageview_ceiling,
            attempted=add_pageviews,
            upgrade_required=policy.plan is Plan.FREE,
        )
    coverage = used_coverage + add_coverage
    if add_coverage and coverage > policy.coverage_ceiling:
        return UsageRefusal(
            code="accepted_event_safety_ceiling_reached",
            reason="safety_ceiling_reached",
            period=period,
            used=used_coverage,
            included=policy.coverage_included,
            ceiling=policy.coverage_ceiling,
            attempted=add_coverage,
            upgrade_required=policy.plan is Plan.FREE,
        )
    return UsageSnapshot(
        period=period,
        pageviews_used=pageviews,
        coverage_used=coverage,
        pageviews_attempted=add_pageviews,
        coverage_attempted=add_coverage,
        billing_mode=_pageview_mode(policy, pageviews),
        coverage_mode=_coverage_mode(policy, coverage),
    )


def current_snapshot(policy: UsagePolicy, period: str, *, pageviews: int, coverage: int) -> UsageSnapshot:
    """The meter state without admitting anything (a request with nothing new)."""
    return UsageSnapshot(
        period=period,
        pageviews_used=pageviews,
        coverage_used=coverage,
        pageviews_attempted=0,
        coverage_attempted=0,
        billing_mode=_pageview_mode(policy, pageviews),
        coverage_mode=_coverage_mode(policy, coverage),
    )


def coverage_read_allowed(policy: UsagePolicy, used: int, units: int) -> bool:
    """May a signals read spend `units` more (spec 3: otherwise it is degraded)?

    Within the included units, or within the coverage safety ceiling while
    paid overage is on, and never past that ceiling: the same limit as the
    coverage mode, so a read is full exactly when the mode after it is.
    """
    return used + units <= _full_coverage_limit(policy)
