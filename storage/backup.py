"""Online, compacted backups of the data directory, and checked restores.

`backup` copies the LMDB environment with `env.copy(compact=True)` from one
read snapshot, so the writer keeps committing while it runs; the manifest's
counts come from that same snapshot. MANIFEST.json is written last: a
directory without it is an unfinished backup and `restore` refuses it.

`restore` checks everything before it changes anything (manifest, size,
SHA-256, storage format, that no collector has the target open), then copies
into a temp directory beside the target, fsyncs it and renames it into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

import lmdb
import msgspec

from storage.env import DB_NAMES, FORMAT_VERSION, FormatError, Storage, parse_format
from storage.errors import UNREADABLE_RECORD, StorageError, StorageFull, mapped_lmdb_errors
from storage.outbox import NEXT_SEQ

MANIFEST = "MANIFEST.json"
DATA_FILE = "data.mdb"
LMDB_MAGIC = 0xBEEFC0DE  # in every LMDB meta page, 16 bytes into the file
_CHUNK = 1 << 20


class BackupError(ValueError):
    """A backup or restore cannot go ahead; the one-line message says why. Nothing was changed."""


class Restored(NamedTuple):
    manifest: BackupManifest  # the backup's: its node_id is the backed-up node's
    node_id: str  # the restored directory's own, new node id


class BackupManifest(msgspec.Struct, frozen=True, rename="camel"):
    format: int  # the storage format of the copy
    created: str  # UTC, ISO 8601
    node_id: str
    data_bytes: int  # size of data.mdb
    sha256: str  # of data.mdb
    outbox_last_seq: int  # the last sequence number ever allocated (0: none)
    records: dict[str, int]  # entries per named database


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(BackupManifest)


def backup(
    storage: Storage, dest_dir: str | os.PathLike[str], *, extra_files: Sequence[tuple[Path, str]] = ()
) -> BackupManifest:
    """Copy the open data directory into `dest_dir` (absent or empty) and describe it.

    `extra_files`, (source, name in the backup) pairs such as the field key
    file, are copied in before the manifest, so a
    backup that has its manifest has them too. Raises BackupError when
    dest_dir is not an empty directory or cannot be written, StorageError
    when LMDB cannot make the copy; a failed backup removes what it wrote.
    """
    dest = Path(dest_dir)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        if (dest / "data.mdb").exists() and not (dest / MANIFEST).exists():
            # (a backup killed before its manifest: nothing restore would take)
            raise BackupError(
                f"backup destination {dest} holds an unfinished backup (a data.mdb without {MANIFEST}):"
                " remove it and run the backup again"
            )
        raise BackupError(f"backup destination {dest} is not an empty directory")
    created_dir = not dest.exists()
    # LMDB creates the copy with the umask and it is made 0600 only once done: a
    # destination that exists already (0755) showed the events to any local
    # user meanwhile. The manifest is owner-only too.
    umask = os.umask(0o077)
    try:
        return _backup(storage, dest, created_dir, extra_files)
    finally:
        os.umask(umask)


def _backup(
    storage: Storage, dest: Path, created_dir: bool, extra_files: Sequence[tuple[Path, str]]
) -> BackupManifest:
    try:
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise BackupError(f"cannot create the backup destination {dest}: {exc.strerror or exc}") from None
    written = [DATA_FILE, MANIFEST, MANIFEST + ".tmp", *(name for _, name in extra_files)]
    try:
        with mapped_lmdb_errors(), storage.read() as txn:
            storage.env.copy(str(dest), compact=True, txn=txn)
            raw_next = txn.get(NEXT_SEQ, db=storage.dbs.meta)
            raw_format = txn.get(b"format", db=storage.dbs.meta)
            records = {
                name: int(txn.stat(getattr(storage.dbs, name))["entries"]) for name in DB_NAMES
            }
        data = dest / DATA_FILE
        os.chmod(data, 0o600)  # as restore leaves it: the events are the tenants' data
        digest, size = _sha256(data, fsync=True)
        manifest = BackupManifest(
            format=parse_format(raw_format, storage.path),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            node_id=storage.node_id,
            data_bytes=size,
            sha256=digest,
            outbox_last_seq=int.from_bytes(raw_next, "big") - 1 if raw_next else 0,
            records=records,
        )
        for source, name in extra_files:
            copied = dest / name
            shutil.copy2(source, copied)  # keeps the key file's 0600
            with copied.open("rb") as handle:
                os.fsync(handle.fileno())
        _write_durably(dest / MANIFEST, _manifest_encoder.encode(manifest) + b"\n")
        _fsync_dir(dest)
    except BaseException as exc:
        for name in written:
            with contextlib.suppress(FileNotFoundError):
                (dest / name).unlink()
        if created_dir:
            with contextlib.suppress(OSError):
                dest.rmdir()
        if isinstance(exc, OSError):
            raise BackupError(f"backup to {dest} failed: {exc.strerror or exc}; nothing was kept") from None
        if isinstance(exc, StorageFull):  # (LMDB's copy writing into a full destination: helper-100)
            raise BackupError(f"backup to {dest} failed: {exc}; nothing was kept") from None
        if isinstance(exc, FormatError):
            raise BackupError(f"{exc}; nothing was kept") from None
        raise
    return manifest


def restore(
    src_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    carry_files: Sequence[tuple[str, str]] = (),
) -> Restored:
    """Verify the backup in `src_dir`, then make it the data directory `data_dir`.

    Raises BackupError, with nothing changed, when the backup is incomplete,
    its size or checksum differs from the manifest, its format is newer than
    this collector reads, `data_dir` is not empty (unless force) or a
    collector has `data_dir` open, or (even with force) `data_dir` holds
    something other than a collector's data. Call it from a process that does not have
    `data_dir` open itself: the in-use probe cannot see its own process.
    Each of `carry_files`, (its name in a backup, its path inside `data_dir`),
    such as the field-encryption key file, is taken from the backup when it
    has one, else kept from the directory being replaced, inside the same
    atomic swap. Once the swap is made, SIGINT and SIGTERM wait until the
    restore is finished (the command's answer must not say "interrupted"
    about a directory already replaced).
    """
    src = Path(src_dir)
    manifest = read_manifest(src)
    data = src / DATA_FILE
    try:
        size = data.stat().st_size
    except OSError:
        raise BackupError(f"{src} has no {DATA_FILE}: not a backup") from None
    if size != manifest.data_bytes:
        raise BackupError(
            f"size mismatch: {data} is {size} bytes, {MANIFEST} says {manifest.data_bytes}"
        )
    actual, _ = _sha256(data)
    if actual != manifest.sha256:
        raise BackupError(
            f"checksum mismatch: {data} has SHA-256 {actual}, {MANIFEST} says {manifest.sha256}"
        )
    version = _format_of(src)
    if version > FORMAT_VERSION:
        raise BackupError(
            f"the backup has storage format {version}; this collector reads formats up to"
            f" {FORMAT_VERSION}: upgrade the collector"
        )

    target = Path(os.path.abspath(data_dir))  # `.` has no name to put the staging copy beside
    # /var/lib/collector is a symlink under DynamicUser: replace what it points at.
    target = target.resolve() if target.is_symlink() else target
    if src.resolve().is_relative_to(target.resolve()):
        raise BackupError(f"the backup {src} is inside {target}, which restoring replaces: move it out first")
    occupied = target.exists()
    if occupied and not target.is_dir():
        raise BackupError(f"{target} exists and is not a directory")
    non_empty = occupied and any(target.iterdir())
    if non_empty:
        # Checked before --force is even mentioned: it replaces a data directory,
        # never whatever a mistyped path names (a home directory, another app's LMDB).
        foreign = _foreign(target, [inside for _, inside in carry_files])
        if foreign:
            raise BackupError(f"{target} is not empty and not a collector data directory: {foreign};"
                              " restore into an empty or new directory instead")
        if not force:
            raise BackupError(f"{target} is not empty; pass --force to replace it")

    target.parent.mkdir(parents=True, exist_ok=True)
    with _held_for_restore(target):
        # Checked again once the locks are held, and again before the swap: a
        # command that opened the directory meanwhile (a serve cannot: it
        # needs the lock on data.mdb held here) would lose what it writes.
        if non_empty and _in_use(target):
            raise BackupError(f"{target} is open in a running collector; stop it before restoring")
        staging = target.with_name(f".{target.name}.restoring")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        try:
            try:
                copied = _copy_and_hash(data, staging / DATA_FILE)
                if copied != manifest.sha256:
                    raise BackupError(f"checksum mismatch: {data} changed while it was copied")
                node_id = _renew_node_id(staging)
                for backup_name, inside in carry_files:
                    for origin in (src / backup_name, target / inside):
                        if origin.is_file():
                            _carry(origin, staging / inside)
                            break
                _fsync_dir(staging)
            except (OSError, StorageError) as exc:  # (a full disk while copying: said with the path; helper-100)
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise BackupError(f"restore into {target} failed while copying: {why}; nothing was changed") from None
            if non_empty and _in_use(target):
                raise BackupError(f"{target} was opened by a collector command during the restore; nothing was changed")
            with _signals_held():
                if non_empty:
                    _replace_non_empty(staging, target)
                else:
                    os.replace(staging, target)  # onto an absent or empty directory: one rename
                try:
                    _fsync_dir(target.parent)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Restored(manifest, node_id)


def _foreign(target: Path, carried: Sequence[str]) -> str:
    """Why `target` is not a collector data directory ("" when it is one, or a damaged one).

    A collector directory holds data.mdb, lock.mdb and the carried files (the
    field key) and nothing else: anything more (a user's files, a key the
    settings no longer name) says it is not ours, whatever state data.mdb is
    in. Its data.mdb must be an LMDB file whose databases are all the
    collector's; one cut short (LMDB faults reading it) is what a restore is
    for. Whatever cannot be told is refused: the operator can always remove a
    damaged data.mdb by hand, while a wrong guess deletes someone's data.
    """
    own = {Path(DATA_FILE), Path("lock.mdb"), *(Path(inside) for inside in carried)}
    own_dirs = {parent for path in own for parent in path.parents if parent != Path(".")}
    strays = list(itertools.islice(_strays(target, own, own_dirs), 4))
    if strays:
        return f"it holds {', '.join(strays[:3])}" + (", ..." if len(strays) > 3 else "")
    data = target / DATA_FILE
    if (data.is_symlink() or data.exists()) and not data.is_file():
        return f"its {DATA_FILE} is not a regular file"  # a dangling link would be created at its target
    if not data.is_file():
        return ""
    # In a child process: a data.mdb cut short can fault LMDB's mapping (SIGBUS).
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from storage.backup import foreign_databases;"
             " print(foreign_databases(Path(sys.argv[1])))", str(target)],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
        )
    except subprocess.TimeoutExpired:
        return f"its {DATA_FILE} could not be inspected within 60 s"
    if probe.stdout.strip():  # a reason, printed the moment it was seen: it stands even if LMDB faulted later
        return probe.stdout.strip().splitlines()[0]
    if probe.returncode == -signal.SIGBUS:
        return ""  # a collector-shaped LMDB file (magic checked first) cut short: damaged, ours to replace
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        return f"its {DATA_FILE} could not be inspected ({reason})"
    return ""


def _strays(target: Path, own: set[Path], own_dirs: set[Path]) -> Iterator[str]:
    """Paths under `target` that are not the collector's, lazily: a mistyped /usr has 100,000."""
    for root, dirs, files in os.walk(target):
        here = Path(root).relative_to(target)
        for name in sorted(dirs):
            if here / name not in own_dirs:
                dirs.remove(name)  # reported, not descended into
                yield str(here / name)
        for name in sorted(files):
            if here / name not in own:
                yield str(here / name)


def foreign_databases(target: Path) -> str:
    """"" when target's data.mdb is an LMDB file shaped like the collector's, else why not.

    Run in a child process (see _foreign), which prints the result; a reason
    is printed and flushed the moment it is known, since reading further into
    a file cut short can fault the process. Read-only and without the lock
    file: opening that would write LMDB's header into whatever it is (or links to).
    """
    data = target / DATA_FILE
    with data.open("rb") as handle:
        head = handle.read(20)
    if len(head) < 20 or int.from_bytes(head[16:20], "little") != LMDB_MAGIC:
        return f"its {DATA_FILE} is not an LMDB file (remove it first if it is the collector's, damaged)"
    try:
        env = lmdb.open(str(target), readonly=True, lock=False, max_dbs=len(DB_NAMES) + 1, create=False,
                        map_size=2 * data.stat().st_size + 64 * 1024 * 1024)
        try:
            return _shape_problem(env)
        finally:
            env.close()
    except lmdb.Error as exc:
        return f"its {DATA_FILE} cannot be read as LMDB ({exc})"


def _shape_problem(env: lmdb.Environment) -> str:
    def seen(reason: str) -> NoReturn:
        print(reason, flush=True)  # before anything later can fault
        sys.exit(0)

    # The entry count is in the meta page: read without walking a tree that may be cut short.
    entries = env.stat()["entries"]
    if entries > len(DB_NAMES):
        seen(f"its LMDB environment is not a collector's ({entries} entries in its main database)")
    names: set[str] = set()
    with env.begin() as txn:
        for key, _ in txn.cursor():
            name = bytes(key).decode("utf-8", "replace")
            if name not in DB_NAMES:
                seen(f"its LMDB environment is not a collector's (it has {name!r})")
            names.add(name)
        # Every collector environment has its meta database with a node id, made with the others.
        if "meta" not in names or txn.get(b"node_id", db=env.open_db(b"meta", txn=txn, create=False)) is None:
            seen(f"its LMDB environment is not a collector's (no node id among {sorted(names)})")
    return ""


def _carry(origin: Path, destination: Path) -> None:
    """Copy a file into the staging directory, durably: the old directory, maybe its only copy, goes next."""
    destination.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy2(origin, destination)  # keeps owner-only permissions
    with destination.open("rb") as handle:
        os.fsync(handle.fileno())
    _fsync_dir(destination.parent)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends; one that came meanwhile is then dropped.

    For the swap and what follows it: once the old directory is replaced the
    restore is done, and an interrupt there must not report it undone. The
    mask is the calling thread's: the operator commands run on one thread.
    """
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        while signal.sigtimedwait(held - previous, 0) is not None:
            pass  # consumed: the work it would have interrupted is finished
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _held_for_restore(target: Path) -> Iterator[None]:
    """Hold off a second restore beside `target` (a flock on its parent) and a serve of it.

    `serve` holds an exclusive flock on data.mdb for as long as it runs (and
    its workers after it): taking that lock here refuses a restore while one
    serves, and refuses a serve that starts while the copy is made, which
    would otherwise acknowledge events into the directory about to be replaced.
    """
    descriptors: list[int] = []
    created, data = False, target / DATA_FILE
    try:
        try:
            parent = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            descriptors.append(parent)
            if not _try_flock(parent):
                raise BackupError(f"another restore into {target.parent} is running; wait for it")
            if data.exists() or (target.is_dir() and any(target.iterdir())):
                # A serve creates data.mdb when it is missing, so a non-empty target
                # gets an (empty) one to lock: a serve that started and stopped during
                # the copy would otherwise go unseen. An empty or absent target needs
                # none: the final rename fails if anything appeared in it.
                created = not data.exists()
                served = os.open(data, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
                descriptors.append(served)
                if not _try_flock(served):
                    raise BackupError(f"{target} is served by a running collector; stop it before restoring")
        except OSError as exc:
            raise BackupError(f"cannot lock {target} for the restore: {exc.strerror or exc}") from None
        yield
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
        if created:  # left only when the restore failed: the swap takes it away with the old directory
            with contextlib.suppress(OSError):
                if data.stat().st_size == 0:
                    data.unlink()


def _try_flock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def read_manifest(src: Path) -> BackupManifest:
    """The manifest of a finished backup; BackupError when missing or malformed."""
    try:
        raw = (src / MANIFEST).read_bytes()
    except OSError as exc:
        raise BackupError(
            f"{src} has no readable {MANIFEST} ({exc.strerror}): not a finished backup"
        ) from None
    try:
        return _manifest_decoder.decode(raw)
    except UNREADABLE_RECORD as exc:
        raise BackupError(f"{src / MANIFEST} is not a backup manifest: {exc}") from None


# -- helpers ----------------------------------------------------------------


def _format_of(src: Path) -> int:
    """The format marker inside a backup copy, read without writing to src."""
    try:
        env = lmdb.open(str(src), readonly=True, lock=False, max_dbs=len(DB_NAMES) + 8, subdir=True)
    except lmdb.Error as exc:
        raise BackupError(f"{src / DATA_FILE} is not an LMDB environment: {exc}") from None
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            raw = txn.get(b"format", db=meta)
    except lmdb.Error as exc:
        raise BackupError(f"{src / DATA_FILE} holds no collector data: {exc}") from None
    finally:
        env.close()
    try:
        return parse_format(raw, src / DATA_FILE)
    except FormatError as exc:
        raise BackupError(str(exc)) from None


def _renew_node_id(staging: Path) -> str:
    """Give the restored directory a node id of its own.

    Receipt ids are `rcpt_<node id><seq>`. A restored older backup hands out
    again the sequence numbers issued after it was taken (those events are
    lost with the directory it replaces), and a second restore of one backup
    is a clone: with the old node id both would repeat receipts already given
    to clients. Stored receipts keep resolving: a record carries its own.
    """
    # A compacted copy has no free pages: the map needs room past the file for the put.
    map_size = (staging / DATA_FILE).stat().st_size + 64 * 1024 * 1024
    env = lmdb.open(str(staging), max_dbs=len(DB_NAMES) + 8, subdir=True, map_size=map_size)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            node_id = secrets.token_hex(4)
            txn.put(b"node_id", node_id.encode(), db=meta)
    except lmdb.Error as exc:
        raise BackupError(f"the restored copy could not be updated: {exc}") from None
    finally:
        env.close()
    (staging / "lock.mdb").unlink(missing_ok=True)
    return node_id


def _in_use(directory: Path) -> bool:
    """True while some process has the environment open.

    Every process with an LMDB environment open holds a shared fcntl lock on
    byte 0 of lock.mdb; an exclusive lock on that byte succeeds only when none do.
    """
    try:
        fd = os.open(directory / "lock.mdb", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise BackupError(f"cannot tell whether {directory} is in use: {exc.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the probe lock
    return False


def _replace_non_empty(staging: Path, target: Path) -> None:
    """Put staging at target's path; the old directory is removed afterwards."""
    if _exchange(staging, target):
        return  # staging now holds the old data; the caller removes it
    # No atomic exchange on this system: two renames, with the old data kept aside
    # until the new directory is in place.
    aside = target.with_name(f".{target.name}.replaced")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(target, aside)
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    renameat2.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _sha256(path: Path, *, fsync: bool = False) -> tuple[str, int]:
    """(hex digest, size) of a file; with fsync, also makes its content durable."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
            size += len(block)
        if fsync:
            os.fsync(handle.fileno())
    return digest.hexdigest(), size


def _copy_and_hash(src: Path, dest: Path) -> str:
    digest = hashlib.sha256()
    with src.open("rb") as reader, dest.open("xb") as writer:
        os.fchmod(writer.fileno(), 0o600)
        while block := reader.read(_CHUNK):
            digest.update(block)
            writer.write(block)
        writer.flush()
        os.fsync(writer.fileno())
    return digest.hexdigest()


def _write_durably(path: Path, content: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
