"""Request rates per bucket (spec 8.2).

The bucket is clientId:keyType:scope, so several keys of one type and scope
in an account share one counter. The rate is the lower of the key ceiling
(`rateLimit`, 50 when a hand-made config has none) and the scope's package
rate; mobile and server keys are capped at half the package rate with a
floor of 50, and the lower of that and the scope's rate applies.
The signals-read rate follows the matched property's plan.
"""

from __future__ import annotations

from collector.access.tenants import KeyRecord, KeyType, Plan

PACKAGE_RPS = {Plan.FREE: 100.0, Plan.PAID: 5_000.0}
SIGNALS_READ_RPS = {Plan.FREE: 10.0, Plan.PAID: 5_000.0}
DEFAULT_KEY_RATE = 50.0
EXEMPT_FLOOR = 50.0


def bucket_id(client_id: str, key_type: str, scope: str) -> str:
    return f"{client_id}:{key_type}:{scope}"


def ingest_scope(key: KeyRecord) -> str:
    """The bucket scope of a key's event writes (spec 8.2: mobile ingest is its own scope)."""
    return "mobile:ingest" if key.key_type is KeyType.MOBILE else "ingest"


def scope_rate(key: KeyRecord, scope: str, site_plan: Plan) -> float:
    package = PACKAGE_RPS[key.normalized_plan]
    scope_rps = SIGNALS_READ_RPS[site_plan] if scope == "signals-read" else package
    ceiling = key.rateLimit if key.rateLimit is not None else DEFAULT_KEY_RATE
    if key.key_type is not KeyType.BROWSER:
        # Minted at half the package rate, floor 50 (Explore 50, Pro 2,500);
        # "the lower of that ceiling and the scope rate applies": a free
        # mobile key reads signals at 10/s, not 50.
        ceiling = min(ceiling, max(EXEMPT_FLOOR, package / 2))
    return min(ceiling, scope_rps)
