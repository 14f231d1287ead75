"""The field-encryption key file: created on first use, owner-only, rotatable.

    {"active": "k2", "keys": {"k1": "<base64 of 32 bytes>", "k2": "..."}}

By default it is `field-keys.json` in the data directory, created with mode
0600 the first time the collector needs it; an operator may keep it elsewhere
(`field_key_file`, for example a systemd credential). A file readable by
group or others is refused. `collector keys rotate-field-key` adds a key and
makes it active (for a running server, from its next start); older keys
stay so older values still open. Backups of the
LMDB environment do not include this file: back it up separately, since
sealed values cannot be revealed without it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import msgspec

from collector.ingest.sealing import FieldSealer, rotation_number
from collector.settings import Settings
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD
from storage.field_key_ids import record_key_ids, recorded_key_ids, recorded_key_prints

DEFAULT_NAME = "field-keys.json"


class KeyFileError(Exception):
    """The key file cannot be used; the message says why."""


class _KeyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    active: str
    keys: dict[str, str]


def key_file_path(settings: Settings) -> Path:
    return Path(settings.field_key_file or Path(settings.data_dir) / DEFAULT_NAME)


def _write_new(path: Path, content: _KeyFile, *, replace: bool = False) -> None:
    """Write atomically with owner-only permissions from the first byte, owned as what it replaces.

    Creation links the finished file into place, which fails if another
    process got there first (so two first starts never hold different keys);
    rotation replaces the old file in one step.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # One left by a killed earlier process that had this pid (containers reuse them) is stale.
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            _keep_owner(handle.fileno(), path)
            handle.write(msgspec.json.format(msgspec.json.encode(content)))
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temp, path)
        else:
            os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _keep_owner(fd: int, path: Path) -> None:
    """Run as root, give the new file the owner of the one it replaces, or of its directory.

    An operator command run as root (README, systemd) must leave the file to
    the service's user: a root-owned 0600 key stopped the next start. Root
    without CAP_CHOWN (or on root-squashed NFS) creates a first key as root,
    and refuses to replace another user's.
    """
    if os.geteuid() != 0:
        return
    replaced = path.exists()
    owner = (path if replaced else path.parent).stat()
    try:
        os.fchown(fd, owner.st_uid, owner.st_gid)
    except PermissionError:
        if replaced and owner.st_uid != 0:
            # Replacing a key its owner can read with one it cannot would stop
            # the service's next start without a word (helper-65): refuse instead.
            raise KeyFileError(
                f"cannot give the new field key file to uid {owner.st_uid}, the owner of {path}"
                " (no CAP_CHOWN): run the command as that user; nothing was changed"
            ) from None


def _read(path: Path) -> _KeyFile:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"field key file {path} is readable by others: chmod 600 it")
    try:
        return msgspec.json.decode(path.read_bytes(), type=_KeyFile)
    except UNREADABLE_RECORD as exc:
        raise KeyFileError(f"field key file {path} is not valid: {exc}") from None


def _sealer(content: _KeyFile, path: Path) -> FieldSealer:
    try:
        keys = {kid: base64.b64decode(value, validate=True) for kid, value in content.keys.items()}
        return FieldSealer(keys, content.active)
    except ValueError as exc:
        raise KeyFileError(f"field key file {path}: {exc}") from None


def load_or_create(path: Path) -> FieldSealer:
    """The sealer for the key file at `path`, creating the file with one key if absent."""
    if not path.exists():
        # FileExistsError: another process created it at the same moment
        with contextlib.suppress(FileExistsError):
            _write_new(path, _KeyFile("k1", {"k1": base64.b64encode(os.urandom(32)).decode()}))
    return _sealer(_read(path), path)


def serving_sealer(storage: Storage, path: Path) -> FieldSealer:
    """The sealer of a process about to seal: refuse a missing key file, or one lacking
    a key, where values were sealed; create it on a first start; record its key ids.

    Every worker reads the file when it starts: one restarted after a `keys
    rotate-field-key` sealed with a key id the directory had not recorded, and
    an older copy of the file then passed the lost-key check (helper-89); with
    the check skipped, one restarted without the file made a fresh k1 (helper-92).
    """
    refuse_a_lost_key_file(storage, path)
    sealer = load_or_create(path)  # (KeyFileError for a file that is not valid)
    record_key_ids(storage, sealer.key_ids, key_prints(path))
    return sealer


def key_prints(path: Path) -> dict[str, str]:
    """Key id -> a fingerprint of the key file's key (a digest: the key cannot be read from it)."""
    return {
        kid: hashlib.blake2b(value.encode(), digest_size=8, person=b"fieldkeyprint").hexdigest()
        for kid, value in _read(path).keys.items()
    }


def settle_key_file(storage: Storage, path: Path) -> None:
    """At start, once, before any worker: serving_sealer's checks and records."""
    serving_sealer(storage, path)


def refuse_a_lost_key_file(storage: Storage, path: Path) -> None:
    """KeyFileError when the key file is missing, or lacks a key id, where values were
    sealed: a new key would leave them unrevealable, and reuse their key id (serve;
    keys rotate-field-key). An older copy of the file lacks the keys added since."""
    recorded = recorded_key_ids(storage)
    if not recorded:
        return
    if not path.exists():
        problem = "is missing"
    elif lacking := sorted(set(recorded) - set((content := _read(path)).keys)):
        problem = f"lacks key {', '.join(lacking)}"
    else:
        # A file that is not valid is named as such first (a key that is not base64 was
        # reported as "another key": helper-104 went looking for another installation's file).
        _sealer(content, path)
        if not (other := _other_keys(storage, path)):
            return
        problem = f"holds another key under {', '.join(other)} (another installation's file?)"
    raise KeyFileError(
        f"field key file {path} {problem}, but this data directory records sealing with"
        f" key {', '.join(recorded)}: put the right file back (`collector backup --with-field-keys`"
        " copies it). Nothing was changed"
    )


def _other_keys(storage: Storage, path: Path) -> list[str]:
    """The ids under which the key file holds another key than the one the directory first recorded."""
    recorded = recorded_key_prints(storage)
    return sorted(kid for kid, made in key_prints(path).items() if recorded.get(kid, made) != made)


def load(path: Path) -> FieldSealer:
    """The sealer for the existing key file at `path`; KeyFileError when there is none."""
    if not path.exists():
        raise KeyFileError(f"no field key file at {path}: nothing sealed here can be revealed")
    return _sealer(_read(path), path)


def rotate(path: Path, taken: Iterable[str] = ()) -> str:
    """Add a fresh key, make it active, keep the old ones; returns the new key id, one
    neither in the file nor among `taken` (the ids the data directory recorded)."""
    content = _read(path) if path.exists() else _KeyFile("k0", {})
    if content.keys:
        _sealer(content, path)  # a file `serve` would refuse is not rotated into another (helper-75)
    ids = [*content.keys, *taken]
    number = 1 + max((n for kid in ids if (n := rotation_number(kid)) is not None), default=0)
    new_id = f"k{number}"
    keys = {**content.keys, new_id: base64.b64encode(os.urandom(32)).decode()}
    _write_new(path, _KeyFile(new_id, keys), replace=True)  # atomic: never a moment without keys
    return new_id
