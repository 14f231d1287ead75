"""Bot classification: a verdict `bot.isBot` + `bot.category` for every event (spec 5.5, 6.2).

Pure: no I/O after construction, no clock. Layout: `_patterns` (the known
bot user agents), `_agent` (coarse user-agent and platform facts),
`_networks` (datacenter CIDR set), `_request` (per-request evidence),
`_classify` (the verdict).

Wiring (the ingest pipeline)::

    classifier = BotClassifier(load_cidrs(path) if path else ())  # once, at start-up
    evidence = request_evidence(headers, client_ip, classifier)
    verdict = classifier.classify(                         # once per event
        user_agent=device.userAgent,
        native=client_platform in ("ios", "android", "react-native", "server"),
        automation_score=..., automation_webdriver=..., automation_signals=...,
        device_platform=device.platform, request=evidence)
    verdict.is_bot, verdict.category, verdict.signals

`client_platform` is the value after the key-type rewrite (spec 2.4), so a
website key never counts as native. `request_evidence` runs once per request
(`headers` with lower-case names); `classify` never raises.
`BotClassifier(...)` raises ValueError for a CIDR that does not parse
(`collector.settings.load_cidrs` already names the bad line of a file).

Categories (`BotVerdict.category`; CATEGORIES lists them):

- human: no rule fired (`is_bot` False).
- search_crawler: a search engine's crawler (Googlebot, bingbot, Applebot ...).
- ai_crawler: a crawler collecting content for AI models (GPTBot, ClaudeBot,
  CCBot, Google-Extended, Bytespider, meta-externalagent ...).
- answer_engine: an AI answer engine indexing for answers, or an assistant or
  agent fetching a page because a person asked (PerplexityBot, Perplexity-User,
  ChatGPT-User, OAI-SearchBot, Claude-User, Claude-SearchBot, YouBot,
  DuckAssistBot ...).
- crawler: any other declared robot: SEO, monitoring, link previews, feed
  readers, archivers, scanners, advertising and academic crawlers.
- tool: an HTTP library or command-line tool (curl, python-requests,
  Go-http-client, axios, node-fetch, Java, Wget, PostmanRuntime ...).
- automation: a driven or disguised browser: SDK automation evidence, a
  headless or automation marker in the user agent, or a stealth contradiction.
- datacenter: the client address lies in an operator-listed datacenter network
  and nothing more specific fired.

When several rules fire the first in this order names the category, and
`signals` lists them all: declared user agent, SDK automation, stealth,
datacenter. (Spec 6.2 also names kiosk traffic; nothing on the wire marks a
kiosk, so no rule produces it.)

The rules, each with its signal label:

1. Declared user agent (`ua:<category>:<name>`; web events only). The
   `crawler-user-agents` package's patterns (case-sensitive, as shipped), its
   tags mapped to categories: ai-crawler -> ai_crawler (answer_engine when also
   tagged search-engine), browser-automation -> automation, search-engine ->
   search_crawler, http-library -> tool, everything else -> crawler. A small
   overlay in `_patterns.py` re-categorises user-triggered AI fetchers as
   answer_engine, narrows or drops the few package patterns that also match
   applications people browse with (Slack's and Notion's desktop apps, the
   Fluid site-specific browser), and adds library user agents the package
   lacks (anchored at the start of the string). The most specific category wins when several
   entries match (answer_engine, ai_crawler, automation, search_crawler,
   crawler, tool).
2. SDK automation (`sdk:*`; native events too, spec 5.5 rule 8):
   `device.automation.webdriver` true; `score` >= 80; a signal label in
   STRONG_AUTOMATION_SIGNALS (webdriver, headless, phantomjs, selenium,
   puppeteer, playwright, cdp ...). Other labels decide nothing.
3. Stealth (`stealth:*`; web events only; each needs a POSITIVE contradiction,
   a missing or unknown value never counts). OS groups are coarse on purpose:
   windows; apple (macOS and iOS together, because iPadOS Safari reports a Mac
   user agent and "MacIntel"); linux (Linux, Android, ChromeOS together,
   because Android's desktop mode reports "X11; Linux x86_64").
   - `platform`: `device.platform` (navigator.platform: Win32, MacIntel,
     iPhone, Linux armv81 ...) names a different OS group than the user agent
     (a Windows user agent with "Linux x86_64" or "iPhone"). Windows on ARM
     reports Win32 and an x64 user agent: same group.
   - `header_family`: the request's User-Agent header is itself a browser user
     agent (chromium, firefox or safari family) and the event's user agent is
     a browser of another family. A library or unknown header (an edge worker
     or backend relaying events, a test client such as python-httpx) is never
     compared. iOS browsers other than Safari and Firefox have no family.
   - `header_headless`: the request's User-Agent header is a headless browser's
     (HeadlessChrome, PhantomJS), whatever the event's user agent says.
   - `hints_brand`: Sec-CH-UA names a Chromium brand while the event's user
     agent is Firefox or Safari, which never send client hints. Chrome sends
     them only to secure origins and a beacon may carry fewer headers; their
     absence is never evidence.
   - `hints_mobile`: Sec-CH-UA-Mobile is ?1 while the user agent is a Windows
     or Mac desktop one.
   - `hints_platform`: Sec-CH-UA-Platform names a different OS group than the
     user agent.
4. Datacenter (`ip:datacenter`; web events only): the client address is in an
   operator-supplied CIDR list (setting `datacenter_cidrs_file`, loaded with
   `collector.settings.load_cidrs`). Loopback is never datacenter. List
   hosting ranges only: relay egress ranges (iCloud Private Relay, consumer
   VPNs) carry real visitors.

Native events (clientPlatform ios, android, react-native, server) are exempt
from rules 1, 3 and 4 (an app's HTTP stack, such as okhttp or CFNetwork, is
not a scraper), not from rule 2.

Cost: the patterns are compiled once per process (~0.2 s, shared by every
classifier); the user-agent part of a verdict is cached per classifier (LRU,
4,096 entries, see `statistics()`); an uncached user agent goes through a
trie prefilter of the patterns' literals before any pattern runs.
"""

from collector.ingest.bots._classify import (
    AUTOMATION_SCORE_THRESHOLD,
    DATACENTER,
    HUMAN,
    STRONG_AUTOMATION_SIGNALS,
    BotClassifier,
    BotVerdict,
    ClassifierStatistics,
)
from collector.ingest.bots._patterns import (
    AI_CRAWLER,
    ANSWER_ENGINE,
    AUTOMATION,
    CRAWLER,
    SEARCH_CRAWLER,
    TOOL,
)
from collector.ingest.bots._request import RequestEvidence, request_evidence

CATEGORIES = (HUMAN, SEARCH_CRAWLER, AI_CRAWLER, ANSWER_ENGINE, CRAWLER, TOOL, AUTOMATION, DATACENTER)

__all__ = [
    "AUTOMATION_SCORE_THRESHOLD",
    "CATEGORIES",
    "STRONG_AUTOMATION_SIGNALS",
    "BotClassifier",
    "BotVerdict",
    "ClassifierStatistics",
    "RequestEvidence",
    "request_evidence",
]
