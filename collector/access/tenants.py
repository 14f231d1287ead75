"""The tenants file of the operator contract, and the key record stored per key.

`KeyRecord` is both the tenants-file entry and what `storage.keys` stores (as
JSON). Stored Structs evolve only by appending fields with defaults.
"""

from __future__ import annotations

import datetime
import enum
import json
import re
import unicodedata
from typing import Annotated

import msgspec

from collector.access.hostnames import domain_problem


class KeyType(enum.StrEnum):
    BROWSER = "browser"
    MOBILE = "mobile"
    SERVER = "server"


class Plan(enum.StrEnum):
    FREE = "free"
    PAID = "paid"


class Site(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    siteId: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    name: str = ""
    domains: list[str] = []
    plan: str | None = None  # None: the key's plan
    strictConsent: bool = False


class Contract(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A reviewed capacity contract: any given value replaces the package value."""

    monthlyPageviews: Annotated[int, msgspec.Meta(ge=0)] | None = None
    signalsCoverage: Annotated[int, msgspec.Meta(ge=0)] | None = None
    pageviewCeiling: Annotated[int, msgspec.Meta(ge=0)] | None = None
    coverageCeiling: Annotated[int, msgspec.Meta(ge=0)] | None = None


KEY_MIN_CHARS, KEY_MAX_CHARS = 8, 256  # an API key's length, as imported


class KeyRecord(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    key: Annotated[str, msgspec.Meta(min_length=KEY_MIN_CHARS, max_length=KEY_MAX_CHARS)]
    clientId: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    name: str = ""
    plan: str = "free"
    # as written (5000 lists as 5000, not 5000.0)
    rateLimit: int | float | None = None  # (more than 0: _check_entry, one message for both)
    createdAt: str = ""
    keyType: KeyType | None = None  # absent means browser
    permissions: list[str] = []
    sites: list[Site] = []
    suspended: bool = False
    overage: bool = False
    billingAccount: str | None = None  # None: clientId
    contract: Contract | None = None
    # service-side lifecycle fields, written by `collector keys rotate|revoke`
    revokedAt: str | None = None
    replacedBy: str | None = None
    # service-side: the billing account's terms, recomputed by every import from
    # all of the account's live keys (`contract` and `overage` are the account's)
    accountContract: Contract | None = None
    accountOverage: bool = False
    accountTerms: bool = False  # the two above are set (records imported before them have neither)
    accountPlan: Plan | None = None  # the account's plan (paid when any of its keys is); None: older import
    accountSuspended: bool = False  # one of the account's keys in the file says `suspended`

    @property
    def key_type(self) -> KeyType:
        return self.keyType or KeyType.BROWSER

    @property
    def is_suspended(self) -> bool:
        """The key's account is suspended (operator contract: `suspended` suspends the account)."""
        return self.suspended or self.accountSuspended

    @property
    def normalized_plan(self) -> Plan:
        """Spec 2.1: older stored plan values are normalised to free or paid."""
        return normalize_plan(self.plan)

    @property
    def billing_account(self) -> str:
        return self.billingAccount or self.clientId

    def site_plan(self, site: Site) -> Plan:
        return normalize_plan(site.plan) if site.plan else self.normalized_plan


_PAID_ALIASES = frozenset({"paid", "pro", "business", "enterprise", "growth", "scale", "team"})


def normalize_plan(value: str) -> Plan:
    return Plan.PAID if value.strip().lower() in _PAID_ALIASES else Plan.FREE


# The file's entries: a key record's own fields only. The service-side fields
# (`revokedAt`, `replacedBy`, `account*`) are written by the collector: from a
# file, `replacedBy` handed another tenant's key to this one (audit helper-40).
FILE_FIELDS = (
    "key", "clientId", "name", "plan", "rateLimit", "createdAt", "keyType", "permissions", "sites",
    "suspended", "overage", "billingAccount", "contract",
)  # fmt: skip
KeyEntry = msgspec.defstruct(
    "KeyEntry",
    [
        (field.name, field.type, msgspec.field(default_factory=field.default_factory)
         if field.default_factory is not msgspec.NODEFAULT else field.default)
        for field in msgspec.structs.fields(KeyRecord)
        if field.name in FILE_FIELDS
    ],
    forbid_unknown_fields=True,
)


class TenantsFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[KeyEntry]  # type: ignore[valid-type]


# Spec 5.3's scopes; a key restricted to a misspelt one could do nothing at all.
SCOPES = frozenset({"events:write", "live:read", "signals:read", "signals:stream", "events:read"})
# Plan names: spec 2.1's two, and the older values its normalisation covers.
_FREE_ALIASES = frozenset({"free", "explore", "trial", "starter", "hobby", "developer"})
# Ids are joined with NUL in storage keys (one in an id could collide), and are written
# into every access line: no control characters (C0, DEL, C1: terminals obey some) and
# no Unicode line breaks (helper-109); no invisible format characters either (Unicode
# category Cf: bidi controls reorder the rest of a log line as it is shown, and with
# zero-width ones two ids that read the same are different tenants: helper-111).
_NAME_TEXT = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def _unfit_char(name: str) -> str | None:
    """The first character an id may not hold, or None."""
    if _NAME_TEXT.fullmatch(name) and name.isprintable():  # (the common case, in C)
        return None
    return next(
        (c for c in name if not _NAME_TEXT.fullmatch(c) or unicodedata.category(c) == "Cf"), None
    )


class TenantsFileError(ValueError):
    """The tenants file cannot be used; nothing from it was imported."""


_file_decoder = msgspec.json.Decoder(TenantsFile)
_record_decoder = msgspec.json.Decoder(KeyRecord)
_encoder = msgspec.json.Encoder()


_KEY_TEXT = re.compile("[!-~](?:[ -~]*[!-~])?")  # printable ASCII, not starting or ending with a space


def parse_tenants_file(data: bytes) -> list[KeyRecord]:
    """Parse and validate a whole tenants file; raises TenantsFileError naming the problem."""
    # An editor's byte order mark (RFC 8259 lets a parser ignore it): it was refused
    # as "invalid character (byte 0)", which no one could find in the file.
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        parsed = _file_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise TenantsFileError(f"invalid tenants file: {exc}") from None
    except msgspec.DecodeError as exc:
        raise TenantsFileError(f"tenants file is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TenantsFileError(f"tenants file is not valid UTF-8: {exc}") from None
    _refuse_repeated_members(data)
    records = [KeyRecord(**msgspec.structs.asdict(entry)) for entry in parsed.keys]
    seen: set[str] = set()
    for index, record in enumerate(records):
        _check_entry(record, index)
        if record.key in seen:
            raise TenantsFileError(f"invalid tenants file: duplicate key at $.keys[{index}]")
        if not _KEY_TEXT.fullmatch(record.key):
            # A key travels in a header, and an LMDB key holds at most 511 bytes.
            raise TenantsFileError(
                f"invalid tenants file: a key is printable ASCII, without a space at either end"
                f" - at $.keys[{index}].key"
            )
        seen.add(record.key)
        for site_index, site in enumerate(record.sites):
            for domain_index, domain in enumerate(site.domains):
                problem = domain_problem(domain)
                if problem:
                    raise TenantsFileError(
                        f"invalid tenants file: domain {domain!r} {problem}"
                        f" - at $.keys[{index}].sites[{site_index}].domains[{domain_index}]"
                    )
        if record.key_type is not KeyType.BROWSER and len(record.sites) > 1:
            raise TenantsFileError(
                f"invalid tenants file: a {record.key_type} key belongs to one property"
                f" - at $.keys[{index}].sites"
            )
    return records


def _refuse_repeated_members(data: bytes) -> None:
    """A member named twice in one object is an error: JSON decoders keep the last, silently.

    (`"keys"` twice imported only the second list; `"clientId"` twice the second id.)
    """

    def check(pairs: list[tuple[str, object]]) -> dict[str, object]:
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            repeated = next(name for name in names if names.count(name) > 1)
            raise TenantsFileError(f"invalid tenants file: member {repeated!r} appears twice in one object")
        return dict(pairs)

    try:
        json.loads(data, object_pairs_hook=check)
    except TenantsFileError:
        raise
    except (ValueError, RecursionError):
        pass  # the file already decoded: what json alone refuses is not this check's


def _check_entry(record: KeyRecord, index: int) -> None:
    """What the schema cannot say about one entry; TenantsFileError names the field."""
    where = f"$.keys[{index}]"
    plans = [(f"{where}.plan", record.plan)]
    plans += [(f"{where}.sites[{n}].plan", site.plan) for n, site in enumerate(record.sites) if site.plan is not None]
    for at, plan in plans:
        if plan.strip() and plan.strip().lower() not in _PAID_ALIASES | _FREE_ALIASES:  # ("" is free)
            raise TenantsFileError(f"invalid tenants file: plan {plan!r} is not free or paid - at {at}")
    for position, scope in enumerate(record.permissions):
        if scope not in SCOPES:
            raise TenantsFileError(
                f"invalid tenants file: unknown permission {scope!r} (scopes: {', '.join(sorted(SCOPES))})"
                f" - at {where}.permissions[{position}]"
            )
    names = [(f"{where}.clientId", record.clientId), (f"{where}.billingAccount", record.billingAccount)]
    names += [(f"{where}.sites[{n}].siteId", site.siteId) for n, site in enumerate(record.sites)]
    for at, name in names:
        if name and (bad := _unfit_char(name)) is not None:  # ("" billingAccount means the clientId)
            kind = "an invisible format character" if unicodedata.category(bad) == "Cf" else "a control character"
            raise TenantsFileError(f"invalid tenants file: {kind} (U+{ord(bad):04X}) in {name!r} - at {at}")
        if name and len(name.encode()) > MAX_NAME_BYTES:
            raise TenantsFileError(
                f"invalid tenants file: {at.rpartition('.')[2]} is {len(name.encode())} bytes in UTF-8,"
                f" over {MAX_NAME_BYTES} - at {at}"
            )
    client_bytes = len(record.clientId.encode())
    for n, site in enumerate(record.sites):
        if client_bytes + len(site.siteId.encode()) > MAX_NAME_BYTES:  # (keys hold both, one after the other)
            raise TenantsFileError(
                f"invalid tenants file: clientId and siteId together are"
                f" {client_bytes + len(site.siteId.encode())} bytes in UTF-8, over {MAX_NAME_BYTES}"
                f" - at {where}.sites[{n}].siteId"
            )
    site_ids = [site.siteId for site in record.sites]
    for n, site_id in enumerate(site_ids):
        if site_id in site_ids[:n]:  # (the second was unreachable: the first matched its domains)
            raise TenantsFileError(f"invalid tenants file: siteId {site_id!r} twice in one key - at {where}.sites[{n}]")
    if record.rateLimit is not None and not record.rateLimit > 0:
        raise TenantsFileError(
            f"invalid tenants file: rateLimit {record.rateLimit} is not more than 0 requests/s - at {where}.rateLimit"
        )
    if record.rateLimit is not None and record.rateLimit > MAX_RATE_LIMIT:
        raise TenantsFileError(
            f"invalid tenants file: rateLimit {record.rateLimit:,} is over {MAX_RATE_LIMIT:,} requests/s"
            f" - at {where}.rateLimit"
        )
    if record.createdAt and not _is_iso_timestamp(record.createdAt):
        raise TenantsFileError(
            f"invalid tenants file: createdAt {record.createdAt!r} is not an ISO 8601 timestamp"
            f" (2026-11-01T00:00:00Z) - at {where}.createdAt"
        )


# Storage keys start with the clientId and siteId (counters with the billing account)
# and LMDB holds at most 511 bytes a key: 440 for the clientId and a siteId together
# leave room for separators, a digested id and a replay chunk's sequence. An account
# of 600 bytes imported, then failed every ingest with a retryable 503 (helper-95);
# a cap of 200 each refused a 240-byte clientId an earlier version served (helper-100).
MAX_NAME_BYTES = 440

MAX_RATE_LIMIT = 1_000_000_000  # requests/s: past any node; 1e308 made bucket arithmetic inf


_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}(:?\d{2})?)?")


def _is_iso_timestamp(text: str) -> bool:
    """An ISO 8601 (RFC 3339) date and time: a bare date, a week date or a space are not."""
    if not _TIMESTAMP.fullmatch(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def encode_record(record: KeyRecord) -> bytes:
    return _encoder.encode(record)


def decode_record(data: bytes) -> KeyRecord:
    return _record_decoder.decode(data)
