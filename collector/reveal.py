"""The audited reveal: the one way a sealed value is ever shown in plaintext.

`collector reveal RECEIPT_ID --reason TEXT` finds the stored event by its
receipt id, appends who / when / why / which fields to the hash-chained audit
log in its own durable transaction, and only then opens the sealed values and
returns the event with them in plaintext. A reveal that cannot be audited
reveals nothing.
"""

from __future__ import annotations

import os
import pwd
import time
import unicodedata
from typing import Any

import msgspec

from collector.ingest.sealing import FieldSealer, SealError, field_aad, is_sealed
from storage.audit import AuditEntry, append_entry
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD
from storage.outbox import read_record, receipt_seq

MIN_REASON = 8


class RevealError(Exception):
    """The reveal was refused; nothing was shown (the message says why)."""


def operator_identity() -> str:
    """Who runs the command, from what the process cannot simply be told.

    The user is the real uid's account (getpass.getuser() would read LOGNAME
    and USER first, which anyone can set); the login name comes from the
    terminal's utmp record when there is one. SUDO_USER is only an environment
    variable, so it is recorded as a claim, and only under uid 0 (where sudo sets it).
    """
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = "unknown"
    who = f"{user} (uid {uid})"
    try:
        login = os.getlogin()
    except OSError:
        login = None
    if login and login != user:
        who += f", logged in as {login}"
    sudo_user = os.environ.get("SUDO_USER")
    if uid == 0 and sudo_user:
        who += f", SUDO_USER={sudo_user!r} (from the environment)"
    return who


def _visible_length(text: str) -> int:
    # Zero-width and other format, control and separator characters say nothing.
    return sum(1 for char in text if unicodedata.category(char)[0] not in "CZ")


def sealed_paths(event: dict[str, Any]) -> list[str]:
    paths = [f"values.{name}" for name, value in (event.get("values") or {}).items() if is_sealed(value)]
    paths.extend(name for name in ("rawEmail", "rawPhone") if is_sealed(event.get(name)))
    return paths


def reveal(
    storage: Storage, sealer: FieldSealer, receipt_id: str, *, reason: str, who: str
) -> tuple[dict[str, Any], AuditEntry]:
    """The event with its sealed values opened, and the audit entry written first."""
    if _visible_length(reason) < MIN_REASON:
        raise RevealError(f"--reason must say why, in at least {MIN_REASON} visible characters")
    seq = receipt_seq(receipt_id)
    try:
        record = read_record(storage, seq) if seq is not None else None
    except UNREADABLE_RECORD as exc:
        raise RevealError(f"the stored event of {receipt_id} does not decode ({exc}); see `collector check`") from None
    if record is None or record.receipt_id != receipt_id:
        raise RevealError(f"no stored event has receipt id {receipt_id!r}")
    try:
        event: dict[str, Any] = msgspec.json.decode(record.event)
    except UNREADABLE_RECORD as exc:
        raise RevealError(f"the stored event of {receipt_id} does not decode ({exc}); see `collector check`") from None
    paths = sealed_paths(event)
    if not paths:
        raise RevealError(f"event {receipt_id} holds no sealed values")
    entry = append_entry(
        storage,
        at_ms=int(time.time() * 1000),
        who=who,
        action="reveal",
        receipt_id=receipt_id,
        fields=paths,
        reason=reason.strip(),
    )
    for path in paths:
        if path.startswith("values."):
            holder, name = event["values"], path[len("values.") :]
        else:
            holder, name = event, path
        try:
            holder[name] = sealer.open(holder[name], field_aad(record.client_id, record.eid, path))
        except SealError as exc:
            holder[name] = None
            event.setdefault("revealErrors", {})[path] = str(exc)
    return event, entry
