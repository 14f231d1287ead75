"""Which object keys a request body holds, learnt without building it as Python objects.

The payment scan (spec 4.1 rule 5) must see every object key of a request,
including fields the schema ignores. Decoding the whole body generically and
walking it costs about as much as the rest of the batch's validation, so the
common case is settled by a *probe*: a copy of the wire schema, derived from
`schema.py` at import, in which every Struct forbids unknown fields, every
leaf is skipped as `msgspec.Raw`, and every map key must not name a card
field. When the probe decodes a body:

- every key of the body is a field name of the schema (none names a card
  field; a schema field that did would fail the probe whenever present) or a
  map key that passed the card-name pattern;
- except inside values typed `Any` (identify's `identity`): the probe skips
  those, and `opaque_values` hands them to the caller to walk;
- every value of the body was decoded with its schema type by the real
  decoder, so the body is valid JSON exactly when the generic decoder would
  say so (the real decoder only skips unknown fields, and there are none).

When the probe fails (an unknown field anywhere, a map key that may name a
card field, a shape the real decoder would also refuse), the caller takes the
exact path: generic decode and a walk of every key. The probe is only ever a
shortcut to "no card field name here", never a verdict of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi

from collector.ingest.payment import CARD_FIELD_NAMES, is_card_field_name
from collector.ingest.schema import AnyEvent, Event


def _card_name_pattern() -> str:
    # A key whose separator-free, lower-cased form is a card field name
    # (payment.is_card_field_name). IGNORECASE matches at least every
    # character whose lower() is the letter, so this matches a superset of
    # those keys: the probe fails on every card field name and on nothing
    # that is not close to one.
    sep = r"[\s_\-.]*"
    names = "|".join(sep.join(map(re.escape, name)) for name in sorted(CARD_FIELD_NAMES))
    return rf"^(?!(?i:{sep}(?:{names}){sep})\Z)"


NOT_CARD_KEY = Annotated[str, msgspec.Meta(pattern=_card_name_pattern())]

# Event classes -> names of their attributes typed Any somewhere inside (walked by the caller).
_OPAQUE: dict[type, tuple[str, ...]] = {}
_probes: dict[type, Any] = {}


def _contains_any(info: mi.Type) -> bool:
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_contains_any(t) for t in info.types)
    if isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _contains_any(info.item_type)
    if isinstance(info, mi.DictType):
        return _contains_any(info.key_type) or _contains_any(info.value_type)
    return False


def _probe_type(info: mi.Type, *, top: bool) -> Any:
    """The probe's type for a schema type; `top`: a field of an event Struct itself."""
    if isinstance(info, mi.StructType):
        return _probe_struct(info, top=False)
    if isinstance(info, mi.UnionType):
        members = [_probe_type(t, top=top) for t in info.types if not isinstance(t, mi.NoneType)]
        if all(m is msgspec.Raw for m in members):
            return msgspec.Raw
        if any(m is msgspec.Raw for m in members):
            raise TypeError(f"the key probe cannot mirror the union {info}")
        union: Any = members[0]
        for member in members[1:]:
            union = union | member
        return union | None
    if isinstance(info, mi.ListType):
        item = _probe_type(info.item_type, top=False)
        return msgspec.Raw if item is msgspec.Raw else list[item]  # type: ignore[valid-type]
    if isinstance(info, mi.DictType):
        if _contains_any(info.value_type):
            if not top:
                raise TypeError("the key probe walks Any-typed values only in event fields")
            return msgspec.Raw  # walked by the caller (opaque_values)
        return dict[NOT_CARD_KEY, _probe_type(info.value_type, top=False)]  # type: ignore[misc]
    if isinstance(info, mi.AnyType):
        if not top:
            raise TypeError("the key probe walks Any-typed values only in event fields")
        return msgspec.Raw
    if isinstance(info, mi.StrType | mi.IntType | mi.FloatType | mi.BoolType | mi.LiteralType | mi.NoneType):
        return msgspec.Raw
    raise TypeError(f"the key probe cannot mirror {info}")


def _probe_struct(info: mi.StructType, *, top: bool) -> Any:
    cls = info.cls
    if cls in _probes:
        return _probes[cls]
    fields: list[tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    opaque: list[str] = []
    for position, field in enumerate(info.fields):
        attr = f"f{position}"
        rename[attr] = field.encode_name
        if is_card_field_name(field.encode_name):
            # Never expected; if the schema grows such a field, its presence fails the probe.
            fields.append((attr, None, None))
            continue
        probe = _probe_type(field.type, top=top)
        if top and _contains_any(field.type):
            opaque.append(field.name)
        fields.append((attr, probe if probe is msgspec.Raw else probe | None, None))
    probe_cls = msgspec.defstruct(
        f"Probe{cls.__name__}",
        fields,
        rename=rename,
        forbid_unknown_fields=True,
        tag_field=info.tag_field,
        tag=info.tag,
        frozen=True,
    )
    _probes[cls] = probe_cls
    if opaque:
        _OPAQUE[cls] = tuple(opaque)
    return probe_cls


def _event_probe() -> Any:
    union = mi.type_info(AnyEvent)  # type: ignore[arg-type]
    assert isinstance(union, mi.UnionType)
    members = [_probe_struct(t, top=True) for t in union.types if isinstance(t, mi.StructType)]
    probe: Any = members[0]
    for member in members[1:]:
        probe = probe | member
    return probe


_EventProbe = _event_probe()
_single_probe = msgspec.json.Decoder(_EventProbe)
_batch_probe = msgspec.json.Decoder(
    msgspec.defstruct("ProbeBatch", [("events", list[_EventProbe])], forbid_unknown_fields=True)  # type: ignore[valid-type]
)


def keys_known(body: bytes, *, single: bool) -> bool:
    """True when every object key of `body` is a schema field name or a map key naming no card field.

    `body` must already have decoded with the real schema (as one event when
    `single`, else as `{"events": [...]}`). Values typed Any are not looked
    into: see `opaque_values`. False for anything else, never an exception.
    """
    try:
        (_single_probe if single else _batch_probe).decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False
    return True


def opaque_values(events: list[Event]) -> Iterator[Any]:
    """The values of the given (decoded) events that the probe did not look into."""
    for event in events:
        names = _OPAQUE.get(type(event))
        if names:
            for name in names:
                value = getattr(event, name)
                if value is not None:
                    yield value
