"""Settings precedence (flags > TOML > environment > defaults) and the key cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collector.access.keycache import KeyCache
from collector.errors import ServiceError
from collector.fieldkeys import KeyFileError, load_or_create
from collector.settings import SettingsError, load_settings, unknown_environment
from collector.tenants_admin import import_tenants, revoke_key
from storage.env import Storage


def test_precedence(tmp_path: Path) -> None:
    config = tmp_path / "collector.toml"
    config.write_text('bind = "0.0.0.0:9000"\ndata_dir = "/from/toml"\nkey_cache_ttl = 5\n')
    settings = load_settings(
        {"data_dir": "/from/flag"},
        config_file=str(config),
        environ={"COLLECTOR_DATA_DIR": "/from/env", "COLLECTOR_BIND": "1.1.1.1:1", "COLLECTOR_ENV": "development"},
    )
    assert settings.data_dir == "/from/flag"
    assert settings.bind == "0.0.0.0:9000"
    assert settings.key_cache_ttl == 5
    assert settings.production is False
    assert load_settings({}, environ={}).data_dir == "./data"


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("colour = 'red'\n")
    with pytest.raises(SettingsError, match="colour"):
        load_settings({}, config_file=str(config), environ={})
    with pytest.raises(SettingsError, match="idempotency_window_hours"):
        load_settings({}, environ={"COLLECTOR_IDEMPOTENCY_WINDOW_HOURS": "2"})
    config.write_text("bind = [")
    with pytest.raises(SettingsError, match="TOML"):
        load_settings({}, config_file=str(config), environ={})


def test_an_empty_environment_variable_is_unset_and_lists_are_trimmed() -> None:
    # COLLECTOR_DATA_DIR= served from the working directory, and a list with a space
    # after its comma was refused (audit helper-40).
    settings = load_settings({}, environ={
        "COLLECTOR_DATA_DIR": "", "COLLECTOR_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.0.0/16,",
        "COLLECTOR_TRUSTED_ORIGIN": " https://dash.example.com ",
    })
    assert settings.data_dir == "./data"
    assert settings.trusted_proxies == ["10.0.0.0/8", "192.168.0.0/16"]
    assert settings.trusted_origin == ["https://dash.example.com"]
    assert load_settings({"trusted_origin": ["https://dash.example.com/"]}, environ={}).trusted_origin
    for origin in ("not a url", "*", "https://dash.example.com/x", "ftp://x", "https://x:0", "https://a b.com",
                   "https://x.com:", "https://*.example.com", "https://bücher.example"):
        with pytest.raises(SettingsError, match="trusted_origin"):
            load_settings({"trusted_origin": [origin]}, environ={})


def test_key_cache_ttls_and_unreadable_store(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    now = [0.0]
    cache = KeyCache(storage, ttl=120, negative_ttl=30, clock=lambda: now[0])
    assert cache.lookup("cs_live_new0000000") is None
    import_tenants(storage, b'{"keys": [{"key": "cs_live_new0000000", "clientId": "n"}]}')
    now[0] = 29.9
    assert cache.lookup("cs_live_new0000000") is None  # the failed lookup is cached 30 s
    now[0] = 30.1
    assert cache.lookup("cs_live_new0000000") is not None
    storage.close()
    now[0] = 200.0
    with pytest.raises(ServiceError) as info:
        cache.lookup("cs_live_new0000000")
    assert info.value.code == "service_unavailable"
    assert info.value.response_headers()["Retry-After"] == "5"


def test_the_key_cache_lets_the_least_recently_used_key_go_first(tmp_path: Path) -> None:
    # helper-127: a hit kept the key's place, so a flood of unknown keys pushed out the
    # keys every request uses, each then read from storage again.
    storage = Storage(tmp_path)
    import_tenants(storage, b'{"keys": [{"key": "cs_live_hot0000000", "clientId": "h"}]}')
    cache = KeyCache(storage, max_entries=3)
    assert cache.lookup("cs_live_hot0000000") is not None
    for n in range(10):
        assert cache.lookup(f"cs_live_unknown{n:04d}") is None
        assert cache.lookup("cs_live_hot0000000") is not None
    assert cache.statistics().misses == 11  # the hot key was read once


def test_a_collector_variable_that_is_no_setting_is_noted_with_the_likely_one() -> None:
    # helper-119: COLLECTOR_DATADIR (misspelt) in the unit's env file was ignored without a word
    notes = unknown_environment({"COLLECTOR_DATADIR": "/srv", "COLLECTOR_BOGUS": "1", "COLLECTOR_WORKERS": "2",
                                 "PATH": "/bin"})
    assert notes == [
        "environment variable COLLECTOR_BOGUS is not a setting and is ignored",
        "environment variable COLLECTOR_DATADIR is not a setting and is ignored (did you mean COLLECTOR_DATA_DIR?)",
    ]


def test_a_key_no_import_could_hold_is_unknown_and_never_cached(tmp_path: Path) -> None:
    # helper-114: every unknown key was cached whatever its size; 80,000 random 30 KB
    # keys in ?key= (each a 401, no key needed) held 1.5 GB.
    storage = Storage(tmp_path)
    cache = KeyCache(storage)
    for key in ("k" * 257, "k" * 30_000, "short"):
        assert cache.lookup(key) is None
    assert cache.statistics().entries == 0
    assert cache.lookup("k" * 256) is None and cache.statistics().entries == 1  # a length a key may have


def test_suspension_reaches_a_cached_key_within_a_minute_and_revocation_within_two(tmp_path: Path) -> None:
    # Spec 5.6: suspension propagates in about 60 s (at most 90); key config is cached 2 minutes.
    storage = Storage(tmp_path)
    now = [0.0]
    cache = KeyCache(storage, ttl=120, negative_ttl=30, clock=lambda: now[0])
    key = "cs_live_sus0000000"
    import_tenants(storage, b'{"keys": [{"key": "%s", "clientId": "s", "name": "before"}]}' % key.encode())
    assert cache.lookup(key) is not None
    import_tenants(storage, b'{"keys": [{"key": "%s", "clientId": "s", "name": "after", "suspended": true}]}'
                   % key.encode())
    now[0] = 59.0
    assert not cache.lookup(key).suspended  # type: ignore[union-attr]
    now[0] = 60.0
    record = cache.lookup(key)
    assert record is not None and record.suspended
    assert record.name == "before"  # only the suspension is re-read early
    revoke_key(storage, key)
    now[0] = 119.0
    assert cache.lookup(key) is not None
    now[0] = 120.0
    assert cache.lookup(key) is None
    storage.close()


def test_a_key_record_that_is_not_utf8_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    import_tenants(storage, b'{"keys": [{"key": "cs_live_bad0000000", "clientId": "acme"}]}')
    with storage.env.begin(write=True) as txn:
        raw = txn.get(b"cs_live_bad0000000", db=storage.dbs.keys)
        txn.put(b"cs_live_bad0000000", raw.replace(b'"acme"', b'"\xffcme"'), db=storage.dbs.keys)
    with pytest.raises(ServiceError) as info:
        KeyCache(storage, ttl=120, negative_ttl=30).lookup("cs_live_bad0000000")
    assert info.value.code == "service_unavailable"
    storage.close()


def test_a_field_key_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "field-keys.json"
    path.write_bytes(b'{"active": "\xff1", "keys": {}}')
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="is not valid"):
        load_or_create(path)


def test_a_bad_setting_names_where_it_came_from(tmp_path: Path) -> None:
    # An operator command refused for a COLLECTOR_* variable meant for serve said
    # only `$.workers` (helper-63).
    with pytest.raises(SettingsError, match=r"workers.*\(from environment variable COLLECTOR_WORKERS\)"):
        load_settings({}, environ={"COLLECTOR_WORKERS": "abc"})
    with pytest.raises(SettingsError, match=r"'localhost' \(from environment variable COLLECTOR_BIND\)"):
        load_settings({}, environ={"COLLECTOR_BIND": "localhost"})
    config = tmp_path / "c.toml"
    config.write_text("workers = 0\n")
    with pytest.raises(SettingsError, match=rf"\(from config file {config}\)"):
        load_settings({}, config_file=str(config), environ={"COLLECTOR_WORKERS": "2"})
    with pytest.raises(SettingsError, match=r"'nowhere' \(from the command line\)"):
        load_settings({"bind": "nowhere"}, environ={"COLLECTOR_BIND": "127.0.0.1:1"})
    config.write_text('bindd = "127.0.0.1:1"\n')  # a misspelt key, which has no `$.` path (helper-109)
    with pytest.raises(SettingsError, match=rf"unknown field `bindd` \(from config file {config}\)"):
        load_settings({}, config_file=str(config))


def test_a_stale_temp_key_file_of_this_pid_does_not_block_a_rotation(tmp_path: Path) -> None:
    # A rotation killed between writing and renaming leaves .field-keys.json.<pid>.tmp;
    # in a container the next run often has the same pid, and O_EXCL failed every time (helper-65).
    from collector import fieldkeys

    path = tmp_path / "field-keys.json"
    fieldkeys.load_or_create(path)
    (tmp_path / f".field-keys.json.{os.getpid()}.tmp").write_bytes(b"half")
    assert fieldkeys.rotate(path) == "k2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["field-keys.json"]


def test_a_key_file_serve_would_refuse_is_not_rotated(tmp_path: Path) -> None:
    # rotate-field-key read {"kx": "zz"} and wrote it on beside a new key, exit 0 (helper-75).
    from collector import fieldkeys

    path = tmp_path / "field-keys.json"
    path.write_text('{"active": "kx", "keys": {"kx": "zz"}}')
    path.chmod(0o600)
    with pytest.raises(KeyFileError):
        fieldkeys.rotate(path)
    assert path.read_text() == '{"active": "kx", "keys": {"kx": "zz"}}'
