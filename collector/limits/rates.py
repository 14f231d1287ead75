"""Request rates per bucket (spec 8.2).

The bucket is clientId:keyType:scope, so several keys of one type and scope
in an account share one counter. The rate is the lower of the key ceiling
(`rateLimit`, 50 when a hand-made config has none) and the scope's package
rate; mobile and server keys get half the package rate with a floor of 50.
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


def scope_rate(key: KeyRecord, scope: str, site_plan: Plan) -> float:
    if scope == "signals-read":
        package = SIGNALS_READ_RPS[site_plan]
    else:
        package = PACKAGE_RPS[key.normalized_plan]
    if key.key_type is not KeyType.BROWSER:
        package = max(EXEMPT_FLOOR, package / 2)
    ceiling = key.rateLimit if key.rateLimit is not None else DEFAULT_KEY_RATE
    return min(ceiling, package)
