"""Domain gating and site scope for website keys (spec 5.5).

A registered domain covers itself and its subdomains, with a dot as the
boundary (`evilacme.com` never matches `acme.com`); a leading `*.` is
stripped; both sides are compared in IDNA form (`hostnames.py`). A domain registered with a subdomain host (`shop.example.co.uk`)
also covers its apex and siblings: matching follows the registrable root
from the Public Suffix List (`example.co.uk`). Loopback hosts always pass.
"""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit

from publicsuffixlist import PublicSuffixList

from collector.access.hostnames import ascii_host, ip_literal, normalize_domain, utf8_header
from collector.access.tenants import KeyRecord, KeyType, Site
from collector.errors import ServiceError

_PSL = PublicSuffixList()
DEFAULT_SITE = Site(siteId="default")


@functools.lru_cache(maxsize=65536)
def registrable_root(host: str) -> str:
    return _PSL.privatesuffix(host) or host


# Requests repeat the same few Origin values: their parsed hosts and loopback
# verdicts are cached (pure functions of the header text; short values only).
_CACHED_HEADER_MAX = 512


def request_host(origin: str | None, referer: str | None) -> str | None:
    """The browser's host from Origin (preferred) or Referer; None when neither is usable."""
    if (origin is None or len(origin) <= _CACHED_HEADER_MAX) and (
        referer is None or len(referer) <= _CACHED_HEADER_MAX
    ):
        return _cached_request_host(origin, referer)
    return _request_host(origin, referer)


def _request_host(origin: str | None, referer: str | None) -> str | None:
    for value in (origin, referer):
        if not value or value.strip().lower() == "null":
            continue
        try:
            host = urlsplit(utf8_header(value.strip())).hostname
        except ValueError:
            continue
        if host:
            return ascii_host(host)
    return None


_cached_request_host = functools.lru_cache(maxsize=1024)(_request_host)


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _matches(host: str, domain: str) -> bool:
    return host == domain or host.endswith("." + domain)


def _site_score(site: Site, host: str) -> int:
    """How specifically a site's domains cover `host`: 0 for not at all."""
    best = 0
    address = ip_literal(host)
    for raw in site.domains:
        domain = normalize_domain(raw)
        if not domain:
            continue
        if host == domain or (address is not None and address == domain):
            best = max(best, 10_000)
        elif address is not None or ip_literal(domain) is not None:
            continue  # an IP address matches itself only (its "root" by the suffix list is nonsense)
        elif _matches(host, domain):
            best = max(best, 1_000 + len(domain))
        else:
            root = registrable_root(domain)
            if root != domain and _matches(host, root):
                best = max(best, len(root))
    return best


_LONGEST_HOST = 253  # characters of a DNS name


def match_site(key: KeyRecord, host: str) -> Site | None:
    scored = [(score, site) for site in key.sites if (score := _site_score(site, host))]
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def gate(key: KeyRecord, origin: str | None, referer: str | None) -> Site | None:
    """Apply the domain gate; the matched site, or None when the request passes unmatched."""
    if key.key_type is not KeyType.BROWSER:
        return key.sites[0] if len(key.sites) == 1 else None
    host = request_host(origin, referer)
    configured = any(site.domains for site in key.sites)
    if not configured:
        return match_site(key, host) if host else None
    if host is None:
        if origin or referer:  # (sent, but names no host: "acme.com" without a scheme, "null")
            raise ServiceError(
                "origin_required",
                "this key only accepts requests whose Origin or Referer names a host"
                " (a URL such as https://example.com; the one sent names none)",
            )
        raise ServiceError("origin_required", "this key only accepts requests with an Origin or Referer")
    if is_loopback(host):
        return match_site(key, host)
    site = match_site(key, host)
    if site is None:
        # (a host longer than DNS allows is cut: helper-136 had a 40 KB one repeated back)
        shown = host if len(host) <= _LONGEST_HOST else host[:_LONGEST_HOST] + "…"
        raise ServiceError("domain_not_allowed", f"{shown} is not a registered domain of this key")
    return site


def bind_site(key: KeyRecord, matched: Site | None) -> Site:
    """Site scope: the matched property, or the only one; several unmatched is ambiguous."""
    if matched is not None:
        return matched
    if len(key.sites) == 1:
        return key.sites[0]
    if not key.sites:
        return DEFAULT_SITE
    raise ServiceError(
        "site_scope_ambiguous",
        "this key covers several properties and the request matches none of them",
    )


def forwarded_site(key: KeyRecord, origin: str | None, referer: str | None) -> Site | None:
    """POST /v1/edge/pageview: the browser gate and site scope when Origin or Referer is present.

    None when neither header was sent (an edge worker): bind_page_site decides.
    """
    if origin is None and referer is None:
        return None
    try:
        return bind_site(key, gate(key, origin, referer))
    except ServiceError as error:
        error.key_record = key  # an authenticated refusal: it carries the rate headers
        raise


def bind_page_site(key: KeyRecord, page_url: str) -> Site:
    """Site scope without the browser gate (an edge worker's pageview): match the page's host.

    No match on a key with several properties is site_scope_ambiguous, as for
    every write (spec 5.5 rule 5).
    """
    host = request_host(page_url, None)
    return bind_site(key, match_site(key, host) if host else None)
