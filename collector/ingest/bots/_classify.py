"""The verdict for one event: user agent, SDK automation evidence, request evidence."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import msgspec

from collector.ingest.bots import _agent as agent
from collector.ingest.bots._networks import NetworkSet
from collector.ingest.bots._patterns import AUTOMATION, default_matcher
from collector.ingest.bots._request import RequestEvidence

HUMAN = "human"
DATACENTER = "datacenter"

# SDK automation score at or above this is automation (0 to 100; spec 2.2).
AUTOMATION_SCORE_THRESHOLD = 80.0

# SDK signal labels that are automation on their own (compared lower-cased,
# "-" read as "_"). Other labels are kept by the pipeline but decide nothing:
# weak hints (no plugins, empty language list) fire on real phones too.
STRONG_AUTOMATION_SIGNALS = frozenset({
    "webdriver", "headless", "headless_chrome", "phantomjs", "phantom", "nightmare",
    "selenium", "chromedriver", "geckodriver", "puppeteer", "playwright", "cdp",
    "dom_automation", "cypress",
})
# A label as written in any case and with any separator ("HeadlessChrome", "headless-chrome").
_LABELS_UNSEPARATED = {label.replace("_", ""): label for label in STRONG_AUTOMATION_SIGNALS}


class BotVerdict(msgspec.Struct, frozen=True):
    is_bot: bool
    category: str  # "human", or one of the categories in the package docstring
    signals: tuple[str, ...] = ()  # short non-personal labels of the evidence that fired


HUMAN_VERDICT = BotVerdict(False, HUMAN)


class ClassifierStatistics(msgspec.Struct, frozen=True):
    patterns: int  # user-agent patterns (package plus overlay)
    datacenter_networks: int  # disjoint ranges after merging
    cache_size: int
    cache_hits: int
    cache_misses: int


class _AgentFacts(msgspec.Struct, frozen=True):
    declared: tuple[str, str] | None  # (category, name) from the pattern list
    family: str | None
    os_group: str | None
    desktop: bool


class BotClassifier:
    """Built once at start-up (patterns compiled, networks sorted); `classify` is pure.

    Raises ValueError from the constructor when a datacenter CIDR does not parse.
    """

    def __init__(self, datacenter_cidrs: Iterable[str] = ()) -> None:
        self._networks = NetworkSet(datacenter_cidrs)
        self._matcher = default_matcher()
        # Per-instance bounded cache of the user-agent-only work.
        self._facts = functools.lru_cache(maxsize=4096)(self._agent_facts)

    def statistics(self) -> ClassifierStatistics:
        info = self._facts.cache_info()
        return ClassifierStatistics(self._matcher.pattern_count, self._networks.size,
                                    info.currsize, info.hits, info.misses)

    def is_datacenter(self, client_ip: str) -> bool:
        """True when the address is in a listed network; loopback and unparsable: False."""
        return client_ip in self._networks

    def _agent_facts(self, user_agent: str) -> _AgentFacts:
        return _AgentFacts(
            declared=self._matcher.match(user_agent),
            family=agent.browser_family(user_agent),
            os_group=agent.os_group(user_agent),
            desktop=agent.is_desktop(user_agent),
        )

    def classify(
        self,
        *,
        user_agent: str | None,
        native: bool,
        automation_score: float | None = None,
        automation_webdriver: bool | None = None,
        automation_signals: Sequence[str] | None = None,
        device_platform: str | None = None,
        request: RequestEvidence | None = None,
    ) -> BotVerdict:
        """One event's verdict. `native`: clientPlatform ios, android, react-native or server.

        Native events are judged on SDK automation evidence only (spec 5.5
        rules 7-8). The first category found in this order wins: declared
        user agent, SDK automation, stealth contradiction, datacenter address.
        """
        categories: list[str] = []
        signals: list[str] = []
        facts = self._facts(user_agent) if user_agent and not native else None
        if facts is not None and facts.declared is not None:
            category, name = facts.declared
            categories.append(category)
            signals.append(f"ua:{category}:{name}")
        sdk = _automation_signals(automation_score, automation_webdriver, automation_signals)
        if sdk:
            categories.append(AUTOMATION)
            signals += sdk
        if facts is not None:
            stealth = _stealth_signals(facts, device_platform, request)
            if stealth:
                categories.append(AUTOMATION)
                signals += stealth
        if not native and request is not None and request.datacenter:
            categories.append(DATACENTER)
            signals.append("ip:datacenter")
        if not categories:
            return HUMAN_VERDICT
        return BotVerdict(True, categories[0], tuple(signals))


def _automation_signals(
    score: float | None, webdriver: bool | None, labels: Sequence[str] | None
) -> list[str]:
    found = []
    if webdriver:
        found.append("sdk:webdriver")
    if score is not None and score >= AUTOMATION_SCORE_THRESHOLD:
        found.append("sdk:score")
    for label in labels or ():
        normal = _LABELS_UNSEPARATED.get(label.strip().lower().replace("-", "").replace("_", "").replace(" ", ""))
        if normal is not None:
            found.append(f"sdk:signal:{normal}")
    return found


def _stealth_signals(
    facts: _AgentFacts, platform: str | None, request: RequestEvidence | None
) -> list[str]:
    """Positive contradictions between the event's user agent and other evidence."""
    found = []
    if platform and facts.os_group:
        group = agent.platform_group(platform)
        if group is not None and group != facts.os_group:
            found.append("stealth:platform")
    if request is None:
        return found
    if request.header_family and facts.family and request.header_family != facts.family:
        found.append("stealth:header_family")
    if request.header_headless:
        found.append("stealth:header_headless")
    if request.hints_chromium and facts.family in (agent.FIREFOX, agent.SAFARI):
        found.append("stealth:hints_brand")
    if request.hints_mobile and facts.desktop:
        found.append("stealth:hints_mobile")
    if request.hints_platform and facts.os_group and request.hints_platform != facts.os_group:
        found.append("stealth:hints_platform")
    return found
