"""Admission of one request's events: idempotency, usage counters, outbox, all or nothing.

Runs inside the writer's group transaction. It reads first (idempotency
records, counters), decides, and only then writes, so a refusal (conflict or
billing stop) leaves the transaction exactly as it found it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from storage import consent, counters, idempotency, outbox
from storage.errors import UNREADABLE_RECORD
from storage.outbox import Appended
from storage.writer import JobRefused, WriteContext

log = logging.getLogger("collector.admission")


class Candidate(msgspec.Struct, frozen=True):
    eid: str
    content_hash: bytes
    stored: bytes
    unit: str | None  # the counter kind it draws on, None for none
    # Facts of the stored event, kept beside it in the outbox record so that
    # consumers need not parse it. visitor_id None: unknown, consumers parse.
    visitor_id: str | None = None
    event_type: str = ""
    is_bot: bool = False
    bot_category: str = ""
    event_ms: int = 0  # the client's timestamp of the event
    # A consent transition also records the visitor's latest state (newest wins).
    consent_key: bytes | None = None
    consent_state: consent.RecordedConsent | None = None
    # What versions before the keyed hash stored for the same content (unkeyed): a
    # record of theirs with one is this content too (a retry across the upgrade). Asked
    # for only when such a record is found (they cost an encoding); the argument: with
    # the float forms of the versions before numbers were hashed as written.
    older_hashes: Callable[[bool], tuple[bytes, ...]] | None = None
    # A pageview's or scroll's page fact: stored as the outbox record's last
    # fact, only on those records (see storage.outbox.OutboxRecord.page).
    page: tuple[str, str, float, float] | None = None
    # An identify's visitor's consent record: admission drops the identify when
    # that record, weighed against `identity_stated`, denies identity
    # resolution. Read inside the write transaction, it holds every denial
    # committed before, one earlier in the same group commit included.
    identity_consent_key: bytes | None = None
    # The request's own latest identity choice for the visitor before this
    # event, (when stated, allowed): it outranks the record when stated at the
    # same time or later, the record's own rule (storage.consent.later_choice).
    identity_stated: tuple[int, bool] | None = None


def _stored_for_another_site(ctx: WriteContext, receipts: list[str], site_id: str) -> int | None:
    """The position of the first receipt whose event was stored for another site of the tenant.

    An event id is the tenant's, and a duplicate answers with the first event's
    receipt: the same id sent to another of its properties (another Origin) would
    be reported stored and stored nowhere for that property (helper-101), as the
    consent route's was (helper-88). Told by the outbox record the receipt names
    (one read for all of them); a receipt whose record retention removed cannot
    be told and stays a duplicate.
    """
    wanted = {outbox.seq_key(seq): n for n, receipt in enumerate(receipts)
              if (seq := outbox.receipt_seq(receipt)) is not None}  # fmt: skip
    if not wanted:
        return None
    found = sorted(
        wanted[bytes(key)] for key, raw in ctx.txn.cursor(db=ctx.dbs.outbox).getmulti(list(wanted))
        if _site_of(raw, receipts[wanted[bytes(key)]]) not in (None, site_id)
    )
    return found[0] if found else None


def _site_of(raw: bytes | memoryview, receipt: str) -> str | None:
    """The site of the outbox record at the receipt's seq, when it is that receipt's record.

    (A restored node keeps the old node's records under their receipts: those count
    too, helper-103; a seq since reused by another node's receipt does not.)
    """
    try:
        facts = outbox.decode_facts(raw)
    except UNREADABLE_RECORD:
        return None  # (damaged: `collector check` reports it; not a reason to refuse)
    return facts.site_id if facts.receipt_id == receipt else None


class Conflict(msgspec.Struct, frozen=True):
    """An event id was reused with different content (409 idempotency_conflict)."""

    eid: str
    index: int
    other_site: bool = False  # the same content, stored for another site of the tenant


class MeteringUnavailable(msgspec.Struct, frozen=True):
    """A usage counter could not be read (503 usage_metering_unavailable)."""

    key: str  # the counter, as counters.counter_name names it


class AdmissionResult(msgspec.Struct, frozen=True):
    receipt_ids: list[str]  # per candidate, the original receipt for duplicates
    duplicate: list[bool]
    usage: Any  # whatever the budget callable returned
    denied: list[int] = []  # candidates dropped: their visitor's consent denies identity resolution


# budget(used_by_unit, added_by_unit) -> usage snapshot; raises JobRefused to refuse.
Budget = Callable[[dict[str, int], dict[str, int]], Any]


def _identity_denied(stored: bytes | memoryview | None, stated: tuple[int, bool] | None, now_ms: int) -> bool:
    """Whether the visitor's record, against the request's own earlier choice, denies identity resolution."""
    if stored is None:
        return stated is not None and stated[1] is False
    record = consent.decode(stored, now_ms=now_ms)
    allowed = record.identity_resolution
    if stated is not None:  # weighed as the record itself will merge it
        allowed, _ = consent.later_choice(allowed, record.identity_time(), stated[1], stated[0])
    return allowed is False


def _readable_ledger(raw: bytes | memoryview, key: bytes) -> idempotency.IdempotencyRecord | None:
    """The stored idempotency record; None (the id is taken as new) when it does not decode.

    Storage damage must not refuse the event, and every event beside it, on every
    retry: the event is admitted again and its record rewritten. At worst it is
    stored twice, which consumers already tolerate from the window's end.
    `collector check` reports such records.
    """
    try:
        return idempotency.decode(raw)
    except UNREADABLE_RECORD as exc:
        log.error("idempotency record %r does not decode (%s): the event is taken as new", bytes(key)[:80], exc)
        return None


def _same_content(record: idempotency.IdempotencyRecord, cand: Candidate) -> bool:
    """The stored record is of this candidate's content, hashed by this version or an earlier one."""
    if record.hash_form == idempotency.HASHED_KEYED:
        return record.content_hash == cand.content_hash
    # A record of an earlier version holds an unkeyed hash. Only one of a version before
    # numbers were hashed as written may hold the float forms: one with `50.0` hashed as
    # written is other content than a retry with `50` (helpers 87 and 88).
    with_float_forms = record.hash_form != idempotency.HASHED_AS_WRITTEN
    return cand.older_hashes is not None and record.content_hash in cand.older_hashes(with_float_forms)


class Admission:
    """A WriteJob admitting one request's accepted candidates."""

    __slots__ = (
        "client_id",
        "site_id",
        "key_type",
        "account",
        "period",
        "candidates",
        "budget",
        "units",
        "included",
    )

    def __init__(
        self,
        *,
        client_id: str,
        site_id: str,
        key_type: str,
        account: str,
        period: str,
        candidates: Sequence[Candidate],
        budget: Budget,
        units: Sequence[str],
        included: dict[str, int] | None = None,
    ) -> None:
        self.client_id = client_id
        self.site_id = site_id
        self.key_type = key_type
        self.account = account
        self.period = period
        self.candidates = candidates
        self.budget = budget
        self.units = units  # every unit kind the budget looks at
        # Under paid overage, each unit's included amount: units admitted beyond
        # it also go to the unit's overage counter, which invoices bill (the
        # terms may change later; what was served as overage stays served).
        self.included = included

    def run(self, ctx: WriteContext) -> AdmissionResult:
        # Runs on the writer thread under the GIL the event loop needs: per
        # event, as few Python objects and calls as the rules allow.
        txn, dbs, now_ms = ctx.txn, ctx.dbs, ctx.now_ms
        candidates = self.candidates
        count = len(candidates)
        receipts: list[str | None] = [None] * count
        duplicate = [False] * count
        first_in_batch: dict[bytes, int] = {}
        new: list[int] = []
        denied: dict[int, None] = {}  # (ordered) candidates dropped for denied identity consent
        keys = idempotency.ledger_keys(self.client_id, [cand.eid for cand in candidates])
        # One C call for every lookup: py-lmdb releases the GIL per call, and
        # each reacquisition waits on the busy event loop.
        known = dict(txn.cursor(db=dbs.idempotency).getmulti(keys))

        def identity_denied(cand: Candidate) -> bool:
            assert cand.identity_consent_key is not None
            return _identity_denied(txn.get(cand.identity_consent_key, db=dbs.consent), cand.identity_stated, now_ms)

        replayed: list[int] = []  # duplicates of records of earlier requests
        for index, cand in enumerate(candidates):
            key = keys[index]
            earlier = first_in_batch.get(key)
            if earlier is not None:
                if candidates[earlier].content_hash != cand.content_hash:
                    if cand.identity_consent_key is not None and identity_denied(cand):
                        denied[index] = None  # dropped, as a changed identify under a denial always is
                        continue
                    raise JobRefused(Conflict(cand.eid, index))
                duplicate[index] = True
                continue
            # A record still present is live, however old its stamp: only the retention
            # sweep (worker 0's clock) forgets an id. Each worker's writer clock has its
            # own guard against clock steps, and a worker that judged expiry itself could
            # store again a retry that another worker had just called a duplicate.
            raw = known.get(key) if known else None
            record = _readable_ledger(raw, key) if raw is not None else None
            if record is not None and _same_content(record, cand):
                # An exact replay is a duplicate (spec 4.1 rule 4), even of an
                # identify stored before its visitor denied identity resolution.
                first_in_batch[key] = index
                receipts[index] = record.receipt_id
                duplicate[index] = True
                replayed.append(index)
                continue
            if cand.identity_consent_key is not None and identity_denied(cand):
                # Dropped, new or changed; its id stays free, as for any dropped
                # event (an in-batch repeat is judged again, after the choices
                # between them).
                denied[index] = None
                continue
            if record is not None:
                raise JobRefused(Conflict(cand.eid, index))
            first_in_batch[key] = index
            new.append(index)

        if replayed:
            other = _stored_for_another_site(ctx, [receipts[index] or "" for index in replayed], self.site_id)
            if other is not None:
                index = replayed[other]
                raise JobRefused(Conflict(candidates[index].eid, index, other_site=True))
        added = dict.fromkeys(self.units, 0)
        for index in new:
            unit = candidates[index].unit
            if unit is not None:
                added[unit] += 1
        counter_keys = {
            unit: counters.counter_key(self.account, self.period, unit) for unit in self.units
        }
        stored_counts = dict(txn.cursor(db=dbs.counters).getmulti(list(counter_keys.values())))
        used: dict[str, int] = {}
        for unit, ck in counter_keys.items():
            raw_count = stored_counts.get(ck)
            if not counters.is_counter(raw_count):
                # A counter we cannot read must not be guessed at: refuse, nothing accepted.
                raise JobRefused(MeteringUnavailable(counters.counter_name(bytes(ck))))
            used[unit] = counters.decode_value(raw_count)
        usage = self.budget(used, added)  # raises JobRefused on a billing stop
        self._refuse_unreadable_overage(txn, dbs, used, added)

        # Decided: from here on, only writes.
        if new:
            seq = ctx.allocate_seqs(len(new))
            receipt_format = outbox.receipt_format(ctx.storage.node_id)
            client_id, site_id, key_type = self.client_id, self.site_id, self.key_type
            encode_record, encode_ledger = outbox.encode_fields, idempotency.encode_fields
            hash_form = idempotency.HASHED_KEYED
            outbox_rows = []
            ledger_rows = []
            consents = []
            for index in new:
                cand = candidates[index]
                receipt = receipt_format % seq
                receipts[index] = receipt
                # Tuples in the field order of OutboxRecord / IdempotencyRecord.
                fields: tuple[Any, ...] = (
                    receipt,
                    client_id,
                    site_id,
                    cand.eid,
                    now_ms,
                    key_type,
                    cand.stored,
                    cand.visitor_id,
                    cand.event_type,
                    cand.is_bot,
                    cand.bot_category,
                    cand.event_ms,
                )
                if cand.page is not None:  # other records end before it (its default)
                    fields += (cand.page,)
                outbox_rows.append((seq.to_bytes(8, "big"), encode_record(fields)))
                ledger_rows.append(
                    (keys[index], encode_ledger((cand.content_hash, receipt, now_ms, hash_form)))
                )
                if cand.consent_key is not None:
                    consents.append(cand)
                seq += 1
            # Few C-level calls instead of one put per row: py-lmdb releases the
            # GIL on each call, which is slow while the event loop is busy.
            txn.cursor(db=dbs.outbox).putmulti(outbox_rows, append=True)
            if ctx.appended is not None:
                ctx.appended.append(
                    Appended(seq - len(new), client_id, site_id, key_type, now_ms, [candidates[i] for i in new])
                )
            txn.cursor(db=dbs.idempotency).putmulti(ledger_rows)
            for cand in consents:
                if cand.consent_key is not None and cand.consent_state is not None:
                    state = consent.merged(
                        cand.consent_state, txn.get(cand.consent_key, db=dbs.consent), now_ms=now_ms
                    )
                    if state is not None:
                        txn.put(cand.consent_key, consent.encode(state), db=dbs.consent)
            txn.cursor(db=dbs.counters).putmulti(
                [
                    (counter_keys[unit], counters.encode_value(used[unit] + amount))
                    for unit, amount in added.items()
                    if amount
                ]
            )
            if self.included is not None:
                for unit, included in self.included.items():
                    if added.get(unit):
                        counters.add_overage(
                            txn, dbs, counters.overage_key(self.account, self.period, unit),
                            included=included, used=used[unit], added=added[unit], period=self.period,
                        )
        # In-batch duplicates take the receipt of the first occurrence.
        for index in range(count):
            if receipts[index] is None and index not in denied:
                receipts[index] = receipts[first_in_batch[keys[index]]]
        return AdmissionResult([r or "" for r in receipts], duplicate, usage, list(denied))

    def _refuse_unreadable_overage(self, txn: Any, dbs: Any, used: dict[str, int], added: dict[str, int]) -> None:
        """Refuse, as for an unreadable usage counter, a batch whose overage has no readable counter.

        add_overage leaves such a value as it is, so the overage served would
        never be billed (and `usage invoice` leaves the account out until it is
        repaired). A batch that serves none is admitted.
        """
        for unit, included in (self.included or {}).items():
            if not counters.served_overage(included, used[unit], added.get(unit, 0)):
                continue
            key = counters.overage_key(self.account, self.period, unit)
            if not counters.is_counter(txn.get(key, db=dbs.counters)):
                raise JobRefused(MeteringUnavailable(counters.counter_name(key)))
