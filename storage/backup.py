"""Online, compacted backups of the data directory and checked restores.

`backup` copies the LMDB environment with `env.copy(compact=True)` inside
one read snapshot (so writers keep going) and writes MANIFEST.json with the
SHA-256 of the copy. `restore` verifies that checksum first, then moves the
copy into place atomically (temp dir beside the target, fsync, rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from storage.env import Storage
from storage.errors import mapped_lmdb_errors
from storage.outbox import last_seq

MANIFEST = "MANIFEST.json"


class BackupError(ValueError):
    """A backup or restore cannot go ahead; nothing was changed."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def backup(storage: Storage, dest: Path) -> dict[str, object]:
    if dest.exists() and any(dest.iterdir()):
        raise BackupError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    with mapped_lmdb_errors():
        storage.env.copy(str(dest), compact=True)
    data = dest / "data.mdb"
    manifest = {
        "format": storage.format_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bytes": data.stat().st_size,
        "sha256": _sha256(data),
        "outboxLastSeq": last_seq(storage),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def restore(src: Path, data_dir: Path, *, force: bool = False) -> dict[str, object]:
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{src} has no readable {MANIFEST}: {exc}") from None
    data = src / "data.mdb"
    if not data.exists():
        raise BackupError(f"{src} has no data.mdb")
    actual = _sha256(data)
    if actual != manifest.get("sha256"):
        raise BackupError(f"checksum mismatch for {data}: manifest {manifest.get('sha256')}, file {actual}")
    if data_dir.exists() and any(data_dir.iterdir()) and not force:
        raise BackupError(f"{data_dir} is not empty; pass --force to replace it")
    staging = data_dir.with_name(data_dir.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copyfile(data, staging / "data.mdb")
    with (staging / "data.mdb").open("rb+") as handle:
        os.fsync(handle.fileno())
    if data_dir.exists():
        old = data_dir.with_name(data_dir.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        data_dir.rename(old)
        staging.rename(data_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(data_dir)
    return manifest
