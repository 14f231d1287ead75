"""The two body shapes of spec 4.1, and the bodies that read as neither (collector/ingest/shape.py)."""

from __future__ import annotations

import pytest

from collector.errors import ServiceError
from collector.ingest.shape import refuse_ambiguous_shape


def test_a_repeated_top_level_events_array_is_refused() -> None:
    with pytest.raises(ServiceError, match='more than one "events" array'):
        refuse_ambiguous_shape(b'{"events": [{"a": 1}], "events": [{"b": 2}]}', None, single=False)


def test_events_keys_below_the_top_level_are_not_a_repeat() -> None:
    body = b'{"events": [{"type": "custom", "custom": {"events": 1}, "x": {"events": 2}}]}'
    refuse_ambiguous_shape(body, None, single=False)


def test_an_event_that_also_carries_events_is_refused() -> None:
    with pytest.raises(ServiceError, match='one event \\("type"\\) and a batch'):
        refuse_ambiguous_shape(b"{}", {"type": "pageview", "events": []}, single=True)


def test_a_single_event_and_an_ordinary_batch_pass() -> None:
    refuse_ambiguous_shape(b'{"type": "pageview"}', {"type": "pageview"}, single=True)
    refuse_ambiguous_shape(b'{"type": "pageview"}', None, single=True)
    refuse_ambiguous_shape(b'{"events": [{"type": "pageview"}]}', None, single=False)


def test_a_repeat_spelt_with_escapes_is_refused() -> None:
    # helper-64: {"events":[A],"\u0065vents":[B]} stored B alone with a 202.
    for body in (rb'{"events": [{"a": 1}], "\u0065vents": [{"b": 2}]}',
                 rb'{"e\u0076ents": [{"a": 1}], "event\u0073": [{"b": 2}]}'):
        with pytest.raises(ServiceError, match='more than one "events" array'):
            refuse_ambiguous_shape(body, None, single=False)
    refuse_ambiguous_shape(rb'{"events": [{"title": "caf\u00e9 \u00e8vents"}]}', None, single=False)


def test_a_repeat_too_deep_to_check_is_refused_not_let_through() -> None:
    # msgspec reads a few levels deeper than json; helper-64 got a 202 that kept the second array alone.
    deep = b"[" * 2000 + b"]" * 2000
    body = b'{"events": [{"a": ' + deep + b'}], "events": [{"b": 2}]}'
    with pytest.raises(ServiceError, match="nested too deeply"):
        refuse_ambiguous_shape(body, None, single=False)
