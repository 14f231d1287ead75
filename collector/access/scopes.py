"""Permission scopes (spec 5.3): absent or empty lists are unrestricted."""

from __future__ import annotations

from collector.access.tenants import KeyRecord
from collector.errors import ServiceError

EVENTS_WRITE = "events:write"
EVENTS_READ = "events:read"
LIVE_READ = "live:read"
SIGNALS_READ = "signals:read"
SIGNALS_STREAM = "signals:stream"


def has_scope(key: KeyRecord, scope: str) -> bool:
    return not key.permissions or scope in key.permissions


def require_scope(key: KeyRecord, scope: str, *, error_code: str) -> None:
    if not has_scope(key, scope):
        raise ServiceError(error_code, f"this key's permissions do not include {scope}")
