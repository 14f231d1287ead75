"""Operator actions on keys: import a tenants file, list, rotate, revoke (spec 5.6), mint stream tokens (5.4)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from collector.access import stream_tokens
from collector.access.tenants import (
    KeyRecord,
    KeyType,
    Plan,
    TenantsFileError,
    decode_record,
    encode_record,
    parse_tenants_file,
)
from collector.limits.usage import term_notes
from storage import keys as key_store
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD
from storage.stream_secret import stream_token_secret

_json = msgspec.json.Encoder()
_PREFIX = {KeyType.MOBILE: "cs_mob_live_", KeyType.SERVER: "cs_srv_live_"}


class KeyAdminError(ValueError):
    """The operator asked for something the key rules forbid; nothing changed."""


@dataclass(frozen=True)
class ImportedTenants:
    records: list[KeyRecord]  # the file's keys as stored (a revoked one still revoked)
    term_changes: list[str]  # a billing account whose terms this import changed, each said once


def import_tenants(storage: Storage, data: bytes) -> ImportedTenants:
    """Validate the whole file first, then upsert every key in one transaction.

    In the same transaction every key of each billing account the import
    touches gets the account's terms: its `contract` (the file's keys of one
    account may not carry different ones), `overage` (on when any of them
    turns it on) and plan (paid when any of them is paid: the allowances are
    pooled per account, so one account has one package), taken from the
    file's keys of that account; only an account
    the file no longer names (a key moved away) takes them from its stored
    live keys. So a key that exists only in storage (a rotated key's
    replacement) follows the file instead of pinning the old terms. A revoked key stays revoked:
    `serve --tenants FILE` re-imports the file on every start, and a rotation
    or revocation must survive that (spec 5.6: rotation is the only remedy for
    a leaked key).
    """
    records = parse_tenants_file(data)
    moved: dict[str, str] = {}
    period = time.strftime("%Y-%m", time.gmtime())
    outcome = ImportedTenants([], [])

    def update(stored: dict[str, bytes]) -> dict[str, bytes]:
        # A stored record that does not decode is left as it is (`collector
        # check` lists it), unless the file names its key and so replaces it.
        merged = {key: record for key, raw in stored.items() if (record := _readable(raw)) is not None}
        before = _account_terms(merged.values())
        touched = {merged[r.key].billing_account for r in records if r.key in merged}
        changed = {record.key for record in records}
        for record in records:
            old = merged.get(record.key)
            if old is not None and old.billing_account != record.billing_account:
                moved[record.clientId] = period
            if old is not None and old.revokedAt:
                record = msgspec.structs.replace(
                    record, revokedAt=old.revokedAt, replacedBy=record.replacedBy or old.replacedBy
                )
            merged[record.key] = record
            touched.add(record.billing_account)
            changed |= _follow_rotation(merged, record, named=changed)
        # Grouped once: scanning every record for every account took 334 s for 50,000
        # keys of their own accounts, inside the write transaction ingest waits on (helper-89).
        named = _by_account(records)
        members = _by_account(merged.values(), touched)
        for account in touched:
            changed |= _apply_account_terms(merged, account, members.get(account, []), named.get(account, []))
        after = _account_terms(merged[key] for key in changed)
        outcome.records[:] = [merged[record.key] for record in records]
        outcome.term_changes[:] = [
            _term_change(account, before[account], after[account])
            for account in sorted(after) if account in before and before[account] != after[account]
        ]
        return {key: encode_record(merged[key]) for key in changed}

    key_store.update_keys(storage, update, lambda: moved)
    return outcome


def settle_account_suspension(storage: Storage) -> None:
    """Give every key of a billing account with a suspended live key `accountSuspended`.

    Imports keep it so; this settles records an older version imported (it
    suspended the key named only), at every start of `serve`.
    """

    def update(stored: dict[str, bytes]) -> dict[str, bytes]:
        records = [record for raw in stored.values() if (record := _readable(raw)) is not None]
        suspended = {r.billing_account for r in records if r.suspended and not r.revokedAt}
        return {
            r.key: encode_record(msgspec.structs.replace(r, accountSuspended=True))
            for r in records
            if r.billing_account in suspended and not r.accountSuspended
        }

    key_store.update_keys(storage, update)


def _follow_rotation(merged: dict[str, KeyRecord], record: KeyRecord, *, named: set[str]) -> set[str]:
    """Give the keys that replaced `record` by rotation its settings from the file; those keys.

    A rotated key's file entry still describes the key the operator means:
    its replacement (`keys rotate` mints a random one the file cannot name)
    must follow a change of permissions, rate limit, sites or suspension,
    keeping its own identity and lifecycle. Keys the file names are its own.
    """
    followed: set[str] = set()
    successor = record.replacedBy
    while successor and successor in merged and successor not in named and successor not in followed:
        current = merged[successor]
        merged[successor] = msgspec.structs.replace(
            record, key=successor, createdAt=current.createdAt, revokedAt=current.revokedAt,
            replacedBy=current.replacedBy,
        )
        followed.add(successor)
        successor = current.replacedBy
    return followed


def _by_account(records: Iterable[KeyRecord], accounts: set[str] | None = None) -> dict[str, list[KeyRecord]]:
    """The records by billing account (only those of `accounts`, when given), in order."""
    grouped: dict[str, list[KeyRecord]] = {}
    for record in records:
        account = record.billing_account
        if accounts is None or account in accounts:
            grouped.setdefault(account, []).append(record)
    return grouped


def _apply_account_terms(
    merged: dict[str, KeyRecord], account: str, members: list[KeyRecord], named: list[KeyRecord]
) -> set[str]:
    """Give every key of `account` (`members`: its keys in `merged`) the account's contract,
    overage and plan; the keys that changed.

    `named`: the file's keys of the account, which decide (else its stored live keys).
    """
    live = [r for r in members if not r.revokedAt]
    settled = next((r for r in live if r.accountTerms), None)
    if not named and settled is not None:  # a key moved away: the account keeps its terms
        contract, overage = settled.accountContract, settled.accountOverage
        plan = settled.accountPlan or _any_paid(live)  # (imported before the account had a plan)
        suspended = settled.accountSuspended
    else:
        deciding = named or live
        contracts = {_json.encode(r.contract): r for r in deciding if r.contract is not None}
        if len(contracts) > 1:
            keys = ", ".join(sorted(r.key[:16] + "..." for r in contracts.values()))
            raise TenantsFileError(
                f"invalid tenants file: keys of billing account {account!r} carry different contracts"
                f" ({keys}): a contract belongs to the billing account; give its keys the same one"
            )
        contract = next(iter(contracts.values())).contract if contracts else None
        overage = any(r.overage for r in deciding)
        plan = _any_paid(deciding)
        # Unlike the terms above, any stored live key of the account keeps it
        # suspended: an import naming only some of its keys lifts nothing.
        suspended = any(r.suspended for r in deciding) or any(r.suspended for r in live)
    terms = (contract, overage, True, plan, suspended)
    changed = set()
    for record in members:
        current = (
            record.accountContract, record.accountOverage, record.accountTerms, record.accountPlan,
            record.accountSuspended,
        )
        if current != terms:
            merged[record.key] = msgspec.structs.replace(
                record, accountContract=contract, accountOverage=overage, accountTerms=True, accountPlan=plan,
                accountSuspended=suspended,
            )
            changed.add(record.key)
    return changed


_Terms = tuple[object, bool, object, bool]  # contract, overage, plan, suspended


def _account_terms(records: Iterable[KeyRecord]) -> dict[str, _Terms]:
    """Each billing account's settled terms, as its first live key with them holds them."""
    terms: dict[str, _Terms] = {}
    for r in records:
        if r.accountTerms and not r.revokedAt and r.billing_account not in terms:
            contract = _json.encode(r.accountContract).decode() if r.accountContract is not None else "none"
            plan = r.accountPlan.value if r.accountPlan is not None else "unset"
            terms[r.billing_account] = (contract, r.accountOverage, plan, r.accountSuspended)
    return terms


def _term_change(account: str, before: _Terms, after: _Terms) -> str:
    """What an import changed of an account's terms (helper-119: a file naming only some
    of an account's keys, with no contract, dropped its contract without a word)."""
    names = ("contract", "overage", "plan", "suspended")
    said = ", ".join(f"{name} {_said(old)} -> {_said(new)}"
                     for name, old, new in zip(names, before, after, strict=True) if old != new)
    return (f"the terms of billing account {account!r} change: {said} (the file's keys of an account decide its"
            " terms, for every key of it; `serve --tenants` imports its file again at each start)")


def _said(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _any_paid(records: list[KeyRecord]) -> Plan:
    return Plan.PAID if any(r.normalized_plan is Plan.PAID for r in records) else Plan.FREE


def _readable(raw: bytes) -> KeyRecord | None:
    try:
        return decode_record(raw)
    except UNREADABLE_RECORD:
        return None


def list_records(
    storage: Storage, on_unreadable: Callable[[str, Exception], None] | None = None
) -> list[KeyRecord]:
    """Every stored key record. One that does not decode goes to `on_unreadable`
    (its key, shortened, and the error) and is left out; without it the error is raised."""
    records = []
    for key, raw in key_store.iter_keys(storage):
        try:
            records.append(decode_record(raw))
        except UNREADABLE_RECORD as exc:
            if on_unreadable is None:
                raise
            on_unreadable(f"{key[:12]}...", exc)
    return records


def imported_term_notes(storage: Storage, imported: ImportedTenants) -> list[str]:
    """The notes `tenants import` prints and `serve` logs: the terms the import changed,
    then those on the stored terms of each billing account it touched
    (limits.usage.term_notes)."""
    touched = {record.billing_account for record in imported.records}
    live = [r for r in list_records(storage, on_unreadable=lambda key, error: None)  # check lists them
            if r.billing_account in touched and not r.revokedAt]
    notes = (note for record in sorted(live, key=lambda r: r.billing_account) for note in term_notes(record))
    # (every key of an account has its terms: once each)
    return [*imported.term_changes, *_type_notes(imported.records), *_shared_account_notes(live),
            *dict.fromkeys(notes)]


def _shared_account_notes(live: list[KeyRecord]) -> list[str]:
    """A billing account that is also another client's own: the clients share allowances,
    overage and suspension, which a name chosen by chance does silently (helper-101)."""
    clients: dict[str, set[str]] = {}
    for record in live:
        clients.setdefault(record.billing_account, set()).add(record.clientId)
    return [
        f"billing account {account!r} is also client {account!r}'s own account: clients"
        f" {', '.join(sorted(members))} share its allowances, overage and suspension"
        for account, members in sorted(clients.items())
        if account in members and len(members) > 1
    ]


def _type_notes(imported: list[KeyRecord]) -> list[str]:
    """A key named as this collector names mobile and server keys, imported as another type.

    A `keyType` left out makes a website key (spec 2.1), accepted in `?key=`
    without a signature: for a secret server key that is an easy mistake to miss.
    """
    notes = []
    for record in imported:
        for key_type, prefix in _PREFIX.items():
            named = prefix.removesuffix("live_")  # cs_srv_ / cs_mob_ (live or test)
            if record.key.startswith(named) and record.key_type is not key_type:
                notes.append(
                    f"key {record.key[:16]}... is named like a {key_type.value} key but imported as a"
                    f" {record.key_type.value} key (keyType {record.keyType.value if record.keyType else 'absent'}):"
                    f' set "keyType": "{key_type.value}" if it is one'
                )
    return notes


def live_keys_among(storage: Storage, keys: Iterable[str]) -> list[str]:
    """Those of `keys` stored and not revoked."""
    live = []
    for key in keys:
        raw = key_store.get_key(storage, key)
        record = _readable(raw) if raw is not None else None
        if record is not None and record.revokedAt is None:
            live.append(key)
    return live


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load(storage: Storage, key: str) -> KeyRecord:
    raw = key_store.get_key(storage, key) if _storable(key) else None
    return _decoded(key, raw)


def _storable(key: str) -> bool:
    """Whether `key` can name a stored record: LMDB refuses an empty key, and a key is
    printable text (a command line's bytes that are not UTF-8, surrogate escapes, are not)."""
    return bool(key) and key.isprintable()


def _shown(key: str) -> str:
    """The start of a key as a message may print it (escaped when it is not printable UTF-8)."""
    start = key[:12]
    return start if _storable(start) else ascii(start)


def _decoded(key: str, raw: bytes | None) -> KeyRecord:
    if raw is None:
        raise KeyAdminError(f"unknown key {_shown(key)}...")
    try:
        return decode_record(raw)
    except UNREADABLE_RECORD as exc:
        raise KeyAdminError(
            f"the stored record of key {_shown(key)}... does not decode ({exc}): import its entry again"
            " with `collector tenants import`"
        ) from None


def rotate_key(storage: Storage, key: str) -> str:
    """Mint the replacement of a mobile or server key, register it, revoke the old one.

    Read and written in one transaction: a rotation racing another, or an import
    suspending the account, could otherwise be overwritten (helper-73).
    """
    new_key = ""

    def rotate(raw: bytes | None) -> list[tuple[str, bytes]]:
        nonlocal new_key
        record = _decoded(key, raw)
        if record.revokedAt:
            raise KeyAdminError("the key is already revoked")
        prefix = _PREFIX.get(record.key_type)
        if prefix is None:
            raise KeyAdminError(
                "the account-wide website key is rotated with support: import the new key,"
                " let cached pages drain, then revoke the old one with `collector keys revoke`"
            )
        new_key = prefix + secrets.token_hex(16)
        now = _now_iso()
        replacement = msgspec.structs.replace(record, key=new_key, createdAt=now)
        revoked = msgspec.structs.replace(record, revokedAt=now, replacedBy=new_key)
        return [(new_key, encode_record(replacement)), (key, encode_record(revoked))]

    key_store.change_key(storage, key, rotate)
    return new_key


def mint_stream_token(storage: Storage, key: str, *, ttl_s: int) -> str:
    """A stream token for the tenant of a live key (spec 5.4); the operator stands in for the dashboard."""
    if not 1 <= ttl_s <= stream_tokens.MAX_TTL_S:
        raise KeyAdminError(f"--ttl must be 1 to {stream_tokens.MAX_TTL_S} seconds")
    record = _load(storage, key)
    if record.revokedAt:
        raise KeyAdminError("the key is revoked")
    if record.is_suspended:
        raise KeyAdminError("the account is suspended")
    if record.key_type == KeyType.BROWSER:  # (helper-101)
        raise KeyAdminError(
            "a website key is public (spec 5.6) and tenant-wide streams do not take one (spec 5.4):"
            " mint with one of the tenant's server or mobile keys"
        )
    return stream_tokens.mint(
        stream_token_secret(storage), client_id=record.clientId, api_key=record.key, now_s=int(time.time()),
        ttl_s=ttl_s,
    )


def revoke_key(storage: Storage, key: str) -> None:
    def revoke(raw: bytes | None) -> list[tuple[str, bytes]]:
        record = _decoded(key, raw)
        if record.revokedAt:
            return []
        return [(key, encode_record(msgspec.structs.replace(record, revokedAt=_now_iso())))]

    key_store.change_key(storage, key, revoke)
