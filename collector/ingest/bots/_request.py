"""Evidence read once per HTTP request: headers and client address."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from collector.ingest.bots._agent import browser_family, hint_platform_group

if TYPE_CHECKING:
    from collector.ingest.bots._classify import BotClassifier

# A headless browser names itself in the User-Agent header it sends ("HeadlessChrome/131",
# and so counts as the chromium family: helper-138 found one whose body said Chrome stored
# as a person). Only the browser's own header says it: the event's user agent may be
# rewritten by the script that drives it.
_HEADLESS_HEADER = re.compile(r"HeadlessChrome/|PhantomJS/")
# Every Chromium-based browser lists its engine brand, most also their own.
_CHROMIUM_BRANDS = ('"Chromium"', '"Google Chrome"', '"Microsoft Edge"')


class RequestEvidence(msgspec.Struct, frozen=True):
    """What one request says about every event it carries.

    Each field is None (or False) when the request does not say: a missing
    header is never evidence.
    """

    header_family: str | None = None  # browser family of a browser User-Agent header
    header_headless: bool = False  # the User-Agent header is a headless browser's (HeadlessChrome, PhantomJS)
    hints_chromium: bool = False  # Sec-CH-UA names a Chromium brand
    hints_mobile: bool | None = None  # Sec-CH-UA-Mobile: ?1 True, ?0 False
    hints_platform: str | None = None  # OS group of Sec-CH-UA-Platform
    datacenter: bool = False  # the client address lies in an operator-listed network


NO_EVIDENCE = RequestEvidence()


def request_evidence(
    headers: Mapping[str, str], client_ip: str | None, classifier: BotClassifier
) -> RequestEvidence:
    """Read the request once; `headers` has lower-case names. Never raises."""
    user_agent = headers.get("user-agent")
    # A library or unknown User-Agent header (an edge worker or a backend
    # relaying events, a test client) has no family and is never compared.
    family = browser_family(user_agent) if user_agent else None
    brands = headers.get("sec-ch-ua", "")
    mobile = headers.get("sec-ch-ua-mobile", "").strip()
    platform = headers.get("sec-ch-ua-platform")
    datacenter = client_ip is not None and classifier.is_datacenter(client_ip)
    evidence = RequestEvidence(
        header_family=family,
        header_headless=user_agent is not None and _HEADLESS_HEADER.search(user_agent) is not None,
        hints_chromium=any(brand in brands for brand in _CHROMIUM_BRANDS),
        hints_mobile=True if mobile == "?1" else False if mobile == "?0" else None,
        hints_platform=hint_platform_group(platform) if platform else None,
        datacenter=datacenter,
    )
    return NO_EVIDENCE if evidence == NO_EVIDENCE else evidence
