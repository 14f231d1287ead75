"""Helpers for end-to-end tests: run the real CLI, read the outbox."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.settings
import trio


def run_cli(
    *args: str, data_dir: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`env`: variables set on top of this process's environment."""
    argv = [sys.executable, "-m", "collector", *args]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env} if env else None
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{argv} exited {result.returncode}: {result.stderr}")
    return result


async def outbox_dump(data_dir: Path) -> list[dict[str, object]]:
    result = await trio.to_thread.run_sync(lambda: run_cli("outbox", "dump", data_dir=data_dir))
    return [json.loads(line) for line in result.stdout.splitlines() if line]


# Run in another process: py-lmdb refuses a second open of an environment in
# one process, and a test's server holds its data directory open.
_REWRITE = """
import sys
import lmdb

path, name, key, spoil, value = sys.argv[1], sys.argv[2], *(bytes.fromhex(a) for a in sys.argv[3:])
env = lmdb.open(path, max_dbs=32, map_size=0)
db = env.open_db(name.encode(), create=False)
with env.begin(write=True) as txn:
    if spoil:
        value = txn.get(key, db=db)
        at = value.index(spoil)
        value = value[:at] + b"\\xff" + value[at + 1 :]
    txn.put(key, value, db=db)
env.close()
"""


def rewrite_stored(data_dir: Path, db: str, key: bytes, *, spoil: bytes = b"", value: bytes = b"") -> None:
    """Damage one stored record from another process, as an auditor would.

    `spoil`: replace the first byte of this text in the stored value with 0xFF
    (a string that is no longer UTF-8); otherwise store `value` in its place.
    """
    subprocess.run(
        [sys.executable, "-c", _REWRITE, str(data_dir), db, key.hex(), spoil.hex(), value.hex()],
        check=True, capture_output=True, timeout=60,
    )


_READ = """
import sys
import lmdb

path, name, key = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
env = lmdb.open(path, max_dbs=32, map_size=0, readonly=True, lock=True)
db = env.open_db(name.encode(), create=False)
with env.begin() as txn:
    value = txn.get(key, db=db)
sys.stdout.write(value.hex() if value is not None else "")
env.close()
"""


def read_stored(data_dir: Path, db: str, key: bytes) -> bytes | None:
    """One stored value, read from another process (see rewrite_stored); None when absent."""
    result = subprocess.run(
        [sys.executable, "-c", _READ, str(data_dir), db, key.hex()],
        check=True, capture_output=True, timeout=60, text=True,
    )
    return bytes.fromhex(result.stdout) if result.stdout else None


@contextlib.contextmanager
def h2_client(
    base_url: str, *, timeout: float = 5, settings: dict[int, int] | None = None
) -> Iterator[tuple[socket.socket, h2.connection.H2Connection]]:
    """A socket to the server and an HTTP/2 client connection (prior knowledge) on it.

    The preface is queued, not sent: the caller's first `sendall` carries it with
    whatever it adds, in one write. `settings`: the client's own (a window of zero).
    """
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
        if settings:
            conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        conn.initiate_connection()
        yield sock, conn
