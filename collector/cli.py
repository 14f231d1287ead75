"""The `collector` command of the operator contract.

Exit status 0 on success; on bad input a one-line message on stderr and 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from collector.access.tenants import TenantsFileError
from collector.logs import safe_json_text
from collector.settings import Settings, SettingsError, load_settings, unknown_environment
from collector.version import version
from storage.env import Storage
from storage.errors import StorageError

_json = msgspec.json.Encoder()


class UsageError(Exception):
    """Bad input from the operator: one line on stderr, exit status 2."""


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", dest="data_dir", default=None, help="the data directory (default $COLLECTOR_DATA_DIR, else ./data)"
    )
    # Every command reads the settings the service does (its data_dir, map sizes,
    # field_key_file): some refused --config and so could not find the directory.
    parser.add_argument("--config", default=None, help="a TOML file with the service's settings")


def _settings_from(args: argparse.Namespace) -> Settings:
    flags = {name: getattr(args, name, None) for name in ("data_dir", "bind", "env", "tenants", "workers")}
    flags["trusted_origin"] = getattr(args, "trusted_origin", None) or []
    if getattr(args, "demo", False):
        flags["demo_tenant"] = True
    if getattr(args, "no_access_log", False):
        flags["access_log"] = False
    for note in unknown_environment(os.environ):
        print(one_line(f"collector: note: {note}"), file=sys.stderr)
    return load_settings(flags, config_file=getattr(args, "config", None))


def _refuse_unusable_path(what: str, path: Path) -> None:
    from storage.datadir import non_utf8_path_problem

    if (problem := non_utf8_path_problem(what, path)) is not None:
        raise UsageError(problem)


def _check_data_dir(path: Path, *, create: bool) -> None:
    """Refuse (exit 2, one line) a path that is not a data directory, before anything writes there."""
    from storage.datadir import data_dir_problem

    problem = data_dir_problem(path, create=create)
    if problem is not None:
        raise UsageError(problem)


@contextlib.contextmanager
def _storage(args: argparse.Namespace, *, create: bool = False) -> Iterator[Storage]:
    """The data directory of the command's settings, closed afterwards.

    Only a command that fills a directory (`tenants import`) creates a missing
    one: for the others a mistyped --data-dir would look like an empty store.
    A path that cannot be opened as one is bad input (exit 2).
    """
    from collector.app import open_storage
    from storage.datadir import keep_directory_owner

    settings = _settings_from(args)
    path = Path(settings.data_dir)
    _check_data_dir(path, create=create)
    try:
        storage = open_storage(settings)
    except OSError as exc:
        raise UsageError(f"cannot open the data directory {path}: {exc.strerror or exc}") from None
    except StorageError as exc:
        raise UsageError(f"cannot open the data directory {path}: {exc}") from None
    keep_directory_owner(path)
    try:
        yield storage
    finally:
        storage.close()


def cmd_serve(args: argparse.Namespace) -> int:
    from collector.runtime import defer_stop_signals, stop_at_once_while_starting, tune_gc

    stop_at_once_while_starting()  # first, before the slow imports (serve() defers them once it serves)
    import trio

    from collector.app import serve
    from collector.logs import configure_logging

    settings = _settings_from(args)
    if settings.demo_tenant and settings.production:
        raise UsageError(
            "--demo imports keys published in the README: use it with --env development only"
        )
    # What each worker would refuse at its start, refused once here (one line, exit 2).
    from collector.app import bot_classifier, metrics_readers, trusted_proxies

    trusted_proxies(settings)
    metrics_readers(settings)
    bot_classifier(settings)
    if settings.tenants:  # refused before anything opens or logs (it is read again when serving)
        from collector.access.tenants import parse_tenants_file

        try:
            parse_tenants_file(Path(settings.tenants).read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read the tenants file {settings.tenants}: {exc.strerror}") from None
    _check_data_dir(Path(settings.data_dir), create=True)
    serving_lock, first_start = _one_serve_per_directory(Path(settings.data_dir))  # held until exit
    try:
        listener = _listen(settings)
    except UsageError:
        first_start.undo()  # a refused start leaves no empty data directory behind
        raise
    configure_logging()
    tune_gc()  # after the imports above: they are start-up objects, never scanned again
    if settings.workers > 1:
        from collector.workers import run_supervisor

        return run_supervisor(settings, listener, serving_lock)
    try:
        # hypercorn adopts the descriptor (fd://) and closes it when it stops
        trio.run(partial(serve, msgspec.structs.replace(settings, bind=f"fd://{listener.detach()}"), own_process=True))
    finally:
        # (serve deferred the signals once it served; a start that failed before
        # that must not have its failure turned into exit 0 by a signal)
        defer_stop_signals()
    return 0


class _FirstStart:
    """What `_one_serve_per_directory` created: an empty data.mdb, and the directories
    down to it that did not exist (deepest first)."""

    def __init__(self, data_dir: Path, made_dirs: list[Path], made_file: bool) -> None:
        self.data_dir, self.made_dirs, self.made_file = data_dir, made_dirs, made_file

    def undo(self) -> None:
        """Remove them again, while nothing else has been written (best effort)."""
        with contextlib.suppress(OSError):
            if self.made_file:
                (self.data_dir / "data.mdb").unlink()
        for directory in self.made_dirs:
            with contextlib.suppress(OSError):  # (each on its own: "new1/.." is not removable, "new1" is)
                directory.rmdir()  # (only while empty)


def _one_serve_per_directory(data_dir: Path) -> tuple[int, _FirstStart]:
    """Lock the data directory's `data.mdb` (flock), or refuse: a second serve on one directory.

    LMDB would keep the data consistent, but each serve runs its own retention
    sweep, visitor catch-up and full rate buckets (twice the key-wide limit).
    data.mdb itself, opened read-only: a directory the service may not write
    (its files writable) still serves. An empty data.mdb is created in a new
    directory, which LMDB takes as its first start. The operator commands do
    not take this lock; `--workers` children inherit it, so it outlives a
    parent killed while they drain.
    """
    import fcntl
    import os

    path = data_dir / "data.mdb"
    made_dirs = [d for d in (data_dir, *data_dir.absolute().parents) if not d.exists()]
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # (as Storage would, a moment later)
        made_file = not path.exists()
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"another collector serve already serves {data_dir}, or a restore is replacing it") from None
    except OSError as exc:  # (NFS emulates flock with POSIX locks, which want a writable descriptor)
        os.close(fd)
        raise UsageError(f"cannot lock {path}: {exc.strerror} (a network file system?)") from None
    return fd, _FirstStart(data_dir, made_dirs, made_file)


def _listen(settings: Settings) -> socket.socket:
    """The listening socket, bound before storage opens or anything logs, and kept for the server.

    A host that does not resolve, or a port in use or not allowed, is then one
    line and exit 2. (A probe closed again left the port to whoever bound it
    before the server did: a traceback and exit 1.)
    """
    from collector.workers import bind_listener

    if settings.bind.startswith("fd://"):  # how a worker gets its parent's socket: not an operator's
        raise UsageError(f"invalid setting: bind {settings.bind!r} is not HOST:PORT")
    try:
        return bind_listener(settings)
    except (socket.gaierror, UnicodeError):
        host = settings.host_port[0]
        raise UsageError(f"invalid setting: bind host {host!r} does not resolve") from None
    except OSError as exc:
        raise UsageError(f"cannot listen on {settings.bind}: {exc.strerror or exc}") from None


def cmd_tenants_import(args: argparse.Namespace) -> int:
    from collector.tenants_admin import import_tenants, imported_term_notes

    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    from collector.access.tenants import parse_tenants_file

    parse_tenants_file(data)  # a file that fails to parse creates no data directory either
    with _storage(args, create=True) as storage:
        imported = import_tenants(storage, data)
        for record in imported.records:
            # (a revoked key stays revoked: serve --tenants imports its file at every start)
            still = f" (revoked at {record.revokedAt}: it stays revoked)" if record.revokedAt else ""
            print(one_line(f"imported {record.key} clientId={record.clientId} keyType={record.key_type}{still}"))
        notes = imported_term_notes(storage, imported)
    for note in notes:
        print(one_line(f"collector: note: {note}"), file=sys.stderr)
    return 0


def cmd_tenants_list(args: argparse.Namespace) -> int:
    from collector.tenants_admin import list_records

    skipped = _Skipped("key record")
    with _storage(args) as storage:
        for record in list_records(storage, on_unreadable=skipped):
            _print_json(record)
    return skipped.status


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from collector.tenants_admin import rotate_key

    with _storage(args) as storage:
        print(rotate_key(storage, args.key))
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from collector.tenants_admin import revoke_key

    with _storage(args) as storage:
        revoke_key(storage, args.key)
    return 0


def cmd_stream_token_mint(args: argparse.Namespace) -> int:
    from collector.tenants_admin import mint_stream_token

    with _storage(args) as storage:
        print(mint_stream_token(storage, args.key, ttl_s=args.ttl))
    return 0


def _print_line(line: str) -> None:
    """One JSON line on stdout, escaped as log lines are (logs.safe_json_text): a reader
    splitting lines the Unicode way (str.splitlines) would cut the record in pieces
    (helper-107: replay dump and visitors show wrote U+2028 raw), and a terminal obeys C1."""
    sys.stdout.write(safe_json_text(line) + "\n")


def _print_json(value: object) -> None:
    _print_line(_json.encode(value).decode())


def cmd_outbox_dump(args: argparse.Namespace) -> int:
    """Every readable record on stdout; one line on stderr per record that does not decode, then exit 1."""
    from storage.outbox import iter_outbox

    skip = _Skipped("outbox seq")
    with _storage(args) as storage:
        for seq, record in iter_outbox(storage, after=args.after, on_unreadable=skip):
            try:
                event = record.event.decode()  # stored as bytes: decoding the record never read it
            except UnicodeDecodeError as exc:
                skip(seq, exc)
                continue
            head = _json.encode(
                {
                    "seq": seq,
                    "receiptId": record.receipt_id,
                    "clientId": record.client_id,
                    "siteId": record.site_id,
                    "eid": record.eid,
                    "committedAt": record.committed_ms,
                    "keyType": record.key_type,
                }
            )
            # The stored event is already JSON: splice it in rather than re-encode it.
            _print_line(f'{head[:-1].decode()},"event":{event}}}')
    return skip.status


def cmd_reveal(args: argparse.Namespace) -> int:
    from collector.fieldkeys import key_file_path, load, refuse_a_lost_key_file
    from collector.reveal import operator_identity, reveal

    settings = _settings_from(args)
    # The directory is checked first, and the key file only read: a mistyped
    # --data-dir must not get a directory and a fresh key (which serve would adopt).
    with _storage(args) as storage:
        # The file the directory's values were sealed with, or a refusal naming why not
        # (helper-100: another installation's file "revealed" nulls, blamed on tampering)
        refuse_a_lost_key_file(storage, key_file_path(settings))
        sealer = load(key_file_path(settings))
        event, entry = reveal(storage, sealer, args.receipt_id, reason=args.reason, who=operator_identity())
    _print_json({"audit": entry.seq, "receiptId": args.receipt_id, "event": event})
    return 0


def cmd_audit_list(args: argparse.Namespace) -> int:
    from storage.audit import iter_entries, verify_chain

    with _storage(args) as storage:
        for entry in iter_entries(storage):
            _print_json(entry)
        problems = verify_chain(storage)
    for problem in problems:
        print(f"collector: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _text_argument(what: str, value: str | None) -> None:
    """UsageError for a command-line argument whose bytes are not UTF-8 (surrogate escapes):
    no stored id can be one, and encoding it for a lookup ended in a traceback (helper-74)."""
    if value is not None and any("\udc80" <= ch <= "\udcff" for ch in value):
        raise UsageError(f"the {what} is not UTF-8 text: {ascii(value)}")


def cmd_visitors_show(args: argparse.Namespace) -> int:
    from storage.visitors import iter_visitors

    _text_argument("visitor id", args.visitor_id)
    _text_argument("--client value", args.client)

    skipped = _Skipped("visitor record")

    def skip(client: str, site: str, error: Exception) -> None:
        skipped(f"{client}/{site}/{args.visitor_id}", error)

    with _storage(args) as storage:
        for client, site, record in iter_visitors(storage, args.visitor_id, args.client, on_unreadable=skip):
            row = {
                "clientId": client,
                "siteId": site,
                "visitorId": args.visitor_id,
                "bot": {"isBot": record.is_bot, "category": record.category},
                "events": record.events,
                "botEvents": record.bot_events,
                "botCategories": record.categories,
                "eventTypes": record.types,
                "nativeEvents": record.native_events,
                "rageClicks": record.rage_clicks,
                "firstSeen": record.first_ms,
                "lastSeen": record.last_ms,
            }
            _print_json(row)
    return skipped.status


def cmd_keys_rotate_field_key(args: argparse.Namespace) -> int:
    from collector.fieldkeys import key_file_path, key_prints, refuse_a_lost_key_file, rotate
    from storage.field_key_ids import record_key_ids, recorded_key_ids

    settings = _settings_from(args)
    # The default key file lives in the data directory; one named in the settings does not,
    # but a data directory named (--data-dir, COLLECTOR_DATA_DIR, the config's data_dir)
    # that does not exist is a typo, refused as by every command (helper-139, helper-141:
    # the file was rotated and nothing recorded). Only the default ./data may be missing.
    if not settings.field_key_file or settings.data_dir != Settings().data_dir:
        _check_data_dir(Path(settings.data_dir), create=False)
    if not (Path(settings.data_dir) / "data.mdb").exists():
        print(rotate(key_file_path(settings)))
        return 0
    with _storage(args) as storage:
        refuse_a_lost_key_file(storage, key_file_path(settings))
        new_id = rotate(key_file_path(settings), recorded_key_ids(storage))
        # Recorded at once (after the file has it: a start refuses a file lacking a
        # recorded id): a worker restarted before the next start of serve seals with it.
        try:
            record_key_ids(storage, [new_id], key_prints(key_file_path(settings)))
        except StorageError as exc:
            # (the file is rotated: said so, since a rerun would rotate again; helper-100)
            raise StorageError(
                f"the key file now holds {new_id}, active, but recording it in the data directory failed"
                f" ({exc}); the next start of serve records it"
            ) from None
    print(new_id)
    return 0


def cmd_replay_dump(args: argparse.Namespace) -> int:
    from collector.replay_admin import session_lines

    skipped = _Skipped("replay chunk")

    def skip(where: tuple[str, str, str, int], error: Exception) -> None:
        skipped("/".join(map(str, where)), error)

    _text_argument("session id", args.session)
    _text_argument("--client value", args.client)
    with _storage(args) as storage:
        for line in session_lines(storage, args.session, args.client, on_unreadable=skip):
            _print_line(line)
    return skipped.status


_PERIOD = r"^\d{4}-(0[1-9]|1[0-2])$"


def _sequence(value: str) -> int:
    if not value.isdigit() or int(value) >= 2**64:
        raise argparse.ArgumentTypeError(f"expected an outbox sequence number (0 or more), got {value!r}")
    return int(value)


def _period(value: str) -> str:
    import re

    if not re.match(_PERIOD, value):
        raise argparse.ArgumentTypeError(f"period must be YYYY-MM, got {value!r}")
    return value


def cmd_usage_show(args: argparse.Namespace) -> int:
    from collector.usage_admin import usage_rows

    skipped, damaged = _Skipped("key record"), _Skipped("usage counter")
    with _storage(args) as storage:
        rows = usage_rows(storage, account=args.account, period=args.period, on_unreadable=skipped,
                          on_damaged_counter=damaged)
        for row in rows:
            _print_json(row)
    if args.account is not None and not rows and not damaged.status:
        # An empty answer would read as "uses nothing" for a misspelt name.
        period = args.period or "this period"
        print(f"collector: no account {args.account!r}: no key names it and it has no usage in {period}",
              file=sys.stderr)
        return 2
    return max(skipped.status, damaged.status)


def cmd_usage_invoice(args: argparse.Namespace) -> int:
    from collector.usage_admin import account_totals, invoice_lines

    skipped, damaged = _Skipped("key record"), _Skipped("usage counter")
    with _storage(args) as storage:
        lines = invoice_lines(storage, args.period, on_unreadable=skipped, on_damaged_counter=damaged)
        for line in lines:
            _print_json(line)
        for account_total in account_totals(lines, args.period):
            _print_json(account_total)
        total = sum(line.amount_usd for line in lines)
        _print_json({"period": args.period, "total_usd": total})
    return max(skipped.status, damaged.status)


def cmd_backup(args: argparse.Namespace) -> int:
    from storage.backup import backup

    extra: list[tuple[Path, str]] = []
    key_file: Path | None = None
    if args.with_field_keys:
        from collector.fieldkeys import DEFAULT_NAME, key_file_path, load, refuse_a_lost_key_file

        key_file = key_file_path(_settings_from(args))
        if not key_file.is_file():
            raise UsageError(f"--with-field-keys: there is no field key file at {key_file}")
        extra.append((key_file, DEFAULT_NAME))  # the name restore looks for
    _refuse_unusable_path("the backup's destination", Path(args.dest))
    data_dir = Path(os.path.realpath(_settings_from(args).data_dir))
    if Path(os.path.realpath(args.dest)).is_relative_to(data_dir):
        # (it would sit among the data it copies, and a restore into the directory
        # then refuses it and the directory both; helper-139)
        raise UsageError(f"the backup's destination {args.dest} is inside the data directory {data_dir}")
    with _storage(args) as storage:
        if key_file is not None:
            # a file serve would refuse is not kept as this data's key (helper-100; an
            # active key id it does not hold, helper-104)
            refuse_a_lost_key_file(storage, key_file)
            load(key_file)
        manifest = backup(storage, Path(args.dest), extra_files=extra)
    _print_json(manifest)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from collector.fieldkeys import DEFAULT_NAME, key_file_path
    from storage.backup import restore
    from storage.datadir import keep_directory_owner

    settings = _settings_from(args)
    _refuse_unusable_path("the backup", Path(args.src))
    _refuse_unusable_path("the data directory", Path(settings.data_dir))
    # Compared as real paths: /var/lib/collector is a symlink under DynamicUser,
    # and the default key file is spelled through it.
    data_dir = Path(os.path.realpath(settings.data_dir))
    spelled = key_file_path(settings)
    key_file = Path(os.path.realpath(spelled.parent)) / spelled.name
    # A key file inside the data directory (the default beside the LMDB files,
    # or a configured path under it) is carried across the swap, which would
    # otherwise delete it with the old directory; one elsewhere stays put.
    inside = key_file.relative_to(data_dir).as_posix() if key_file.is_relative_to(data_dir) else None
    carry = ((DEFAULT_NAME, inside),) if inside else ()
    # Root restoring the service's directory: it stays the service's (helper-92); a new
    # one, and the directories made for it, take the owner of the nearest one that was
    # there, as a first key file does (helpers 93, 97: they were root's).
    existing = next(path for path in (data_dir, *data_dir.parents) if path.exists())
    owner, made = existing.stat(), [path for path in data_dir.parents if not path.exists()]
    manifest, node_id = restore(Path(args.src), data_dir, force=args.force, carry_files=carry)
    keep_directory_owner(data_dir, owner, with_directory=True, also=(inside,) if inside else ())
    for directory in made:
        keep_directory_owner(directory, owner, with_directory=True)
    # The manifest's nodeId is the backed-up node's; the restored directory has its own.
    _print_json({**msgspec.to_builtins(manifest), "restoredNodeId": node_id})
    if inside and not key_file.is_file():
        # Neither the backup nor the replaced directory had one: serve would make
        # a new key, and values it seals could not be opened with the old one.
        print(
            f"collector: warning: the restored directory has no field-key file ({inside}); copy the"
            " one this data was sealed with into it before `serve`, or sealed values stay closed",
            file=sys.stderr,
        )
    if not inside and (Path(args.src) / DEFAULT_NAME).is_file():
        # (the configured key file is outside the data directory: restore leaves it be; helper-100)
        print(
            f"collector: warning: the backup holds a field-key file ({Path(args.src) / DEFAULT_NAME}), but"
            f" field_key_file is {key_file}, outside the data directory, and was left as it is: if this data"
            " was sealed with the backup's key, copy it there before `serve`",
            file=sys.stderr,
        )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from storage.check import check

    with _storage(args) as storage:
        report = check(storage)
    _print_json(report)
    return 0 if report.ok else 1


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's error shape: one line on stderr, exit 2 (not the usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"collector: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="collector", description="Self-hosted event collector")
    parser.add_argument("--version", action="version", version=f"collector {version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="serve HTTP and WebSocket")
    _data_dir_option(serve)
    serve.add_argument("--bind", default=None, help="HOST:PORT (default 127.0.0.1:8080)")
    serve.add_argument("--env", choices=["production", "development"], default=None)
    serve.add_argument("--tenants", default=None, help="a tenants file imported before serving")
    serve.add_argument("--trusted-origin", dest="trusted_origin", action="append", default=[])
    serve.add_argument("--demo", action="store_true", help="import the built-in demo tenant")
    serve.add_argument("--no-access-log", action="store_true", help="no per-request log line")
    serve.add_argument("--workers", type=int, default=None, help="worker processes on one socket (default 1)")
    serve.set_defaults(func=cmd_serve)

    tenants = commands.add_parser("tenants", help="tenant keys").add_subparsers(dest="sub", required=True)
    t_import = tenants.add_parser("import", help="upsert every key in FILE")
    t_import.add_argument("file", help="a tenants file (JSON), or - for standard input")
    _data_dir_option(t_import)
    t_import.set_defaults(func=cmd_tenants_import)
    t_list = tenants.add_parser("list", help="one JSON object per key")
    _data_dir_option(t_list)
    t_list.set_defaults(func=cmd_tenants_list)

    keys = commands.add_parser("keys", help="key lifecycle").add_subparsers(dest="sub", required=True)
    k_rotate = keys.add_parser("rotate", help="mobile or server key: mint, register, revoke old")
    k_rotate.add_argument("key")
    _data_dir_option(k_rotate)
    k_rotate.set_defaults(func=cmd_keys_rotate)
    k_revoke = keys.add_parser("revoke", help="revoke KEY")
    k_revoke.add_argument("key")
    _data_dir_option(k_revoke)
    k_revoke.set_defaults(func=cmd_keys_revoke)

    tokens = commands.add_parser("stream-token", help="stream tokens for the tenant-wide WebSockets").add_subparsers(
        dest="sub", required=True
    )
    s_mint = tokens.add_parser("mint", help="mint a csst_ token for KEY's tenant (stands in for a dashboard session)")
    s_mint.add_argument("--key", required=True, help="the API key the token names, by fingerprint, for its tenant")
    s_mint.add_argument("--ttl", type=int, default=300, help="seconds the token is valid (1 to 86400; default 300)")
    _data_dir_option(s_mint)
    s_mint.set_defaults(func=cmd_stream_token_mint)

    k_field = keys.add_parser("rotate-field-key", help="add a field-encryption key and make it active")
    _data_dir_option(k_field)
    k_field.set_defaults(func=cmd_keys_rotate_field_key)

    r_reveal = commands.add_parser("reveal", help="audited: print a stored event's sealed values")
    r_reveal.add_argument("receipt_id")
    r_reveal.add_argument("--reason", required=True, help="why (written to the audit log)")
    _data_dir_option(r_reveal)
    r_reveal.set_defaults(func=cmd_reveal)
    visitors = commands.add_parser("visitors", help="the visitor projection").add_subparsers(
        dest="sub", required=True
    )
    v_show = visitors.add_parser("show", help="a visitor's folded record and bot verdict, per site")
    v_show.add_argument("visitor_id")
    v_show.add_argument("--client", default=None, help="only this clientId")
    _data_dir_option(v_show)
    v_show.set_defaults(func=cmd_visitors_show)
    audit = commands.add_parser("audit", help="the reveal audit log").add_subparsers(dest="sub", required=True)
    a_list = audit.add_parser("list", help="every entry; exit 1 when the hash chain is broken")
    _data_dir_option(a_list)
    a_list.set_defaults(func=cmd_audit_list)

    outbox = commands.add_parser("outbox", help="the committed events").add_subparsers(dest="sub", required=True)
    o_dump = outbox.add_parser("dump", help="every committed event, one JSON object per line")
    o_dump.add_argument("--after", type=_sequence, default=0, help="only sequence numbers above this")
    _data_dir_option(o_dump)
    o_dump.set_defaults(func=cmd_outbox_dump)

    replay = commands.add_parser("replay", help="session-replay chunks").add_subparsers(dest="sub", required=True)
    r_dump = replay.add_parser("dump", help="a session's chunks in seq order, one JSON object per line")
    r_dump.add_argument("--session", required=True, help="the sessionId")
    r_dump.add_argument("--client", default=None, help="only this clientId (default: every client)")
    _data_dir_option(r_dump)
    r_dump.set_defaults(func=cmd_replay_dump)

    usage = commands.add_parser("usage", help="monthly usage").add_subparsers(dest="sub", required=True)
    u_show = usage.add_parser("show", help="JSON per account and unit kind")
    u_show.add_argument("--account", default=None)
    u_show.add_argument("--period", type=_period, default=None, help="YYYY-MM (default: this month, UTC)")
    _data_dir_option(u_show)
    u_show.set_defaults(func=cmd_usage_show)
    u_invoice = usage.add_parser("invoice", help="price overage in whole blocks (spec 8.4)")
    u_invoice.add_argument("--period", type=_period, required=True)
    _data_dir_option(u_invoice)
    u_invoice.set_defaults(func=cmd_usage_invoice)

    b_backup = commands.add_parser("backup", help="a consistent, compacted online copy to DEST")
    b_backup.add_argument("dest")
    b_backup.add_argument(
        "--with-field-keys",
        action="store_true",
        help="also copy the field-encryption key file (otherwise back it up separately)",
    )
    # (the serving config names the key file when it is not the default: helper-85)
    _data_dir_option(b_backup)
    b_backup.set_defaults(func=cmd_backup)
    b_restore = commands.add_parser("restore", help="verify SRC's checksum and restore it (server stopped)")
    b_restore.add_argument("src")
    b_restore.add_argument("--force", action="store_true", help="replace a non-empty data directory")
    _data_dir_option(b_restore)
    b_restore.set_defaults(func=cmd_restore)
    c_check = commands.add_parser("check", help="verify the data directory; exit 1 on problems")
    _data_dir_option(c_check)
    c_check.set_defaults(func=cmd_check)
    return parser




class _Skipped:
    """Records a read command skips because they do not decode: one line each on
    stderr, and the command exits 1. It carries on: one damaged record must not
    hide the rest."""

    def __init__(self, what: str) -> None:
        self.what = what  # "outbox seq", "key record", ...
        self.count = 0

    def __call__(self, where: object, error: Exception) -> None:
        self.count += 1
        sys.stdout.flush()  # keeps the two streams in order on one terminal
        print(one_line(f"collector: {self.what} {where} does not decode, skipped: {error}"), file=sys.stderr)

    @property
    def status(self) -> int:
        return 1 if self.count else 0


def one_line(message: str) -> str:
    """A message as one line (operator contract): line breaks a file put in a name are shown escaped."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a `timeout`, a systemd stop) during an operator command: cleaned up like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_operator_command(signum: int, _frame: object) -> None:
    raise _Terminated(signum)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt as stop:
        # A stop signal while the command was still starting (parsing, imports): nothing
        # was done, and it is told as later ones are, not as a traceback (helper-139).
        signum = stop.signum if isinstance(stop, _Terminated) else signal.SIGINT
        print(f"collector: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum


def _main(argv: Sequence[str] | None) -> int:
    from collector.runtime import hold_standard_descriptors

    hold_standard_descriptors()  # before anything opens a file
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    func: Callable[[argparse.Namespace], int] = args.func
    from collector.fieldkeys import KeyFileError
    from collector.reveal import RevealError
    from collector.runtime import report_fatal_signals
    from collector.tenants_admin import KeyAdminError
    from storage.backup import BackupError
    from storage.errors import FormatError

    report_fatal_signals()
    # (after the imports: a handler that raises while a C extension builds its objects
    # crashed the process, and one raised during an import was lost, helper-142; until
    # here SIGTERM ends the process as by default)
    if args.command != "serve":  # (serve drains on its stop signals itself)
        signal.signal(signal.SIGTERM, _stop_operator_command)
    if args.command != "serve":
        if sys.stdout is None:  # (fd 1 closed: print() would drop what it prints, silently)
            print("collector: stdout is closed: nothing was done (the command prints its result there)",
                  file=sys.stderr)
            return 2
        sys.stdout = _CheckedOutput(sys.stdout)  # type: ignore[assignment]
    try:
        status = func(args)
        if isinstance(sys.stdout, _CheckedOutput):
            sys.stdout.flush()  # (here, not at exit: a failure is then told as such)
        return status
    except OutputLost as lost:
        # Not bad input (2): what the command changed is done, and rerunning it may
        # not give the same answer (`keys rotate` once wrote nothing to a full disk).
        print(f"collector: writing the output failed ({lost}): whatever the command changed is done;"
              " only its output is lost", file=sys.stderr)
        return 1
    except (
        UsageError, SettingsError, TenantsFileError, KeyAdminError, FormatError, BackupError, KeyFileError,
        RevealError,
    ) as exc:
        print(f"collector: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(f"collector: storage error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        if args.command == "serve":
            return 0  # a stop signal is how serve is stopped
        # An operator command cut short did not do its work (its cleanup has run):
        # a script's `&&` must not go on.
        signum = stop.signum if isinstance(stop, _Terminated) else signal.SIGINT
        print(f"collector: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the command was given cannot be used: one line, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        print(f"collector: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    finally:
        if isinstance(sys.stdout, _CheckedOutput):
            sys.stdout = sys.stdout.stream


class OutputLost(Exception):
    """Writing a command's output to stdout failed (a full disk, an I/O error)."""


class _CheckedOutput:
    """stdout, telling a failed write of the output from the command's own errors."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except BrokenPipeError:
            raise  # (the reader went away, `| head -1`: that is no failure)
        except OSError as exc:
            raise OutputLost(exc.strerror or str(exc)) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputLost(exc.strerror or str(exc)) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


if __name__ == "__main__":
    sys.exit(main())
