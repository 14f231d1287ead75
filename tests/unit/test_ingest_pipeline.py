"""The pure ingest pipeline with byte fixtures (spec 2.2-2.4, 4.1, 8.1)."""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import RawErrorBody, ServiceError
from collector.ingest import decompress_body, prepare_batch
from collector.ingest.model import IngestContext, MeterKind
from collector.ingest.number_forms import hashes_before_int_numbers
from collector.ingest.payment import find_payment_data, looks_like_card
from collector.ingest.sealing import FieldSealer

NOW = 1_795_000_000_000
SEALER = FieldSealer({"k1": bytes(range(32))}, "k1")


def ctx(**overrides: object) -> IngestContext:
    fields: dict[str, object] = {
        "client_id": "acme",
        "site_id": "web",
        "key_type": "browser",
        "production": True,
        "now_ms": NOW,
        "sealer": SEALER,
    }
    fields.update(overrides)
    return IngestContext(**fields)  # type: ignore[arg-type]


def event(eid: str = "e1", **overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "type": "pageview",
        "_eid": eid,
        "visitorId": "v1",
        "sessionId": "s1",
        "timestamp": NOW,
        "page": {"url": "https://acme.com/a", "path": "/a", "title": "A"},
        "device": {"userAgent": "Mozilla/5.0", "viewport": {"width": 1, "height": 1}},
    }
    base.update(overrides)
    return base


def run(body: object, **context: object):
    return prepare_batch(json.dumps(body).encode(), ctx(**context))


def stored(result, index: int = 0) -> dict[str, object]:
    return json.loads(result.accepted[index].stored)


def refused(body: object, code: str, **context: object) -> ServiceError:
    with pytest.raises(ServiceError) as info:
        run(body, **context)
    assert info.value.code == code, info.value.message
    return info.value


def test_pure_modules_import_no_io_frameworks() -> None:
    code = (
        "import sys, collector.ingest, collector.ingest.pipeline;"
        "bad = {'trio', 'quart', 'lmdb', 'hypercorn'} & {m.split('.')[0] for m in sys.modules};"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_every_type_is_accepted() -> None:
    events = [
        event("p", performance={"loadTime": 120}),
        event("c", type="click", element={"selector": "a", "text": "Buy", "x": 1, "y": 2, "normX": 0.5}),
        event("s", type="scroll", depth=50, timeOnPage=1200),
        event("f", type="form", action="submit", formId="signup", fieldCount=3,
              raw_fields='{"email": "email"}', form_submission_id="123e4567-e89b-12d3-a456-426614174000"),
        event("u", type="custom", name="signup", category="funnel", label="x" * 4096, value=3),
        event("i", type="identify", hem="a" * 64, hemMd5="b" * 32),
        {"type": "_consent_transition", "_eid": "t", "visitorId": "v", "sessionId": "s",
         "timestamp": NOW, "consent": {"analytics": False}},
    ]
    result = run({"events": events})
    assert [a.event_type for a in result.accepted] == [
        "pageview", "click", "scroll", "form", "custom", "identify", "_consent_transition"
    ]
    assert [a.meter for a in result.accepted] == [
        MeterKind.PAGEVIEW, *[MeterKind.COVERAGE] * 5, MeterKind.NONE
    ]
    assert stored(result, 2)["depth"] == 50  # type-specific fields stay top-level


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"visitorId": "v" * 129}, "$.visitorId"),
        ({"sessionId": ""}, "$.sessionId"),
        ({"timestamp": "now"}, "$.timestamp"),
        ({"type": "email_open"}, "$.type"),
        ({"device": {"userAgent": "u" * 513, "viewport": {"width": 1, "height": 1}}}, "$.device.userAgent"),
        ({"device": {"viewport": {"width": 1, "height": 1}}}, "$.device.userAgent"),
        ({"device": {"userAgent": "u"}}, "$.device.viewport"),
        ({"page": {"url": "javascript:alert(1)", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": "https://a.com/"}}, "$.page"),
        ({"type": "click", "element": {"selector": "s" * 513, "text": "t", "x": 1, "y": 1}}, "$.element.selector"),
        ({"type": "scroll", "depth": 101, "timeOnPage": 1}, "$.depth"),
        ({"type": "form", "action": "type", "formId": "f", "fieldCount": 1}, "$.action"),
        ({"type": "form", "action": "submit", "formId": "f", "fieldCount": 1001}, "$.fieldCount"),
        ({"type": "form", "action": "submit", "formId": "f", "fieldCount": 1, "raw_fields": "not json"}, "$.raw_fields"),
        ({"type": "form", "action": "submit", "formId": "f", "fieldCount": 1,
          "files": [{"name": "a"}] * 26}, "$.files"),
        ({"type": "custom", "name": "n" * 257}, "$.name"),
        ({"type": "custom", "name": "n", "label": "l" * 4097}, "$.label"),
        ({"type": "identify", "hem": "A" * 64}, "$.hem"),
        ({"type": "identify", "hem": "a" * 64, "hemMd5": "z" * 32}, "$.hemMd5"),
        # a pattern's $ matched before a final newline, which was stored
        ({"type": "identify", "hem": "a" * 64 + "\n"}, "$.hem"),
        ({"type": "identify", "hem": "a" * 64, "hemMd5": "b" * 32 + "\n"}, "$.hemMd5"),
        ({"type": "form", "action": "submit", "formId": "f", "fieldCount": 1,
          "form_submission_id": "123e4567-e89b-12d3-a456-426614174000\n"}, "$.form_submission_id"),
        # a web URL with a control character, a space around it or in its host, or no port a URL can have
        ({"page": {"url": "http://local host/", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": "http://\u0000/", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": "https://acme.com/a\n", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": " https://acme.com/", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": "http://localhost:99999/", "path": "/", "title": "t"}}, "$.page.url"),
        # a consent field spelt otherwise would be dropped unread: identity_resolution: false stored identity
        ({"consent": {"analytics": True, "identity_resolution": False}}, "$.consent.identity_resolution"),
        ({"consent": {"analytics": True, "ThirdPartySharing": False}}, "$.consent.ThirdPartySharing"),
        ({"consent": {"analytics": True, "Identity_Resolution": False}}, "$.consent.Identity_Resolution"),
        ({"page": {"url": "https://acme.com/a\u2028b", "path": "/", "title": "t"}}, "$.page.url"),
        ({"page": {"url": "http://acme.com\u00a0/", "path": "/", "title": "t"}}, "$.page.url"),
        # a map key over its limit names the map
        ({"type": "form", "action": "submit", "formId": "f", "fieldCount": 1, "values": {"k" * 257: "v"}},
         "$.values"),
        # whole numbers keep their form, and one past int64 is refused, not stored
        ({"type": "scroll", "depth": 5, "timeOnPage": 2**63}, "$.timeOnPage"),
    ],
)
def test_field_rules_reject(overrides: dict[str, object], path: str) -> None:
    error = refused(event(**overrides), "validation_error")
    assert any(d["path"].startswith(path) for d in error.extra["details"]), error.extra


def test_messages_name_the_right_spelling_and_the_map() -> None:
    consent = refused(event(consent={"analytics": True, "identity-resolution": False}), "validation_error")
    assert consent.extra["details"][0]["message"] == "`identity-resolution` is not a consent field: write `identityResolution`"
    key = refused(event(type="form", action="submit", formId="f", fieldCount=1, values={"k" * 257: "v"}),
                  "validation_error")
    assert key.extra["details"][0] == {"path": "$.values", "message": "a key: Expected `str` of length <= 256"}
    # A consent map's other keys (a consent platform's own categories) are not the spec's and are not refused,
    # nor is a page that talks about identity resolution.
    fine = run(event(consent={"analytics": True, "marketing": False, "identityResolution": True},
                     page={"url": "https://acme.com/", "path": "/", "title": "Identity resolution & third-party sharing"}))
    assert fine.accepted and stored(fine)["consent"] == {"analytics": True, "identityResolution": True}


def test_a_trailing_newline_is_named_as_such() -> None:
    error = refused(event(type="identify", hem="a" * 64 + "\n"), "validation_error")
    assert error.extra["details"][0] == {"path": "$.hem", "message": "hem ends with a newline: send the value alone"}


def test_every_key_needs_a_device() -> None:
    native = event(page={"path": "Home", "title": "Home"})
    del native["device"]
    for key_type in ("mobile", "server", "browser"):
        error = refused(native, "validation_error", key_type=key_type)
        assert "device" in error.extra["details"][0]["message"], key_type


def test_page_fields_truncate_at_their_limits() -> None:
    keep = run(event(page={"url": "https://a.com/" + "a" * (2048 - 14), "path": "/", "title": "t" * 512}))
    assert len(stored(keep)["page"]["url"]) == 2048
    cut = run(event(page={"url": "https://a.com/" + "a" * 3000, "path": "/" + "p" * 2048,
                          "title": "t" * 513, "referrer": "r" * 5000}))
    page = stored(cut)["page"]
    assert (len(page["url"]), len(page["path"]), len(page["title"]), len(page["referrer"])) == (
        2048, 2048, 512, 2048
    )


def test_user_agent_limit_is_exactly_512() -> None:
    run(event(device={"userAgent": "u" * 512, "viewport": {"width": 1, "height": 1}}))
    refused(event(device={"userAgent": "u" * 513, "viewport": {"width": 1, "height": 1}}), "validation_error")


def test_platform_rewrite_by_key_type() -> None:
    native = event(device={}, page={"path": "Home", "title": "Home"})
    assert stored(run(native, key_type="mobile"))["device"]["clientPlatform"] == "react-native"
    ios = event(device={"clientPlatform": "ios"}, page={"path": "Home", "title": "Home"})
    assert stored(run(ios, key_type="mobile"))["device"]["clientPlatform"] == "ios"
    assert stored(run(ios, key_type="server"))["device"]["clientPlatform"] == "server"
    # a website key declaring a native platform is validated as web: the url is required again
    refused(ios, "validation_error", key_type="browser")
    spoof = event(device={"clientPlatform": "android", "userAgent": "u", "viewport": {"width": 1, "height": 1}})
    assert "clientPlatform" not in stored(run(spoof))["device"]


def test_native_urls_may_use_custom_schemes() -> None:
    native = event(page={"url": "myapp://home", "path": "Home", "title": "Home"}, device={"clientPlatform": "ios"})
    assert run(native, key_type="mobile").accepted


def test_timestamp_override_edges() -> None:
    assert "clientTimestamp" not in stored(run(event(timestamp=NOW - 300_000)))
    moved = stored(run(event(timestamp=NOW - 300_001)))
    assert (moved["timestamp"], moved["clientTimestamp"]) == (NOW, NOW - 300_001)
    assert stored(run(event(timestamp=NOW + 400_000)))["timestamp"] == NOW


def test_enrichment_fields() -> None:
    row = stored(run(event()))
    assert (row["eid"], row["clientId"], row["siteId"], row["receivedAt"]) == ("e1", "acme", "web", NOW)


def test_content_hash_ignores_layout_and_server_override() -> None:
    one = event(timestamp=NOW - 10_000_000)
    a = prepare_batch(json.dumps(one).encode(), ctx()).accepted[0].content_hash
    b = prepare_batch(json.dumps(one, indent=3, sort_keys=True).encode(), ctx(now_ms=NOW + 60_000)).accepted[0].content_hash
    c = prepare_batch(json.dumps(event(timestamp=NOW - 10_000_001)).encode(), ctx()).accepted[0].content_hash
    assert a == b and a != c and len(a) == 16


_DEVICE = {"userAgent": "UA", "viewport": {"width": 1280, "height": 720}, "screen": {"width": 2560, "height": 1440},
           "fingerprintConfidence": 90, "pixelRatio": 2, "automation": {"score": 0, "webdriver": False}}
_ENVELOPE = {"visitorId": "v", "sessionId": "s", "timestamp": 1764000000000, "_eid": "e",
             "page": {"path": "/", "title": "T", "url": "https://a.example/"}, "device": _DEVICE}
# Each event with a whole number in every field versions before 2026-11-25 decoded as a
# float, and the hashes such a version gave it (computed by running that version's
# pipeline: b551197): a retry of it across the upgrade must find them.
_BEFORE_INT_NUMBERS = [
    ({**_ENVELOPE, "type": "pageview",
      "performance": {"loadTime": 1200, "domContentLoaded": 800, "firstContentfulPaint": 650}},
     {"f1584cb8df675009d4c85c0811378da7"}),
    ({**_ENVELOPE, "type": "click", "element": {
        "selector": "a", "text": "Buy", "x": 10, "y": 20, "normX": 0, "normY": 1,
        "viewportWidth": 1280, "viewportHeight": 720, "docWidth": 1280, "docHeight": 4000}},
     {"fbb400fff2d9ff5cad00398afd470aa3"}),
    ({**_ENVELOPE, "type": "scroll", "depth": 50, "timeOnPage": 1200}, {"35dee3e2382ee60f47fab4d2eb4f450a"}),
    # a form: hashed with its values' keys sorted, and before that in the order sent
    ({**_ENVELOPE, "type": "form", "action": "submit", "formId": "f", "fieldCount": 2, "completion_rate": 100,
      "values": {"b": "2", "a": "1"}},
     {"2b404ae7a8afbde790c6cd323b05f6f0", "022c68353e15a2855e7b602917b260d2"}),
]


@pytest.mark.parametrize(("sent", "previous"), _BEFORE_INT_NUMBERS)
def test_whole_numbers_are_stored_as_sent_and_match_records_of_the_float_versions(
    sent: dict[str, object], previous: set[str]
) -> None:
    accepted = run(sent).accepted[0]
    row = json.loads(accepted.stored)
    assert row["device"]["viewport"] == {"width": 1280, "height": 720}
    assert b".0," not in accepted.stored and b".0}" not in accepted.stored, accepted.stored
    assert accepted.hashed_event is not None
    older = {digest.hex() for digest in hashes_before_int_numbers(accepted.hashed_event)}
    assert older == previous
    assert accepted.content_hash.hex() not in previous


def test_fractions_stay_fractions_and_float_forms_have_no_older_hashes() -> None:
    sent = {**_ENVELOPE, "type": "scroll", "depth": 50.5, "timeOnPage": 1200.25,
            "device": {"userAgent": "UA", "viewport": {"width": 1280.5, "height": 720.0}}}
    accepted = run(sent).accepted[0]
    row = json.loads(accepted.stored)
    assert (row["depth"], row["timeOnPage"], row["device"]["viewport"]) == (
        50.5, 1200.25, {"width": 1280.5, "height": 720.0})
    assert accepted.hashed_event is not None and hashes_before_int_numbers(accepted.hashed_event) == ()


def test_sizes_and_durations_are_any_number_as_the_spec_has_them() -> None:
    # A loadTime read before the load event is negative; the pageview was refused for it.
    measured = run(event(performance={"loadTime": -1764000000000, "domContentLoaded": 812.5},
                         device={"userAgent": "UA", "viewport": {"width": -1, "height": 0}}))
    row = stored(measured)
    assert row["performance"] == {"loadTime": -1764000000000, "domContentLoaded": 812.5}
    assert row["device"]["viewport"] == {"width": -1, "height": 0}
    scroll = run(event(type="scroll", depth=25, timeOnPage=-40)).accepted[0]
    assert scroll.page is not None and scroll.page[2:] == (25.0, 0.0)  # no time, in the snapshot
    form = run(event(type="form", action="submit", formId="f", fieldCount=3.0,
                     files=[{"name": "a.pdf", "size": 1024.0}]))
    assert (stored(form)["fieldCount"], stored(form)["files"]) == (3.0, [{"name": "a.pdf", "size": 1024.0}])


def test_an_idempotency_key_is_trimmed_of_spaces_and_tabs_only() -> None:
    result = prepare_batch(json.dumps({k: v for k, v in event().items() if k != "_eid"}).encode(),
                           ctx(idempotency_key=" \t\u00a0k-1\u3000\t "))
    assert result.accepted[0].eid == "\u00a0k-1\u3000/0"


def test_idempotency_rules() -> None:
    bare = event()
    del bare["_eid"]
    error = refused({"events": [event("ok"), bare]}, "idempotency_required")
    assert "1" in error.message
    mapped = run({"events": [bare, event("own")]}, idempotency_key=" key-1 ")
    assert [a.eid for a in mapped.accepted] == ["key-1/0", "own"]
    refused(event(), "invalid_idempotency_key", idempotency_key="k" * 513)
    assert run(bare, production=False).accepted[0].eid.startswith("dev_")


def test_batch_shapes() -> None:
    refused({"events": []}, "validation_error")
    refused({"events": [event(str(i)) for i in range(26)]}, "validation_error")
    refused({"events": "nope"}, "validation_error")
    refused([event()], "validation_error")
    assert len(run({"events": [event(str(i)) for i in range(25)]}).accepted) == 25


def test_partial_and_total_failure() -> None:
    partial = run({"events": [event("a"), event("b", visitorId="")]})
    assert [a.eid for a in partial.accepted] == ["a"]
    assert partial.rejected[0].index == 1 and partial.rejected[0].eid == "b"
    error = refused({"events": [event("a", visitorId=""), event("b", timestamp=None)]}, "validation_error")
    assert [e["index"] for e in error.extra["errors"]] == [0, 1]


def test_invalid_json_utf8_and_nesting() -> None:
    for body in (b"{", b"", b'{"visitorId": "\xff"}', b"[" * 10_000 + b"]" * 10_000):
        with pytest.raises(ServiceError) as info:
            prepare_batch(body, ctx())
        assert info.value.code in {"invalid_json", "validation_error"}


def test_a_byte_order_mark_is_named() -> None:
    body = b"\xef\xbb\xbf" + msgspec.json.encode(event())
    with pytest.raises(ServiceError, match="byte order mark") as info:
        prepare_batch(body, ctx())
    assert info.value.code == "invalid_json"


def test_event_over_120000_bytes() -> None:
    values = {f"f{i}": "v" * 9_000 for i in range(14)}
    refused(event(type="form", action="submit", formId="f", fieldCount=14, values=values), "batch_too_large")


def test_a_form_whose_field_names_alone_overflow_is_refused_before_its_values_are_sealed() -> None:
    # 40,000 empty fields cannot fit in 120,000 bytes whatever is withheld: the
    # refusal says so without classifying every value or sealing any.
    values = {f"field{i}": "" for i in range(40_000)}
    error = refused(event(type="form", action="submit", formId="f", fieldCount=1, values=values), "batch_too_large")
    assert "event 0 is at least " in error.message and "over 120000" in error.message


def test_an_oversized_checkout_is_still_dropped_not_refused() -> None:
    values = {f"field{i}": "" for i in range(40_000)} | {"cardNumber": ""}
    result = run(event(type="form", action="submit", formId="f", fieldCount=1, values=values))
    assert [d.reason for d in result.dropped] == ["checkout_form"]


_field_names = st.text(min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    values=st.dictionaries(_field_names | st.sampled_from(["ssn", "cardHolder", "password", "email"]),
                           st.text(max_size=20) | st.just("123-45-6789"), max_size=30),
    sealed=st.booleans(),
)
def test_the_early_size_bound_never_exceeds_what_is_stored(values: dict[str, str], sealed: bool) -> None:
    from collector.ingest.privacy import least_stored_size

    form = event(type="form", action="submit", formId="f", fieldCount=1, values=values)
    try:
        result = run(form, **({} if sealed else {"sealer": None}))
    except ServiceError as error:  # a name like "CVC" with a value: refused as payment data
        assert error.code == "prohibited_payment_data"
        return
    if result.accepted:  # a checkout (cardHolder) is dropped: nothing stored to bound
        assert least_stored_size(values) <= len(result.accepted[0].stored)


def test_the_edge_identity_keeps_the_layout_earlier_versions_stored() -> None:
    # A retry of an edge pageview stored before `clientIp` (and a null title) was a
    # 409: the identity encoded the body's struct, which had grown (helper-71).
    from collector.http.edge_body import edge_to_event

    sent = b'{"_eid":"u1","visitorId":"v","sessionId":"s","url":"https://a.com/","clientIp":"198.51.100.7"}'
    assert edge_to_event(sent, user_agent="UA", now_ms=5).identity == (
        b'{"url":"https://a.com/","visitorId":"v","sessionId":"s","_eid":"u1","title":"",'
        b'"referrer":null,"timestamp":null,"userAgent":null,"consent":null}'
    )


@pytest.mark.parametrize(
    ("value", "in_clear"),
    [("John Doe <john@example.com>", True), ("email: john@example.com", True), ("tel:+14155550123", True),
     ("+1 415 555 0123 ext 5", True), ("+44\u00a020\u00a07946\u00a00958", True), ("+49 30/1234567", True),
     ({"john@example.com": True}, True),
     # ordinary identity values (helper-76): a Fediverse handle, amounts, coordinates, dates, ids, hashes
     ("@user@mastodon.social", False), ("+1000000.00", False), ("+40.7128-074.0060", False), ("+2024-01-15", False),
     ("medium.com/@author", False), ("spring+2024", False), ("Cj0KCQiA", False), ("a" * 64, False)],
)
def test_an_identity_value_in_clear_is_refused(value: object, in_clear: bool) -> None:
    sent = event("i1", type="identify", hem="a" * 64, identity={"v": value})
    if in_clear:
        refused(sent, "validation_error")
    else:
        assert run(sent).accepted


def test_consent_transition_never_carries_page_content() -> None:
    bad = {"type": "_consent_transition", "_eid": "t", "visitorId": "v", "sessionId": "s",
           "timestamp": NOW, "consent": {"analytics": True},
           "page": {"url": "https://a.com/secret", "path": "/", "title": "Secret"}}
    refused(bad, "validation_error")


# -- payment data ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["4111 1111 1111 1111", "4111-1111-1111-1111", "pay with 378282246310005 now", "5555555555554444",
     "6011111111111117",
     # in one piece after other digits
     "Mozilla/5.0 Firefox/133 4111111111111111", "year 2026 4111111111111111", "PIN 1234 4111111111111111",
     "5.0 4111111111111111",
     # grouped after a glued group (they passed with the one-piece rule alone, helper-72)
     "Safari/537.36 4111 1111 1111 1111", "rv:133.0 4111 1111 1111 1111", "SKU A7 5555-5555-5555-4444",
     "?note=card+4111+1111+1111+1111",
     # after a "+" but no phone number: 16 digits, or grouped in fours (helper-74)
     "cc=+4111+1111+1111+1111", "Card:+4111111111111111", "(+5555 5555 5555 4444)"],
)
def test_cards_are_found(text: str) -> None:
    refused(event(type="custom", name="x", label=text), "prohibited_payment_data")


def test_card_fields_anywhere() -> None:
    refused(event(type="form", action="submit", formId="f", fieldCount=1, values={"card_number": "x"}),
            "prohibited_payment_data")
    refused(event(extra={"deep": [{"CVV": "123"}]}), "prohibited_payment_data")
    refused(event(extra={"cc-exp": 1228}), "prohibited_payment_data")


@pytest.mark.parametrize(
    "text",
    ["ORD-2024-000123", "+1 415 555 2671", "+44 7911 123456", "123e4567-e89b-12d3-a456-426614174000",
     "a" * 64, "2026-11-22T10:00:00Z", "4111111111111112", "9111111111111111", "1795000000000",
     "invoice INV4111111111111111", "1234 5678 9012 3456",
     # IBANs and references grouped in fours, barcodes and ids after other digits (helper-71)
     "DE89 3704 0044 0532 0130 00", "GB29 NWBK 6016 1331 9268 19", "Sizes 36 38 40 42 44",
     "1795000000000 1795000000001", "Bitte an IBAN DE51 5001 0517 1703 7296 84",
     "IBAN DE 91 5906 6627 6831 4503 45", "Size 42 4292180442336", "ref 20 6314 3426 3151 4415",
     "v8 build 462 6841306637050",
     # EAN-13 barcodes (13 digits no longer count), E.164 phone numbers (helper-72)
     "https://acme.com/p/4043909718948", "call +62812944117715", "tel:+62812944117715",
     # IBANs with a letter glued to the bank code, a UK sort code and account, lower case (helper-74)
     "IT17 K030 6909 6064 8337 8876 232", "GB15 NWBK 6016 1359 4709 00", "de51 5001 0517 1703 7296 84"],
)
def test_not_payment_data(text: str) -> None:
    assert run(event(type="custom", name="x", label=text)).accepted


def test_raw_fields_naming_card_fields_is_not_payment_data() -> None:
    form = event(type="form", action="focus", formId="checkout", fieldCount=2,
                 raw_fields='{"cc-number": "text", "cvv": "text"}')
    result = run(form)  # not refused as payment data; the privacy floor drops the checkout
    assert [d.reason for d in result.dropped] == ["checkout_form"]
    assert run(dict(form, formId="survey", raw_fields='{"email": "email"}')).accepted


def test_card_as_json_number_is_not_a_string() -> None:
    assert find_payment_data(b'{"n": 4111111111111111}', {"n": 4111111111111111}) is None
    assert looks_like_card("4111111111111111") and not looks_like_card("1795000000000")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_detector_never_crashes(text: str) -> None:
    body = msgspec.json.encode({"label": text})
    find_payment_data(body, {"label": text})


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_pipeline_only_raises_service_errors(body: bytes) -> None:
    with contextlib.suppress(ServiceError):
        prepare_batch(body, ctx())


# -- bodies ------------------------------------------------------------------


def test_gzip_round_trip_and_rules() -> None:
    raw = json.dumps(event()).encode()
    assert decompress_body(gzip.compress(raw), "gzip", "application/json; charset=utf-8") == raw
    assert decompress_body(raw, None, None) == raw
    with pytest.raises(RawErrorBody) as info:
        decompress_body(gzip.compress(raw), "gzip", "text/plain")
    assert info.value.body == {"error": "Content-Type must be application/json"}
    with pytest.raises(ServiceError) as bad:
        decompress_body(b"not gzip", "gzip", "application/json")
    assert bad.value.code == "invalid_json"
    with pytest.raises(ServiceError) as truncated:
        decompress_body(gzip.compress(raw)[:-6], "gzip", "application/json")
    assert truncated.value.code == "invalid_json"
    with pytest.raises(ServiceError):
        decompress_body(raw, "br", "application/json")
    # RFC 9110 8.4.1.3: x-gzip is gzip (audit helper-41: refused)
    assert decompress_body(gzip.compress(raw), "X-Gzip", "application/json") == raw


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=0, max_size=400), st.integers(1, 400)), min_size=1, max_size=12))
def test_gzip_members_inflate_to_their_concatenation(members: list[tuple[bytes, int]]) -> None:
    # Members end anywhere within the 64 KiB input pieces and output chunks.
    contents = [content * repeat for content, repeat in members]
    body = b"".join(gzip.compress(content, 1) for content in contents)
    assert decompress_body(body, "gzip", "application/json") == b"".join(contents)


def test_a_gzip_body_of_too_many_members_is_refused() -> None:
    # Handing zlib the whole rest of the body per member copied it each time:
    # 1 MB of empty members took 1.3 s (audit helper-41). 1,024 members are read.
    empty = gzip.compress(b"")
    assert decompress_body(empty * 1023 + gzip.compress(b"{}"), "gzip", "application/json") == b"{}"
    with pytest.raises(ServiceError) as many:
        decompress_body(empty * (1_048_576 // len(empty)), "gzip", "application/json")
    assert many.value.code == "invalid_json" and "members" in str(many.value)


def test_gzip_bomb_aborts() -> None:
    bomb = gzip.compress(b"0" * (50 * 1024 * 1024))
    assert len(bomb) < 100_000
    with pytest.raises(ServiceError) as info:
        decompress_body(bomb, "gzip", "application/json")
    assert info.value.code == "payload_too_large"


def test_spliced_server_fields_match_the_encoded_enrichment() -> None:
    from collector.ingest.bots import BotClassifier
    from collector.ingest.schema import BotInfo, Enrichment

    bots = BotClassifier()
    gptbot = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; GPTBot/1.2"
    body = {"events": [event("h"), event("b", device={"userAgent": gptbot, "viewport": {"width": 1, "height": 1}})]}
    result = run(body, bots=bots)
    encoder = msgspec.json.Encoder()
    for accepted, bot in zip(result.accepted, (BotInfo(False, "human"), None), strict=True):
        as_stored = json.loads(accepted.stored)
        verdict = bot or BotInfo(True, as_stored["bot"]["category"], tuple(as_stored["bot"]["signals"]))
        tail = encoder.encode(Enrichment(accepted.eid, "acme", "web", NOW, None, None, verdict))
        assert accepted.stored.endswith(b"," + tail[1:])  # byte for byte
    assert json.loads(result.accepted[1].stored)["bot"]["category"] == "ai_crawler"
    assert result.accepted[1].meter is MeterKind.COVERAGE and result.accepted[0].meter is MeterKind.PAGEVIEW


def test_verdicts_within_a_batch_match_classifying_each_event_alone() -> None:
    from collector.ingest.bots import BotClassifier

    bots = BotClassifier()
    windows = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0"
    gptbot = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; GPTBot/1.2"
    size = {"width": 1, "height": 1}
    devices: list[dict[str, object]] = [
        {"userAgent": windows, "viewport": size},
        {"userAgent": windows, "viewport": size, "platform": "Win32"},
        {"userAgent": windows, "viewport": size, "platform": "iPhone"},  # stealth: platform
        {"userAgent": windows, "viewport": size, "automation": {"webdriver": True}},
        {"userAgent": windows, "viewport": size, "automation": {"score": 10}},
        {"userAgent": windows, "viewport": size},
        {"userAgent": gptbot, "viewport": size},
        {"userAgent": windows, "viewport": size, "clientPlatform": "ios"},
    ]
    consent = {k: v for k, v in event("t").items() if k not in ("page", "device")}
    consent.update(type="_consent_transition", consent={"analytics": True})
    for key_type in ("browser", "mobile"):
        events = [event(f"e{i}", device=device) for i, device in enumerate(devices)] + [consent]
        batch = run({"events": events}, bots=bots, key_type=key_type)
        alone = [run(one, bots=bots, key_type=key_type).accepted[0] for one in events]
        assert [a.stored for a in batch.accepted] == [a.stored for a in alone]
        assert [(a.is_bot, a.bot_category) for a in batch.accepted] == [
            (a.is_bot, a.bot_category) for a in alone
        ]
        verdicts = [json.loads(a.stored)["bot"]["category"] for a in batch.accepted]
        if key_type == "browser":  # native events are exempt from the stealth rule
            assert verdicts[2:4] == ["automation", "automation"] and verdicts[5] == "human"


def test_a_202_lists_its_errors_in_request_order() -> None:
    from collector.http.ingest import _event_errors
    from collector.ingest.model import DroppedEvent, EventIssue, PreparedBatch, RejectedEvent

    prepared = PreparedBatch(
        3, False, [], [RejectedEvent(2, "c", "validation_error", [EventIssue("$.x", "bad")])],
        [DroppedEvent(0, "a", "consent_missing")],
    )
    assert [(e["index"], e["error"]) for e in _event_errors(prepared)] == [(0, "dropped"), (2, "validation_error")]


def test_a_consent_body_names_each_unknown_choice() -> None:
    from collector.errors import ServiceError
    from collector.http.consent_body import consent_to_event

    body = b'{"visitorId":"v","consent":{"analytics":true,"identity_resolution":false,"timestamp":1}}'
    with pytest.raises(ServiceError) as refused:
        consent_to_event(body, now_ms=5, site_id="w")
    assert refused.value.code == "validation_error"
    assert refused.value.extra["details"] == [
        {"path": "$.consent.identity_resolution", "message": "Object contains unknown field `identity_resolution`"}
    ]
    known = b'{"visitorId":"v","consent":{"analytics":true,"identityResolution":false,"thirdPartySharing":true,"timestamp":1}}'
    assert b'"identityResolution":false' in consent_to_event(known, now_ms=5, site_id="w")[0]


def test_a_generated_consent_id_tells_decisions_apart_and_keeps_retries() -> None:
    from collector.http.consent_body import consent_to_event

    def eid(body: bytes) -> str:
        return str(json.loads(consent_to_event(body, now_ms=5, site_id="w")[0])["_eid"])

    grant = eid(b'{"visitorId":"v","timestamp":7,"consent":{"analytics":true,"identityResolution":true}}')
    assert grant.startswith("consent:v:7:w:") and len(grant.rsplit(":", 1)[1]) == 16
    assert grant == eid(b'{"consent":{"identityResolution":true,"analytics":true},"timestamp":7,"visitorId":"v"}')
    denial = eid(b'{"visitorId":"v","timestamp":7,"consent":{"analytics":true,"identityResolution":false}}')
    later = eid(b'{"visitorId":"v","timestamp":7.5,"consent":{"analytics":true,"identityResolution":true}}')
    assert len({grant, denial, later}) == 3
    assert len(eid(b'{"visitorId":"' + b"v" * 128 + b'","timestamp":7,"consent":{"analytics":true}}')) <= 128


def test_translated_bodies_give_the_previous_identity_only_when_it_differs() -> None:
    from collector.http.consent_body import consent_to_event
    from collector.http.edge_body import edge_to_event

    def consent_body(consent: str) -> bytes:
        return b'{"visitorId":"v","timestamp":1,"consent":' + consent.encode() + b"}"

    _, identity, legacy = consent_to_event(consent_body('{"identityResolution":false,"analytics":true}'), now_ms=5, site_id="w")
    assert legacy is not None and b'"identityResolution":false,"analytics":true' in legacy
    assert b'"analytics":true,"identityResolution":false' in identity
    _, same, none = consent_to_event(consent_body('{"analytics":true,"identityResolution":false}'), now_ms=5, site_id="w")
    assert none is None and same == identity
    edge = b'{"visitorId":"v","sessionId":"s","url":"https://a.com/","consent":{"b":1,"a":2}}'
    _, _, edge_identity, edge_legacy, _ = edge_to_event(edge, user_agent="UA", now_ms=5)
    assert edge_legacy is not None and edge_legacy != edge_identity


def test_a_consent_transition_with_an_empty_page_encodes_as_before() -> None:
    # The idempotency hash covers the event's encoding: the page of a consent transition
    # has its own type (schema.ConsentPage), and must keep its place and form, or a retry
    # of one stored before that type came would be a 409.
    from collector.ingest.content_hash import hashed_forms
    from collector.ingest.schema import AnyEvent

    sent = (b'{"type":"_consent_transition","_eid":"x","visitorId":"v","sessionId":"s","timestamp":1,'
            b'"page":{"path":"","title":""},"device":{"userAgent":"u"},"consent":{"analytics":true}}')
    event = msgspec.json.decode(sent, type=AnyEvent)
    assert hashed_forms(event)[1] == (
        b'{"type":"_consent_transition","visitorId":"v","sessionId":"s","timestamp":1,"_eid":"x",'
        b'"page":{"path":"","title":""},"device":{"userAgent":"u"},"consent":{"analytics":true}}'
    )
