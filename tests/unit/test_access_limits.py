"""Signature, scopes, domain gate, rates and buckets: the pure access and limit rules."""

from __future__ import annotations

import hashlib
import hmac
import json

import msgspec
import pytest

from collector.access.domains import bind_site, gate, is_loopback, request_host
from collector.access.scopes import require_scope
from collector.access.signature import sign, verify_server_signature
from collector.access.tenants import KeyRecord, Plan, TenantsFileError, parse_tenants_file
from collector.errors import ServiceError
from collector.limits.buckets import RateLimiter, rate_headers, refusal
from collector.limits.rates import bucket_id, scope_rate


def key(**fields: object) -> KeyRecord:
    return msgspec.convert({"key": "cs_live_x0000000", "clientId": "acme", **fields}, KeyRecord)


def code_of(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ServiceError) as info:
        call(*args, **kwargs)
    return info.value.code


# -- signature (spec 5.2) -------------------------------------------------------


def test_signature_is_byte_exact() -> None:
    body = b'{"type":"custom"}'
    expected = hmac.new(
        b"cs_srv_live_k", b"v1\n1700000000\nPOST\n/v1/events\nidem-1\n" + body, hashlib.sha256
    ).hexdigest()
    assert sign("cs_srv_live_k", "1700000000", "  idem-1 ", body) == "v1=" + expected
    unkeyed = hmac.new(b"k", b"v1\n1\nPOST\n/v1/events\n\n", hashlib.sha256).hexdigest()
    assert sign("k", "1", None, b"") == "v1=" + unkeyed
    # Trimmed as HTTP trims a header (spaces, tabs); a no-break space or U+3000 is part of
    # the key: str.strip() took them off, which an SDK's trim may not (helper-73).
    for key in ("\u00a0idem-1\u00a0", "\u3000idem-1", "idem-1\u0085"):
        signed = b"v1\n1\nPOST\n/v1/events\n" + key.encode() + b"\n"
        assert sign("k", "1", f" \t{key}\t ", b"") == "v1=" + hmac.new(b"k", signed, hashlib.sha256).hexdigest()


def test_signature_errors() -> None:
    body = b"{}"
    good = sign("k", "1000", None, body)
    base = {"api_key": "k", "timestamp": "1000", "signature": good, "idempotency_key": None, "body": body}
    verify_server_signature(**base, now_s=1000 + 300)
    assert code_of(verify_server_signature, **{**base, "signature": None}, now_s=1000) == "server_signature_required"
    assert code_of(verify_server_signature, **base, now_s=1000 + 301) == "server_signature_expired"
    assert code_of(verify_server_signature, **{**base, "timestamp": "1e3"}, now_s=1000) == "invalid_server_signature"
    assert code_of(verify_server_signature, **{**base, "signature": good.upper()}, now_s=1000) == "invalid_server_signature"
    assert code_of(verify_server_signature, **{**base, "body": b"{ }"}, now_s=1000) == "invalid_server_signature"
    with pytest.raises(ServiceError) as info:
        verify_server_signature(**{**base, "timestamp": ""}, now_s=1000)
    assert info.value.response_headers()["WWW-Authenticate"] == 'Service-HMAC realm="events", version=v1'
    # A timestamp in milliseconds never passes, however fresh: the message says why
    # (it said "re-sign with the current time", which an SDK signing in ms already did).
    now = 1_795_600_000.0
    with pytest.raises(ServiceError) as info:
        verify_server_signature(**{**base, "timestamp": str(int(now * 1000))}, now_s=now)
    assert info.value.code == "server_signature_expired" and "reads as milliseconds" in info.value.message
    with pytest.raises(ServiceError) as info:
        verify_server_signature(**{**base, "timestamp": str(int(now) - 400)}, now_s=now)
    assert "more than five minutes" in info.value.message


# -- scopes (spec 5.3) ------------------------------------------------------------


def test_scopes() -> None:
    require_scope(key(), "events:write", error_code="insufficient_permission")
    require_scope(key(permissions=["events:write"]), "events:write", error_code="insufficient_permission")
    assert code_of(require_scope, key(permissions=["events:read"]), "events:write",
                   error_code="insufficient_permission") == "insufficient_permission"


# -- domain gate (spec 5.5) -----------------------------------------------------------

ACME = key(sites=[{"siteId": "web", "domains": ["acme.com"]}])


@pytest.mark.parametrize(
    ("origin", "referer", "host"),
    [
        ("https://acme.com", None, "acme.com"),
        ("https://ACME.com:8443", None, "acme.com"),
        (None, "https://www.acme.com/pricing?x=1", "www.acme.com"),
        ("null", "https://acme.com/", "acme.com"),
        ("http://[::1]:3000", None, "::1"),
        (None, None, None),
    ],
)
def test_request_host(origin: str | None, referer: str | None, host: str | None) -> None:
    assert request_host(origin, referer) == host


def test_loopback_hosts() -> None:
    assert all(map(is_loopback, ["localhost", "app.localhost", "127.0.0.1", "127.9.9.9", "::1"]))
    assert not any(map(is_loopback, ["localhost.evil.com", "10.0.0.1", "acme.com"]))


def test_domain_covers_subdomains_with_a_dot_boundary() -> None:
    assert gate(ACME, "https://acme.com", None).siteId == "web"
    assert gate(ACME, "https://shop.eu.acme.com", None).siteId == "web"
    assert code_of(gate, ACME, "https://evilacme.com", None) == "domain_not_allowed"
    assert code_of(gate, ACME, "https://acme.com.evil.net", None) == "domain_not_allowed"
    assert code_of(gate, ACME, None, None) == "origin_required"
    assert gate(ACME, None, "https://acme.com/a/b") is not None


def test_wildcard_prefix_is_stripped_and_adds_nothing() -> None:
    wild = key(sites=[{"siteId": "w", "domains": ["*.acme.com"]}])
    assert gate(wild, "https://acme.com", None).siteId == "w"
    assert gate(wild, "https://a.acme.com", None).siteId == "w"


def test_subdomain_registration_follows_the_root_domain() -> None:
    shop = key(sites=[{"siteId": "s", "domains": ["shop.example.co.uk"]}])
    assert gate(shop, "https://example.co.uk", None).siteId == "s"
    assert gate(shop, "https://blog.example.co.uk", None).siteId == "s"
    assert code_of(gate, shop, "https://other.co.uk", None) == "domain_not_allowed"
    assert code_of(gate, shop, "https://co.uk", None) == "domain_not_allowed"


def test_loopback_passes_the_gate() -> None:
    assert gate(ACME, "http://localhost:3000", None) is None
    assert gate(ACME, "http://[::1]:8080", None) is None


def test_native_keys_skip_the_gate() -> None:
    mobile = key(keyType="mobile", sites=[{"siteId": "app"}])
    assert gate(mobile, None, None).siteId == "app"
    assert gate(mobile, "https://evil.com", None).siteId == "app"


def test_site_scope() -> None:
    multi = key(sites=[
        {"siteId": "main", "domains": ["acme.com"]},
        {"siteId": "shop", "domains": ["shop.acme.com"]},
        {"siteId": "blog", "domains": ["acmeblog.org"]},
    ])
    assert gate(multi, "https://shop.acme.com", None).siteId == "shop"  # most specific wins
    assert gate(multi, "https://www.acme.com", None).siteId == "main"
    assert code_of(bind_site, multi, gate(multi, "http://localhost", None)) == "site_scope_ambiguous"
    assert bind_site(ACME, None).siteId == "web"
    assert bind_site(key(), None).siteId == "default"


# -- rates (spec 8.2) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "scope", "site_plan", "rate"),
    [
        ({"plan": "free", "rateLimit": 1000}, "ingest", Plan.FREE, 100),
        ({"plan": "paid", "rateLimit": 10_000}, "ingest", Plan.PAID, 5_000),
        ({"plan": "free", "keyType": "mobile", "rateLimit": 1000}, "mobile:ingest", Plan.FREE, 50),
        ({"plan": "paid", "keyType": "mobile", "rateLimit": 10_000}, "mobile:ingest", Plan.PAID, 2_500),
        ({"plan": "paid", "keyType": "server", "rateLimit": 10_000}, "ingest", Plan.PAID, 2_500),
        ({"plan": "paid"}, "ingest", Plan.PAID, 50),
        ({"plan": "paid", "rateLimit": 1}, "ingest", Plan.PAID, 1),
        ({"plan": "paid", "rateLimit": 5000}, "signals-read", Plan.FREE, 10),
        ({"plan": "free", "rateLimit": 5000}, "signals-read", Plan.PAID, 100 * 50),
        # mobile and server: the lower of half the package rate (floor 50) and the scope rate
        ({"plan": "free", "keyType": "mobile", "rateLimit": 5000}, "signals-read", Plan.FREE, 10),
        ({"plan": "free", "keyType": "server", "rateLimit": 5000}, "signals-read", Plan.FREE, 10),
        ({"plan": "paid", "keyType": "mobile", "rateLimit": 10_000}, "signals-read", Plan.PAID, 2_500),
        ({"plan": "paid", "keyType": "mobile", "rateLimit": 10_000}, "signals-read", Plan.FREE, 10),
    ],
)
def test_scope_rates(fields: dict[str, object], scope: str, site_plan: Plan, rate: float) -> None:
    assert scope_rate(key(**fields), scope, site_plan) == min(rate, fields.get("rateLimit", 50))  # type: ignore[type-var]


def test_bucket_ids_are_shared_by_type_and_scope() -> None:
    assert bucket_id("acme", "browser", "ingest") == "acme:browser:ingest"


# -- buckets ------------------------------------------------------------------------------


def test_bucket_edges_for_rate_1() -> None:
    limiter = RateLimiter()
    decisions = [limiter.check("b", 1, 600.0 + i * 0.1) for i in range(121)]
    assert all(d.allowed for d in decisions[:120])
    first = decisions[0]
    assert (first.limit, first.burst_limit, first.remaining, first.burst_remaining) == (60, 120, 59, 119)
    assert decisions[59].remaining == 0 and decisions[60].allowed  # the burst allowance
    refused = decisions[120]
    assert not refused.allowed
    assert (refused.remaining, refused.burst_remaining, refused.reset) == (0, 0, 660)
    assert refused.retry_after == 48  # 660 - 612.0
    # next window: the previous one took 2x, so only the plain minute limit is left
    nxt = [limiter.check("b", 1, 660.0 + i * 0.01) for i in range(61)]
    assert all(d.allowed for d in nxt[:60]) and not nxt[60].allowed
    # after a quiet minute the burst is available again
    later = [limiter.check("b", 1, 780.0) for _ in range(121)]
    assert sum(d.allowed for d in later) == 120


def test_a_wall_clock_stepped_back_locks_no_key_out() -> None:
    # helper-112: carrying a bucket's counts into the earlier minute of a step back
    # locked out a key that had been idle since (429 with nothing sent). A step back is
    # a new minute for the bucket (a fresh burst: the lesser harm, README).
    limiter = RateLimiter()
    assert sum(limiter.check("b", 1, 600.0).allowed for _ in range(125)) == 120
    assert limiter.check("b", 1, 730.0 - 86_400).allowed  # idle 130 s, then a day back
    assert limiter.check("b", 1, 540.0).allowed  # a minute back: a new minute too


def test_retry_after_is_at_least_one_second() -> None:
    limiter = RateLimiter()
    for _ in range(120):
        limiter.check("x", 1, 659.5)
    assert limiter.check("x", 1, 659.9).retry_after == 1


def test_buckets_are_separate_and_idle_ones_evicted() -> None:
    limiter = RateLimiter(shards=1, sweep_above=10)
    for n in range(10):
        limiter.check(f"k{n}", 1, 0.0)
    assert limiter.statistics().buckets == 10
    limiter.check("new", 1, 200.0)  # windows 0 is two windows old now
    assert limiter.statistics().buckets == 1


def test_partitions_split_the_limit_rounding_up() -> None:
    """`serve --workers 3`: each worker holds ceil(60 / 3) = 20 per minute, burst 40."""
    workers = [RateLimiter(partitions=3) for _ in range(3)]
    first = workers[0].check("p", 1, 600.0)
    # headers state the key-wide policy; remaining is this partition's remainder times N
    assert (first.limit, first.burst_limit) == (60, 120)
    assert (first.remaining, first.burst_remaining) == (57, 117)
    taken = 1 + sum(workers[0].check("p", 1, 600.0).allowed for _ in range(100))
    assert taken == 40  # the partition's burst: 2 x 20
    # uneven split: 61 per minute in 2 partitions is 31 each, sum 62 >= 61
    assert sum(RateLimiter(partitions=2).check("q", 61 / 60, 0.0).allowed for _ in range(31)) == 31
    odd = RateLimiter(partitions=2)
    for _ in range(31):
        odd.check("q", 61 / 60, 0.0)
    assert odd.check("q", 61 / 60, 0.0).remaining == 0
    # rounding up: a limit smaller than N still gives every partition one request
    tiny = RateLimiter(partitions=4).check("t", 1 / 60, 0.0)
    assert tiny.allowed and tiny.limit == 1 and tiny.remaining == 0
    # the partitions' bursts sum to the key-wide burst plus at most N - 1: limit 3
    # (burst 6) in 2 partitions is 2 a minute and a burst of 3 each (audit helper-42:
    # twice the rounded-up limit, 4 each, let an idle key take 8 at once)
    pair = [RateLimiter(partitions=2) for _ in range(2)]
    assert sum(w.check("b", 3 / 60, 0.0).allowed for w in pair for _ in range(10)) == 6


def test_rate_headers_and_refusal() -> None:
    limiter = RateLimiter()
    decision = limiter.check("h", 100, 0.0)
    headers = dict(rate_headers(decision, "mobile:ingest"))
    assert headers["X-RateLimit-Limit"] == "6000"
    assert headers["X-RateLimit-Burst-Limit"] == "12000"
    assert headers["X-RateLimit-Policy"] == "6000;w=60;burst=2"
    assert headers["X-RateLimit-Scope"] == "ingest"
    assert headers["X-RateLimit-Unit"] == "requests"
    assert "Retry-After" not in headers
    for _ in range(12_000):
        limiter.check("h", 100, 1.0)
    refused = limiter.check("h", 100, 1.0)
    error = refusal(refused, "ingest")
    assert error.code == "rate_limit_exceeded" and error.extra["retryAfter"] == 59
    assert dict(rate_headers(refused, "ingest"))["Retry-After"] == "59"


@pytest.mark.parametrize("bad", ["\x00", "\x1b", "\x7f", "\u009b", "\u2028"])
def test_tenant_ids_with_control_characters_are_refused(bad: str) -> None:
    # helper-109: a clientId holding U+009B or U+2028 went raw into every access line
    # (only NUL was refused, for the storage keys it separates)
    record = {"key": "cs_live_ctl00000000", "clientId": f"ev{bad}il", "plan": "paid",
              "sites": [{"siteId": "web", "domains": ["a.com"]}]}
    with pytest.raises(TenantsFileError) as refused:
        parse_tenants_file(json.dumps({"keys": [record]}).encode())
    assert f"a control character (U+{ord(bad):04X})" in str(refused.value) and "keys[0].clientId" in str(refused.value)
    parse_tenants_file(json.dumps({"keys": [{**record, "clientId": "évil ☃"}]}).encode())  # other text is fine


@pytest.mark.parametrize("bad", ["\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\u00ad"])
def test_tenant_ids_with_invisible_format_characters_are_refused(bad: str) -> None:
    # helper-111: a bidi control reorders the rest of an access line as it is shown, and
    # with a zero-width character two ids that read the same are different tenants.
    record = {"key": "cs_live_fmt00000000", "clientId": "acme", "plan": "paid",
              "sites": [{"siteId": f"we{bad}b", "domains": ["a.com"]}]}
    with pytest.raises(TenantsFileError) as refused:
        parse_tenants_file(json.dumps({"keys": [record]}).encode())
    message = str(refused.value)
    assert f"an invisible format character (U+{ord(bad):04X})" in message and "sites[0].siteId" in message
    parse_tenants_file(json.dumps({"keys": [{**record, "sites": [{"siteId": "w\u00a0b", "domains": ["a.com"]}]}]}).encode())
