"""A billing account's contract and overage, as imports set them on every key of the account."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.access.hostnames import domain_problem, normalize_domain
from collector.limits.usage import policy_for
from collector.tenants_admin import import_tenants, list_records, rotate_key
from storage.env import Storage

SERVER = {"key": "cs_srv_live_terms000", "clientId": "acme", "plan": "paid", "keyType": "server",
          "sites": [{"siteId": "api"}]}


def _import(storage: Storage, *keys: dict[str, object]) -> None:
    import_tenants(storage, json.dumps({"keys": list(keys)}).encode())


def _live(storage: Storage) -> list:  # type: ignore[type-arg]
    return [r for r in list_records(storage) if not r.revokedAt]


def test_a_rotated_key_follows_the_file_when_overage_and_the_contract_are_turned_off(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _import(storage, {**SERVER, "overage": True, "contract": {"monthlyPageviews": 5_000_000}})
        replacement = rotate_key(storage, SERVER["key"])  # type: ignore[arg-type]
        _import(storage, SERVER)  # the same key, now without overage and contract
        (live,) = _live(storage)
        assert live.key == replacement
        policy = policy_for(live)
        assert (policy.overage, policy.pageview_included, policy.pageview_ceiling) == (False, 25_000, 25_000)
    finally:
        storage.close()


def test_a_rotated_key_follows_its_entry_and_suspension_covers_the_account(tmp_path: Path) -> None:
    # The replacement of a rotated key kept the old permissions, rate limit and
    # suspension; `suspended` suspends the account (operator contract), not only the key named.
    mobile = {"key": "cs_mob_live_terms000", "clientId": "acme", "keyType": "mobile", "rateLimit": 50,
              "sites": [{"siteId": "app"}]}
    storage = Storage(tmp_path)
    try:
        _import(storage, SERVER, mobile)
        replacement = rotate_key(storage, SERVER["key"])  # type: ignore[arg-type]
        _import(storage, {**SERVER, "rateLimit": 7, "permissions": ["events:write"]}, mobile)
        records = {r.key: r for r in list_records(storage)}
        new = records[replacement]
        assert (new.rateLimit, new.permissions, new.revokedAt, new.replacedBy) == (7, ["events:write"], None, None)
        assert records[SERVER["key"]].revokedAt and records[SERVER["key"]].replacedBy == replacement
        assert not any(r.is_suspended for r in records.values())
        _import(storage, {**SERVER, "suspended": True}, mobile)
        records = {r.key: r for r in list_records(storage)}
        assert records[replacement].is_suspended and records[mobile["key"]].is_suspended  # type: ignore[index]
        assert not records[mobile["key"]].suspended  # type: ignore[index]
        # A file naming only another key of the account lifts nothing (review of eff9ca0).
        _import(storage, {**mobile, "rateLimit": 40})
        assert all(r.is_suspended for r in list_records(storage) if not r.revokedAt)
        _import(storage, SERVER, mobile)  # lifted
        assert not any(r.is_suspended for r in list_records(storage))
    finally:
        storage.close()


def test_records_from_before_account_terms_keep_their_own(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _import(storage, {**SERVER, "overage": True})
        (record,) = _live(storage)
        import msgspec

        old = msgspec.structs.replace(record, accountTerms=False, accountOverage=False)
        assert policy_for(old).overage is True
    finally:
        storage.close()


def test_hosts_browsers_encode_but_idna_2008_refuses_still_match() -> None:
    assert normalize_domain("☃.net") == "xn--n3h.net"
    assert normalize_domain("straße.de") == "xn--strae-oqa.de"
    assert domain_problem("i❤.ws") is None


def test_an_account_keeps_its_paid_plan_when_a_key_moves_away(tmp_path: Path) -> None:
    # Records imported before the account had a plan (accountPlan absent); the first key by
    # name is free. A key moving to another account must not turn the account free.
    import msgspec

    from collector.access.tenants import encode_record
    from storage import keys as key_store

    site = {"sites": [{"siteId": "w", "domains": ["a.example"]}]}
    free = {"key": "cs_live_aaaa0000000", "clientId": "a1", "billingAccount": "A", "plan": "free", **site}
    paid = {"key": "cs_live_bbbb0000000", "clientId": "a2", "billingAccount": "A", "plan": "paid", **site}
    moving = {"key": "cs_live_cccc0000000", "clientId": "a3", "billingAccount": "A", "plan": "paid", **site}
    storage = Storage(tmp_path)
    try:
        _import(storage, free, paid, moving)
        older = [msgspec.structs.replace(r, accountPlan=None) for r in list_records(storage)]
        key_store.put_keys(storage, [(r.key, encode_record(r)) for r in older])
        _import(storage, {**moving, "billingAccount": "B"})
        plans = {r.key: policy_for(r).plan.value for r in list_records(storage)}
        assert plans == {free["key"]: "paid", paid["key"]: "paid", moving["key"]: "paid"}
    finally:
        storage.close()


def test_import_notes_a_pageview_ceiling_that_does_nothing(tmp_path: Path) -> None:
    # Overage is in force only for a paid account: a free key's `overage: true` leaves the
    # contract's pageviewCeiling idle, and the import says so.
    from collector.tenants_admin import ImportedTenants, imported_term_notes

    site = {"sites": [{"siteId": "w", "domains": ["a.example"]}]}
    keys = [
        {"key": "cs_live_free0000000", "clientId": "f", "plan": "free", "overage": True,
         "contract": {"pageviewCeiling": 9000}, **site},
        {"key": "cs_live_paid0000000", "clientId": "p", "plan": "paid", "overage": True,
         "contract": {"pageviewCeiling": 9000}, **site},
        {"key": "cs_live_paidoff0000", "clientId": "q", "plan": "paid",
         "contract": {"pageviewCeiling": 9000}, **site},
    ]
    storage = Storage(tmp_path)
    try:
        _import(storage, *keys)
        notes = imported_term_notes(storage, ImportedTenants(list_records(storage), term_changes=[]))
        idle = [note.split(" has ")[0] for note in notes if "pageviewCeiling but overage off" in note]
        assert idle == ["billing account 'f'", "billing account 'q'"]
        # (p's ceiling is in force, and below the 25,000 pageviews of its package: noted too)
        assert len(notes) == 3 and "'p' has a contract pageviewCeiling of 9000, below its 25000" in notes[1]
    finally:
        storage.close()


def test_serve_settles_a_suspension_an_older_version_recorded(tmp_path: Path) -> None:
    # An older version stored `suspended` on the key named only; the new gate reads
    # `accountSuspended`, which only a new import set (audit helper-35).
    import msgspec

    from collector.access.tenants import encode_record
    from collector.tenants_admin import settle_account_suspension
    from storage.keys import put_keys

    storage = Storage(tmp_path)
    try:
        _import(storage, SERVER, {**SERVER, "key": "cs_live_terms_web0", "keyType": "browser"})
        older = [msgspec.structs.replace(r, suspended=r.key == SERVER["key"], accountSuspended=False)
                 for r in list_records(storage)]
        put_keys(storage, [(r.key, encode_record(r)) for r in older])
        assert [r.is_suspended for r in list_records(storage)] == [False, True]  # (sorted: cs_live first)
        settle_account_suspension(storage)
        assert all(r.is_suspended for r in list_records(storage))
    finally:
        storage.close()


def test_a_billing_move_of_the_longest_client_id_is_recorded(tmp_path: Path) -> None:
    # The meta key was the raw clientId: 128 four-byte characters passed LMDB's
    # 511-byte limit and the whole import failed (review helper-36). Such ids are
    # refused now (helper-95); the longest allowed is 200 bytes.
    from storage.keys import billing_move

    client = "\U0001F600" * 50
    key = {"key": "cs_live_longclient", "clientId": client, "sites": [{"siteId": "web"}]}
    storage = Storage(tmp_path)
    try:
        _import(storage, key)
        _import(storage, {**key, "billingAccount": "elsewhere"})
        with storage.read() as txn:
            assert billing_move(txn, storage.dbs.meta, client) != ""
    finally:
        storage.close()


def test_live_demo_keys_are_found_until_revoked(tmp_path: Path) -> None:
    # serve without --demo warns of the public keys an earlier --demo left live (audit helper-40)
    from collector.demo import DEMO_KEYS, DEMO_TENANTS
    from collector.tenants_admin import live_keys_among, revoke_key

    storage = Storage(tmp_path)
    try:
        assert live_keys_among(storage, DEMO_KEYS) == []
        import_tenants(storage, DEMO_TENANTS)
        assert live_keys_among(storage, DEMO_KEYS) == list(DEMO_KEYS)
        revoke_key(storage, DEMO_KEYS[0])
        assert live_keys_among(storage, DEMO_KEYS) == list(DEMO_KEYS[1:])
    finally:
        storage.close()


def test_a_rotation_racing_an_import_cannot_undo_its_suspension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rotation read the key, then wrote the replacement and the revoked key from
    # that read in a second transaction: an import suspending the account in between
    # was overwritten, and the replacement served unsuspended (helper-73).
    storage = Storage(tmp_path / "data")
    suspending = tmp_path / "suspend.json"
    suspending.write_text(json.dumps({"keys": [{**SERVER, "suspended": True}]}))
    racing: list[subprocess.Popen[bytes]] = []

    class SlowSecrets:
        @staticmethod
        def token_hex(n: int) -> str:  # the moment between the read and the write
            racing.append(subprocess.Popen(
                [sys.executable, "-m", "collector", "tenants", "import", str(suspending),
                 "--data-dir", str(tmp_path / "data")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(3)  # time enough for the import to commit, had it not to wait for the rotation
            return "f" * (2 * n)

    try:
        _import(storage, SERVER)
        monkeypatch.setattr("collector.tenants_admin.secrets", SlowSecrets)
        replacement = rotate_key(storage, SERVER["key"])  # type: ignore[arg-type]
        assert racing[0].wait(timeout=60) == 0
        records = {r.key: r for r in list_records(storage)}
        assert records[replacement].is_suspended and records[SERVER["key"]].revokedAt  # type: ignore[index]
    finally:
        storage.close()


def test_a_damaged_key_record_is_a_clear_refusal_for_the_key_commands(tmp_path: Path) -> None:
    # rotate, revoke and mint ended in a msgspec traceback, exit 1 (helper-74).
    from collector.tenants_admin import KeyAdminError, mint_stream_token, revoke_key
    from storage.keys import put_keys

    storage = Storage(tmp_path)
    try:
        put_keys(storage, [("cs_srv_live_damaged0", b"garbage{"), ("cs_srv_live_noclient", b'{"key": "x"}')])
        for key in ("cs_srv_live_damaged0", "cs_srv_live_noclient"):
            for command in (lambda k: rotate_key(storage, k), lambda k: revoke_key(storage, k),
                            lambda k: mint_stream_token(storage, k, ttl_s=60)):
                with pytest.raises(KeyAdminError, match="does not decode .*tenants import"):
                    command(key)
    finally:
        storage.close()
