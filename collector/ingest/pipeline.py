"""The pure ingest pipeline: `prepare_batch(body, ctx) -> PreparedBatch`.

bytes -> typed decode and key probe (common case) or generic JSON decode,
batch shape and per-event typed decode (exact path) -> payment scan of the
whole request -> per event: platform rewrite, field rules and truncation ->
idempotency id -> consent and privacy floor -> content hash -> enrichment.
No I/O, no clock: time comes from the context.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from collector.errors import ServiceError
from collector.ingest.consent import SKEW_MS, consent_drop_reason, identity_declined, state_of
from collector.ingest.content_hash import event_hashes, unkeyed_hashes
from collector.ingest.keyprobe import keys_known, opaque_values
from collector.ingest.model import (
    AcceptedEvent,
    DroppedEvent,
    EventIssue,
    IngestContext,
    MeterKind,
    PreparedBatch,
    RejectedEvent,
)
from collector.ingest.payment import (
    UnscannableBody,
    find_payment_data,
    has_card_candidate,
    has_card_key,
    may_hide_card_key,
    object_keys,
    scan_payment_data,
)
from collector.ingest.privacy import apply_form_floor
from collector.ingest.schema import (
    AnyEvent,
    Batch,
    BotInfo,
    Click,
    ConsentTransition,
    Enrichment,
    Form,
    Identify,
    Pageview,
    Scroll,
)
from collector.ingest.scrub import scrub_text
from collector.ingest.sealing import content_digest, seal_sensitive
from collector.ingest.shape import refuse_ambiguous_shape
from collector.ingest.surrogates import without_lone_surrogates
from collector.ingest.validate import (
    check_event,
    denial_in_undecodable,
    misspelt_identity_denial,
    rewrite_platform,
)

MAX_BATCH = 25
MAX_STORED_EVENT = 120_000
MAX_IDEMPOTENCY_KEY = 512
MAX_CLIENT_TS = 2**53  # JavaScript's safe integers

_event_decoder = msgspec.json.Decoder(AnyEvent)  # type: ignore[arg-type]
_batch_decoder = msgspec.json.Decoder(Batch)
_generic_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_EMPTY_EID = len(b'{"eid":""')


def _issue_from(error: msgspec.ValidationError) -> EventIssue:
    message, _, where = str(error).partition(" - at `")
    if message == "Number out of range":  # (msgspec cannot say where: its path reads "$[...]")
        return EventIssue("$", f"a number in the event is out of range: {_OUT_OF_RANGE}")
    path = where.rstrip("`")
    if path.startswith("key` in `"):  # a map's key: "... - at `key` in `$.values`"
        return EventIssue(path.removeprefix("key` in `"), f"a key: {message}")
    return EventIssue(path or "$", message)


_OUT_OF_RANGE = "numbers must fit a 64-bit float (at most about 1.8e308 in magnitude)"
# Reads a float literal past a 64-bit float's range (valid JSON: RFC 8259 sets no
# limit) as an infinity, where the plain decoder refuses the whole body.
_lenient_decoder = msgspec.json.Decoder(float_hook=float)


def decode_json(body: bytes, *, out_of_range_numbers: bool = False) -> object:
    """The body as plain JSON values; invalid_json for bad JSON, bad UTF-8 or absurd nesting.

    `out_of_range_numbers`: a float literal past a 64-bit float's range is read as an
    infinity (for the caller to refuse the one event holding it), not invalid_json.
    """
    try:
        try:
            return _generic_decoder.decode(body)
        except msgspec.ValidationError:  # (untyped, it is only ever a number out of range)
            if not out_of_range_numbers:
                raise ServiceError("invalid_json", f"a number is out of range: {_OUT_OF_RANGE}") from None
            return _lenient_decoder.decode(body)
    except msgspec.DecodeError as exc:
        if (repaired := without_lone_surrogates(body)) is not body:
            return decode_json(repaired, out_of_range_numbers=out_of_range_numbers)
        if body.startswith(b"\xef\xbb\xbf"):  # RFC 8259 8.1: senders must not add one
            raise ServiceError("invalid_json", "body starts with a byte order mark (EF BB BF): send the JSON without it") from None
        raise ServiceError("invalid_json", f"body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ServiceError("invalid_json", "body is not valid UTF-8") from None
    except RecursionError:
        raise ServiceError("invalid_json", "body is nested too deeply") from None


class _TypedBatch(msgspec.Struct, frozen=True):
    events: list[AnyEvent]


_typed_batch_decoder = msgspec.json.Decoder(_TypedBatch)


def _decode_events(
    body: bytes, decoded: object, typed: tuple[list[AnyEvent | EventIssue], bool] | None = None
) -> tuple[list[AnyEvent | EventIssue], bool]:
    """Each event decoded, or the issue that rejects it; and whether the body was one event.

    A batch whose events all decode (the common case) takes one decoder call;
    otherwise each event is decoded on its own, so one bad event rejects only
    itself, with the same message either way. `typed`: what _decode_typed
    found, reused when the shape agrees.
    """
    if isinstance(decoded, dict) and "events" in decoded and "type" not in decoded:
        events = decoded["events"]
        if isinstance(events, list) and 1 <= len(events) <= MAX_BATCH:
            if typed is not None and not typed[1]:
                return typed
            try:
                return list(_typed_batch_decoder.decode(body).events), False
            except msgspec.ValidationError:
                pass
    raws, single = _split(body, decoded)
    if single and typed is not None and typed[1]:
        return typed
    out: list[AnyEvent | EventIssue] = []
    for raw in raws:
        try:
            out.append(_event_decoder.decode(raw))
        except msgspec.ValidationError as exc:
            out.append(_issue_from(exc))
    return out, single


def _split(body: bytes, decoded: object) -> tuple[list[bytes], bool]:
    """The raw JSON of each event, and whether the body was a single event."""
    if not isinstance(decoded, dict):
        raise ServiceError("validation_error", "the body must be a JSON object")
    if "events" not in decoded or "type" in decoded:
        return [body], True
    events = decoded["events"]
    if not isinstance(events, list):
        raise ServiceError("validation_error", "events must be an array of 1 to 25 events")
    if not 1 <= len(events) <= MAX_BATCH:
        raise ServiceError(
            "validation_error", f"a batch holds 1 to {MAX_BATCH} events, got {len(events)}"
        )
    return [bytes(raw) for raw in _batch_decoder.decode(body).events], False


HUMAN = BotInfo(False, "human")
_HUMAN_FIELD = b',"bot":' + _encoder.encode(HUMAN)


def _meter(event: AnyEvent, bot: BotInfo) -> MeterKind:
    """Spec 6.2: human pageviews draw on the pageview cap, bot pageviews on coverage."""
    if isinstance(event, Pageview):
        return MeterKind.COVERAGE if bot.isBot else MeterKind.PAGEVIEW
    if isinstance(event, ConsentTransition):
        return MeterKind.NONE
    return MeterKind.COVERAGE


def _classify(event: AnyEvent, ctx: IngestContext, seen: dict[object, BotInfo]) -> BotInfo:
    """The event's bot verdict; `seen` memoises verdicts within one request.

    A batch repeats one device: with the request evidence fixed, the verdict
    depends only on the user agent, the platforms and the SDK automation
    evidence (events that carry the latter are classified one by one).
    """
    if ctx.bots is None:
        return HUMAN
    device = event.device
    key: object = None
    if device is not None:
        if device.automation is not None:
            return _verdict(event, ctx)
        key = (device.userAgent, device.clientPlatform, device.platform)
    bot = seen.get(key)
    if bot is None:
        bot = seen[key] = _verdict(event, ctx)
    return bot


def _verdict(event: AnyEvent, ctx: IngestContext) -> BotInfo:
    assert ctx.bots is not None
    device = event.device
    if device is None:  # a _consent_transition may carry no device
        verdict = ctx.bots.classify(user_agent=None, native=False, request=ctx.bot_evidence)
    else:
        automation = device.automation
        verdict = ctx.bots.classify(
            user_agent=device.userAgent,
            native=device.clientPlatform not in (None, "web"),
            automation_score=automation.score if automation else None,
            automation_webdriver=automation.webdriver if automation else None,
            automation_signals=automation.signals if automation else None,
            device_platform=device.platform,
            request=ctx.bot_evidence,
        )
    if not verdict.is_bot:
        return HUMAN
    return BotInfo(True, verdict.category, verdict.signals)


def _page_fact(event: AnyEvent) -> tuple[str, str, float, float] | None:
    """The page a pageview opens or a scroll reports on, with the scroll's figures (see AcceptedEvent)."""
    if isinstance(event, Scroll):
        # (as floats: msgpack holds no integer past 2**64; a negative time, a client's
        # measuring fault, is no time)
        depth, time_on_page = float(event.depth), max(0.0, float(event.timeOnPage))
    elif isinstance(event, Pageview):
        depth = time_on_page = 0.0
    else:
        return None
    page = event.page
    return (event.sessionId, page.path if page is not None else "", depth, time_on_page)


def _projection_ms(event: AnyEvent, now_ms: int) -> int:
    """The event's time for the visitor projection (see AcceptedEvent.event_ms): the
    client's, for a click's intervals and for which page is current, except that a page
    is never later than the skew ahead of its receipt (spec 2.2 bounds a client clock by
    it; helper-135: one pageview a year ahead stayed the current page for good). Not the
    receipt time itself: a fast clock's page that arrived late, and so within the skew,
    then outranked its next one (helper-137). A time behind is kept: an offline queue's
    pages keep their order."""
    if event.timestamp > now_ms + SKEW_MS and isinstance(event, Pageview | Scroll):
        return now_ms + SKEW_MS
    return int(event.timestamp)


def _event_id(event: AnyEvent, index: int, header_key: str | None, production: bool) -> str | None:
    if event.eid is not None:
        return event.eid
    if header_key:
        return f"{header_key}/{index}"
    if production:
        return None
    return "dev_" + os.urandom(16).hex()


def _decode_typed(body: bytes) -> tuple[list[AnyEvent | EventIssue], bool] | None:
    """The events when every one of them decodes, and whether the body decoded as one event.

    None when the body is not a batch of 1 to 25 valid events nor one valid
    event. The shape is only a candidate: a body with both "events" and "type"
    is taken for one event by the key probe (or _decode_events), and then
    refused as neither shape (shape.refuse_ambiguous_shape).
    """
    try:
        events: list[AnyEvent | EventIssue] = list(_typed_batch_decoder.decode(body).events)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        try:
            return [_event_decoder.decode(body)], True
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None
    return (events, False) if 1 <= len(events) <= MAX_BATCH else None


def _refuse_known_payment_data(body: bytes, events: list[AnyEvent | EventIssue], single: bool) -> None:
    """refuse_payment_data for a body the key probe vouched for (see prepare_batch).

    The probe looked at every member of every object, a repeated key's
    included, except inside values typed Any (identify's `identity`): their
    keys are flagged from their decoded form and, for what a repeated key
    may hide, from the raw body.
    """
    opaque = list(opaque_values(events))  # type: ignore[arg-type]
    key_candidate = bool(opaque) and (has_card_key(object_keys(opaque)) or may_hide_card_key(body))
    _refuse(
        lambda: scan_payment_data(body, card_candidate=has_card_candidate(body), key_candidate=key_candidate),
        None if single else body,
    )


def _refuse(scan: Callable[[], str | None], batch: bytes | None) -> None:
    """Raise prohibited_payment_data if `scan` finds material; `batch`: the body, when
    it is a batch of events whose refusal should name the event."""
    try:
        payment = scan()
    except UnscannableBody as exc:
        raise ServiceError("invalid_json", str(exc)) from None
    if payment is not None:
        index = _payment_event_index(batch) if batch is not None else None
        refusal = ServiceError(
            "prohibited_payment_data",
            f"payment-instrument material is not accepted ({payment}"
            f"{'' if index is None else f', in event {index}'}); nothing was stored",
        )
        if index is not None:
            refusal.extra["index"] = index
        raise refusal


def _payment_event_index(body: bytes) -> int | None:
    """The first event of a batch that holds the payment material, when one does.

    The refusal's `index`: an SDK drops that event and resends the rest (it had
    to split the batch to find it). Only on the refusal path: each event is
    scanned again alone. None for a single event, or material outside the events.
    """
    try:
        events = _raw_events_decoder.decode(body).events
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    if len(events) > MAX_BATCH:
        return None
    for index, raw in enumerate(events):
        # Each event's bytes as sent (a repeated key's every value, escapes and all),
        # scanned as the whole body was (helper-98: a decoded copy kept only the last
        # value of a repeated key, and the index named a later event).
        try:
            if find_payment_data(bytes(raw), msgspec.json.decode(raw)) is not None:
                return index
        except (UnscannableBody, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None
    return None


class _RawBatch(msgspec.Struct):
    events: list[msgspec.Raw]


_raw_events_decoder = msgspec.json.Decoder(_RawBatch)


def refuse_payment_data(body: bytes, decoded: object | None = None, *, batch: bool = False) -> None:
    """Raise prohibited_payment_data when the request carries payment material anywhere.

    `batch`: the body is /v1/events' batch, whose refusal names the event (`index`).
    """
    if decoded is None:
        decoded = decode_json(body)
    _refuse(lambda: find_payment_data(body, decoded), body if batch else None)


def readable_client_time(timestamp: int | float | None) -> int | float | None:
    """A client's clock reading when a JavaScript consumer reads it exactly (0 to 2^53 ms), else None.

    A wilder clock (1e300, 4,000 digits, negative) is dropped rather than kept:
    past 64 bits it could not even be stored.
    """
    if timestamp is None or not 0 <= timestamp <= MAX_CLIENT_TS:
        return None
    return timestamp


def _order_identity_choices(accepted: list[AcceptedEvent], choices: dict[str, dict[str, int]]) -> None:
    """Date a request's earlier identity choices no later than its last one, per visitor (in place).

    The transitions of one request are in the order the visitor made them, and
    the stored record merges them by time: an earlier choice dated later than
    the last (a clock stepping back) would outrank it. Only the last may have
    been dated at receipt (consent.identity_time); the earlier ones keep their
    time, at most the last one's (a tie goes to the later arrival). Choices are
    those of accepted transitions, an in-batch repeat counted once.
    """
    for positions in choices.values():
        if len(positions) < 2:
            continue
        *earlier, last = positions.values()
        last_state = accepted[last].consent_state
        assert last_state is not None
        for position in earlier:
            event = accepted[position]
            state = event.consent_state
            assert state is not None
            at = min(state.at_ms, last_state.identity_at_ms)
            if at != state.identity_at_ms:
                accepted[position] = msgspec.structs.replace(
                    event, consent_state=msgspec.structs.replace(state, identity_at_ms=at)
                )


# The content hash of a context without a sealer (a pure caller: the server always has one).
_UNSEALED_DIGEST = content_digest(b"")


def _content_hashes(
    event: AnyEvent, ctx: IngestContext, digest: Callable[[bytes], bytes]
) -> tuple[bytes, bytes, tuple[bytes, ...]]:
    """`event_hashes` (no unkeyed hashes: see number_forms.earlier_event_hashes), or for a
    consent or edge write the hashes of the identity its context names, with the unkeyed
    ones earlier versions stored for it (one event a request: worked out at once)."""
    if ctx.content_identity is not None:
        identity, legacy = ctx.content_identity, ctx.legacy_identity
        return _encoder.encode(event), digest(identity), unkeyed_hashes(legacy or identity, identity)
    return (*event_hashes(event, digest), ())


def _too_large(index: int, eid: str, size: str) -> ServiceError:
    # `index` and `eid` as fields, not only in prose: an SDK drops that event and resends the rest
    return ServiceError(
        "batch_too_large", f"event {index} is {size} bytes after enrichment, over {MAX_STORED_EVENT}",
        index=index, eid=eid,
    )


def prepare_batch(body: bytes, ctx: IngestContext) -> PreparedBatch:
    """Validate a request body; raises ServiceError for request-level refusals."""
    # (Trimmed of spaces and tabs only, as the signature trims it: see access.signature.)
    header_key = ctx.idempotency_key.strip(" \t") if ctx.idempotency_key is not None else None
    if header_key is not None and len(header_key) > MAX_IDEMPOTENCY_KEY:
        raise ServiceError(
            "invalid_idempotency_key", f"Idempotency-Key is over {MAX_IDEMPOTENCY_KEY} characters"
        )
    typed = _decode_typed(body)
    if typed is None and (repaired := without_lone_surrogates(body)) is not body:
        body, typed = repaired, _decode_typed(repaired)  # (the steps below read the body again)
    decoded: object = None
    if typed is not None and keys_known(body, single=typed[1]):
        # Every key is vouched for: the body is valid JSON as the generic
        # decoder would find, and the payment scan decodes it only if a
        # pre-filter fires (see keyprobe).
        events, single = typed
        _refuse_known_payment_data(body, events, single)
    else:
        # (a batch with one number out of range rejects the event holding it, not the batch)
        decoded = decode_json(body, out_of_range_numbers=True)
        batch = isinstance(decoded, dict) and isinstance(decoded.get("events"), list) and "type" not in decoded
        refuse_payment_data(body, decoded, batch=batch)
        events, single = _decode_events(body, decoded, typed)
    refuse_ambiguous_shape(body, decoded, single=single)
    # The server fields between "eid" and "bot", as Enrichment encodes them when
    # there is no clientTimestamp and nothing withheld (without the closing brace).
    server_tail = _encoder.encode(Enrichment("", ctx.client_id, ctx.site_id, ctx.now_ms))[_EMPTY_EID:-1]

    accepted: list[AcceptedEvent] = []
    rejected: list[RejectedEvent] = []
    dropped: list[DroppedEvent] = []
    missing_ids: list[int] = []
    verdicts: dict[object, BotInfo] = {}
    identity_choices: dict[str, dict[str, int]] = {}  # visitor -> eid -> its position in `accepted`
    strict_consent = ctx.strict_consent
    digest = ctx.sealer.content_digest if ctx.sealer is not None else _UNSEALED_DIGEST
    refused_denials: set[str] = set()  # visitors whose identity denial was in an event refused
    for index, event in enumerate(events):
        if isinstance(event, EventIssue):
            raw = _raw_event(decoded, index, single)
            rejected.append(RejectedEvent(index, _raw_eid(raw), "validation_error", [event]))
            if (denying := denial_in_undecodable(raw)) is not None:
                refused_denials.add(denying)  # (as for a refused event that decoded, below)
            continue
        event = rewrite_platform(event, ctx.key_type)
        event, issues = check_event(event)
        if issues:
            rejected.append(RejectedEvent(index, event.eid, "validation_error", issues))
            if event.consent is not None and (
                misspelt_identity_denial(event.consent)
                or (isinstance(event, ConsentTransition) and event.consent.identityResolution is False)
            ):
                # refused (for a spelling, for page content in a transition, a bad
                # consent timestamp), but the visitor's refusal is plain: the
                # identifies after it in this request are not stored (helper-87, helper-94)
                refused_denials.add(event.visitorId)
            continue
        eid = _event_id(event, index, header_key, ctx.production)
        if eid is None:
            missing_ids.append(index)
            continue
        # Consent and the privacy floor decide before anything is hashed,
        # counted or stored (spec 4.1 rule 9, 2.3 form). An identify the
        # visitor's consent denies is dropped at admission instead, inside the
        # write transaction that reads the consent record (storage.admission).
        # (Each rule is called only for the events it can concern: a batch
        # pays for every call 25 times.)
        drop = consent_drop_reason(event, True) if strict_consent else None
        if drop is None and isinstance(event, Identify) and (
            identity_declined(event) or event.visitorId in refused_denials
        ):
            drop = "identity_consent_denied"
        withheld = None
        to_store = event
        if drop is None and isinstance(event, Form):
            floor = apply_form_floor(event, MAX_STORED_EVENT)
            if floor.too_large is not None:
                raise _too_large(index, eid, f"at least {floor.too_large}")
            drop, to_store, withheld = floor.drop_reason, floor.form, floor.withheld
        if drop is not None:
            dropped.append(DroppedEvent(index, eid, drop))
            continue
        if isinstance(event, ConsentTransition) and event.page is not None:
            # A page with only a path: accepted (as versions before this one did; their
            # retries stay duplicates) but not stored, as a transition carries no page
            # content (spec 6.1; validate refuses any other; helper-135, helper-137).
            to_store = msgspec.structs.replace(event, page=None)
        if isinstance(event, Click):
            text = scrub_text(event.element.text)
            if text != event.element.text:  # stored scrubbed; the id keeps the content the client sent
                to_store = msgspec.structs.replace(event, element=msgspec.structs.replace(event.element, text=text))
        client_json, content_hash, earlier_hashes = _content_hashes(event, ctx, digest)
        if isinstance(to_store, Form | Identify):
            to_store = seal_sensitive(to_store, ctx.sealer, ctx.client_id, eid)
        client_ts = None
        if abs(event.timestamp - ctx.now_ms) > SKEW_MS:
            # Kept as clientTimestamp only when readable; overridden either way.
            client_ts = readable_client_time(event.timestamp)
            to_store = msgspec.structs.replace(to_store, timestamp=ctx.now_ms)
        if to_store is not event:
            client_json = _encoder.encode(to_store)
        bot = _classify(event, ctx, verdicts)
        # Splice the server fields into the client object: {...client..., ...server...}
        if client_ts is None and withheld is None:  # byte for byte what encoding the Enrichment gives
            bot_field = _HUMAN_FIELD if bot is HUMAN else b',"bot":' + _encoder.encode(bot)
            stored = b"".join(
                (client_json[:-1], b',"eid":', _encoder.encode(eid), server_tail, bot_field, b"}")
            )
        else:
            enrichment = _encoder.encode(
                Enrichment(eid, ctx.client_id, ctx.site_id, ctx.now_ms, client_ts, withheld, bot)
            )
            stored = client_json[:-1] + b"," + enrichment[1:]
        if len(stored) > MAX_STORED_EVENT:
            raise _too_large(index, eid, str(len(stored)))
        consent_state = None
        if isinstance(event, ConsentTransition):
            visitor = event.visitorId
            consent_state = state_of(event, eid, ctx.now_ms)
            if consent_state is not None and consent_state.identityResolution is not None:
                refused_denials.discard(visitor)  # a choice accepted after it decides (helper-91)
                stated = identity_choices.setdefault(visitor, {})
                stated.setdefault(eid, len(accepted))  # (an in-batch repeat is the same decision)
        accepted.append(
            AcceptedEvent(
                index,
                eid,
                event.__struct_config__.tag,  # type: ignore[arg-type]
                content_hash,
                stored,
                _meter(event, bot),
                is_bot=bot.isBot,
                bot_category=bot.category,
                consent_state=consent_state,
                visitor_id=to_store.visitorId,
                event_ms=_projection_ms(event, ctx.now_ms),
                earlier_hashes=earlier_hashes,
                # (a translated route hashes its request, whose numbers were never floats)
                hashed_event=event if ctx.content_identity is None else None,
                page=_page_fact(event),
            )
        )
    _order_identity_choices(accepted, identity_choices)
    if missing_ids:
        raise ServiceError(
            "idempotency_required",
            "every event needs an _eid, or the request an Idempotency-Key header;"
            f" missing at index {', '.join(map(str, missing_ids))}",
            indexes=missing_ids,
        )
    if rejected and not accepted and not dropped:
        if single:
            issues = rejected[0].issues
            raise ServiceError(
                "validation_error",
                f"the event is invalid: {issues[0].path}: {issues[0].message}",
                details=[{"path": i.path, "message": i.message} for i in issues],
            )
        raise ServiceError(
            "validation_error",
            "every event in the batch is invalid",
            errors=[
                {
                    "index": r.index,
                    "eid": r.eid,
                    "error": r.code,  # as in a 202's errors
                    "issues": [{"path": i.path, "message": i.message} for i in r.issues],
                }
                for r in rejected
            ],
        )
    return PreparedBatch(len(events), single, accepted, rejected, dropped)


def _raw_event(decoded: Any, index: int, single: bool) -> object:
    """The event at `index` as the JSON decoder gave it (None when the body is not shaped so)."""
    try:
        return decoded if single else decoded["events"][index]  # type: ignore[index]
    except (KeyError, TypeError, IndexError):
        return None


def _raw_eid(raw: object) -> str | None:
    eid = raw.get("_eid") if isinstance(raw, dict) else None
    return eid if isinstance(eid, str) else None
