"""Host names as browsers put them on the wire: lower case, IDNA (punycode), no trailing dot.

A registered domain is written by a person (`münchen.de`, `*.Acme.com.`); an
Origin or Referer carries the host as the browser's URL parser encoded it
(`xn--mnchen-3ya.de`). Both sides go through `ascii_host` before they meet.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re

import idna

_LABELS = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")


@functools.lru_cache(maxsize=4096)
def ascii_host(host: str) -> str:
    """`host` lower-cased and IDNA-encoded; unchanged (but lower-cased) when it cannot be encoded."""
    host = host.strip().rstrip(".").lower()
    if host.isascii():
        return host
    try:
        # UTS 46 non-transitional, as browsers' URL parsers: "straße.de" is
        # xn--strae-oqa.de (the stdlib's IDNA 2003 codec would say strasse.de).
        return idna.encode(host, uts46=True, transitional=False).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        pass
    try:
        # What IDNA 2008 refuses and browsers still encode (an emoji label: ☃.net).
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def utf8_header(value: str) -> str:
    """A header value as sent. Headers arrive decoded as Latin-1: UTF-8 bytes are re-read as UTF-8."""
    if not value.isascii():
        with contextlib.suppress(UnicodeEncodeError, UnicodeDecodeError):
            return value.encode("latin-1").decode("utf-8")
    return value


def is_utf8_header(value: str) -> bool:
    """Whether a header value (read as Latin-1) was sent as UTF-8 bytes (ASCII is).

    utf8_header re-reads such bytes (and a multi-byte character re-read is
    fewer characters), or gives the value back when they are not UTF-8.
    """
    return value.isascii() or utf8_header(value) != value


def normalize_domain(domain: str) -> str:
    """A registered domain as it is matched: a leading `*.` adds nothing (spec 5.5 rule 2).

    An IP address is written as a URL parser gives it (no brackets, canonical form).
    """
    domain = domain.strip()
    host = ascii_host(domain[2:] if domain.startswith("*.") else domain)
    return ip_literal(host) or host


@functools.lru_cache(maxsize=4096)
def ip_literal(host: str) -> str | None:
    """The canonical text of `host` when it is an IP address (brackets allowed), else None.

    An address has no subdomains, apex or siblings: it matches itself only.
    """
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def domain_problem(domain: str) -> str | None:
    """Why a registered domain could never match a browser's host, or None when it can."""
    normalized = normalize_domain(domain)
    if not normalized:
        return "is empty"
    if _LABELS.fullmatch(normalized) or ip_literal(normalized):
        return None
    return "is not a host name (write it without scheme, port or path, for example acme.com)"
