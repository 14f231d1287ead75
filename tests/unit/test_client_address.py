"""The visitor's address behind trusted proxies: X-Forwarded-For entries with and without ports."""

from __future__ import annotations

import pytest

from collector.http.client_address import TrustedProxies, address_of


@pytest.mark.parametrize(
    ("entry", "address"),
    [("203.0.113.5", "203.0.113.5"), (" 203.0.113.5:8080 ", "203.0.113.5"), ("2001:db8::1", "2001:db8::1"),
     ("[2001:db8::1]:443", "2001:db8::1"), ("[2001:db8::1]", "2001:db8::1"), ("unknown", None), ("", None),
     ("_hidden", None), ("1.2.3.4:x:y", None)],
)
def test_address_of(entry: str, address: str | None) -> None:
    assert address_of(entry) == address


def test_the_right_most_untrusted_entry_is_the_visitor() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client_address("10.0.0.1", "198.51.100.7, 203.0.113.5:1234, 10.0.0.2") == "203.0.113.5"
    # an entry that is no address leaves the visitor unknown, never the proxy
    assert proxies.client_address("10.0.0.1", "198.51.100.7, unknown") is None
    # from an untrusted peer the header means nothing
    assert proxies.client_address("192.0.2.1", "203.0.113.5") == "192.0.2.1"


def test_an_ipv6_listeners_mapped_ipv4_peers_and_hops_are_trusted_as_ipv4() -> None:
    # On an IPv6 socket an IPv4 peer reads ::ffff:a.b.c.d, which matched no IPv4
    # network: X-Forwarded-For was ignored, and datacenter visitors judged by the
    # balancer's address (helper-74).
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.trusted("::ffff:10.0.0.1") and not proxies.trusted("::ffff:192.0.2.1")
    assert proxies.client_address("::ffff:10.0.0.1", "203.0.113.5, ::ffff:10.0.0.2") == "203.0.113.5"
    # ... and networks written in the mapped form match too (helper-76)
    for written in ("::ffff:10.0.0.0/104", "::ffff:10.0.0.1/128"):
        mapped = TrustedProxies([written])
        assert mapped.trusted("::ffff:10.0.0.1") and mapped.trusted("10.0.0.1") and not mapped.trusted("::1")
