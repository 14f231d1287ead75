"""Usage headers (spec 8.3), the billing body block (2.5), CORS (spec 8.3 exposure)."""

from __future__ import annotations

from collector.limits.usage import UsagePolicy, UsageRefusal, UsageSnapshot

# Spec 8.3: the eleven usage headers, Retry-After and the X-RateLimit-* set are
# exposed to cross-origin scripts; X-Service-Budget-Type deliberately is not.
EXPOSED_HEADERS = ", ".join(
    (
        "X-Service-Billing-Period",
        "X-Service-Monthly-Limit",
        "X-Service-Monthly-Used",
        "X-Service-Billing-Mode",
        "X-Service-Budget-Ceiling",
        "X-Service-Signals-Coverage-Period",
        "X-Service-Signals-Coverage-Limit",
        "X-Service-Signals-Coverage-Used",
        "X-Service-Signals-Coverage-Ceiling",
        "X-Service-Signals-Coverage-Mode",
        "X-Service-Signals-Coverage-Reserved-Units",
        "Retry-After",
        "X-RateLimit-Limit",
        "X-RateLimit-Burst-Limit",
        "X-RateLimit-Policy",
        "X-RateLimit-Scope",
        "X-RateLimit-Unit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Burst-Remaining",
        "X-RateLimit-Reset",
        "X-Request-ID",
    )
)

ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = ", ".join(
    (
        "Content-Type",
        "Content-Encoding",
        "X-API-Key",
        "Idempotency-Key",
        "X-Request-ID",
        "X-CS-Timestamp",
        "X-CS-Signature",
    )
)


def cors_headers(origin: str | None) -> list[tuple[str, str]]:
    """Headers that let a browser script at `origin` read the response.

    Credentials are allowed: `navigator.sendBeacon` always sends in credentials
    mode "include", and a beacon whose Blob is typed application/json (so
    preflighted) was dropped by the browser, silently, without this on its
    preflight; a `fetch(..., {credentials: "include"})` was stored and then
    reported failed (helper-117). It grants nothing: the collector authorises by
    key and domain gate and never reads a cookie, and the operational routes,
    which trust a client's network, send no CORS headers at all.
    """
    if not origin:
        return []
    return [
        ("Access-Control-Allow-Origin", origin),
        ("Access-Control-Allow-Credentials", "true"),
        ("Access-Control-Expose-Headers", EXPOSED_HEADERS),
        ("Vary", "Origin"),
    ]


def preflight_headers(origin: str | None) -> list[tuple[str, str]]:
    if not origin:
        return []
    return [
        ("Access-Control-Allow-Origin", origin),
        ("Access-Control-Allow-Credentials", "true"),  # (see cors_headers)
        ("Access-Control-Allow-Methods", ALLOWED_METHODS),
        ("Access-Control-Allow-Headers", ALLOWED_HEADERS),
        ("Access-Control-Max-Age", "86400"),
        ("Vary", "Origin, Access-Control-Request-Headers"),
    ]


def usage_headers(policy: UsagePolicy, usage: UsageSnapshot) -> list[tuple[str, str]]:
    return [
        ("X-Service-Billing-Period", usage.period),
        ("X-Service-Monthly-Limit", str(policy.pageview_included)),
        ("X-Service-Monthly-Used", str(usage.pageviews_used)),
        ("X-Service-Billing-Mode", usage.billing_mode.value),
        ("X-Service-Budget-Ceiling", str(policy.pageview_ceiling)),
        ("X-Service-Signals-Coverage-Period", usage.period),
        ("X-Service-Signals-Coverage-Limit", str(policy.coverage_included)),
        ("X-Service-Signals-Coverage-Used", str(usage.coverage_used)),
        ("X-Service-Signals-Coverage-Ceiling", str(policy.coverage_ceiling)),
        ("X-Service-Signals-Coverage-Mode", usage.coverage_mode.value),
    ]


def billing_block(policy: UsagePolicy, usage: UsageSnapshot) -> dict[str, object]:
    return {
        "monthlyPageviews": {
            "mode": usage.billing_mode.value,
            "billingPeriod": usage.period,
            "used": usage.pageviews_used,
            "limit": policy.pageview_included,
            "safetyCeiling": policy.pageview_ceiling,
            "attempted": usage.pageviews_attempted,
        }
    }


def refusal_body(refusal: UsageRefusal) -> dict[str, object]:
    return {
        "reason": refusal.reason,
        # Spec 7.2 "upgradeRequired (paid)": the plan that lifts the stop, null when none does.
        "upgradeRequired": "paid" if refusal.upgrade_required else None,
        "billingPeriod": refusal.period,
        "used": refusal.used,
        "included": refusal.included,
        "safetyCeiling": refusal.ceiling,
        "attempted": refusal.attempted,
        "accepted": 0,
    }


def refusal_headers(refusal: UsageRefusal) -> dict[str, str]:
    headers = {"X-Service-Billing-Mode": "blocked", "X-Service-Billing-Period": refusal.period}
    if refusal.code == "accepted_event_safety_ceiling_reached":
        headers["X-Service-Budget-Type"] = "accepted-events"
    return headers
