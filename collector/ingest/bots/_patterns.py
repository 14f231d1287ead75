"""Known bot user agents: the `crawler-user-agents` list plus a small overlay.

Every entry becomes (compiled pattern, category). Matching one user agent
against ~1,500 regular expressions costs about half a millisecond, so a
prefilter runs first: each pattern's required literal text (taken from its
parsed form) goes into one trie-shaped regex; only when some literal occurs
in the user agent are the candidate patterns tried one by one. Patterns
without a usable literal are few and always tried.
"""

from __future__ import annotations

import functools
import re
import re._constants as sre_constants  # the documented parse tree of `re` (private but stable)
import re._parser as sre_parser
from collections.abc import Iterable
from importlib import resources
from typing import Any

import msgspec

AI_CRAWLER = "ai_crawler"
ANSWER_ENGINE = "answer_engine"
SEARCH_CRAWLER = "search_crawler"
CRAWLER = "crawler"
TOOL = "tool"
AUTOMATION = "automation"

# When several entries match one user agent, the most specific category wins:
# a named crawler built on an HTTP library ("W3C-checklink libwww-perl") is a
# crawler, not a tool.
PRIORITY = {ANSWER_ENGINE: 0, AI_CRAWLER: 1, AUTOMATION: 2, SEARCH_CRAWLER: 3, CRAWLER: 4, TOOL: 5}

# Overlay 1: entries of the package whose category we decide ourselves. The
# package tags these `ai-crawler` (or `browser-automation`, `search-engine`)
# without separating training crawlers from assistants that fetch a page
# because a person asked; those are answer engines here.
CATEGORY_OVERRIDES: dict[str, str] = {
    "ChatGPT-User": ANSWER_ENGINE,
    "Claude-User": ANSWER_ENGINE,
    "MistralAI-User": ANSWER_ENGINE,
    "Amzn-User": ANSWER_ENGINE,
    "IsonAI-User": ANSWER_ENGINE,
    "PhindBot": ANSWER_ENGINE,
    "kagi-fetcher": ANSWER_ENGINE,
    "YouBot": ANSWER_ENGINE,
    "Google-NotebookLM": ANSWER_ENGINE,
    "Manus-User": ANSWER_ENGINE,
    "meta-externalfetcher\\/": ANSWER_ENGINE,
}

# Overlay 2: package patterns that also match applications people browse with,
# replaced by a narrower pattern (or dropped: None).
PATTERN_REPLACEMENTS: dict[str, str | None] = {
    # A research crawler's name; also Slack's desktop app ("... Sonic Slack_SSB/4.41").
    "Sonic": "RankSonic|compatible; Sonic/",
    # Notion's link-preview fetcher starts with its name; Notion's desktop app,
    # which renders embedded pages, says "Mozilla/5.0 ... Notion/3.x ... Electron".
    "Notion\\/": "^Notion/",
    # Fluid is a site-specific browser: a person using a web app in its own window.
    "Fluid": None,
    # Preview fetchers that start with the app's name; the apps' own in-app
    # browsers and desktop apps (SogouMobileBrowser, "Tumblr/iOS", an Asana
    # Electron window) put the name later in a browser user agent.
    "Sogou": "Sogou[\\w -]*[Ss]pider",
    "Viber": "^Viber",
    "WhatsApp": "^WhatsApp",
    "Tumblr\\/": "^Tumblr/",
    "Asana\\/": "^Asana/",
    # GitHub's Copilot agent browses with VS Code's own Electron shell, whose user agent
    # ("... Code/1.95.3 Chrome/... Electron/...") a person browsing in VS Code sends too.
    "Code\\/1\\.": None,
}

# Overlay 3: user agents the package lacks. Libraries are anchored at the start
# of the string, where they put their name, so a browser can never match.
EXTRA_PATTERNS: tuple[tuple[str, str], ...] = (
    ("^Java/", TOOL),
    ("^PostmanRuntime/", TOOL),
    ("^insomnia/", TOOL),
    ("^node$", TOOL),  # Node's built-in fetch (undici)
    ("^undici", TOOL),
    ("^Dart/", TOOL),
    ("^Deno/", TOOL),
    ("^Bun/", TOOL),
    ("^GuzzleHttp/", TOOL),
    ("^RestSharp", TOOL),
    ("^reqwest", TOOL),
    ("^Faraday v", TOOL),
    ("^Ruby$", TOOL),
    ("libcurl/", TOOL),  # also PycURL's "PycURL/7.45.2 libcurl/8.4.0 ..."
    ("^Java-http-client/", TOOL),  # the JDK's java.net.http client
    ("^Dalvik/", TOOL),  # Android's HttpURLConnection (a WebView says Mozilla/5.0)
    ("(?:^| )CFNetwork/", TOOL),  # an iOS app's URLSession: "MyApp/1.0 CFNetwork/1410 Darwin/22.6.0"
    ("Alamofire/", TOOL),  # iOS apps' HTTP library: "AcmeApp/1.0 (...; iOS 17.4.0) Alamofire/5.9.1"
    ("Cypress/", AUTOMATION),  # the test runner's browser: "... Cypress/13.15.0 Chrome/118 Electron/27"
    ("^Apache-HttpAsyncClient/", TOOL),
    ("^http\\.rb/", TOOL),
    ("^fasthttp", TOOL),
    ("^Ktor client", TOOL),
    ("^Python-httplib2/", TOOL),
    ("^rest-client/", TOOL),
    ("^WinHttp", TOOL),
    ("PowerShell/", TOOL),
    ("^python-urllib3/", TOOL),
    ("^Typhoeus", TOOL),
    ("Meta-ExternalAgent", AI_CRAWLER),  # the capitalised spelling of the package's entry
    ("Meta-ExternalFetcher", ANSWER_ENGINE),
)


# What a client sends that has no user agent to send: no browser does.
_PLACEHOLDERS = frozenset({"", "-", "null", "undefined", "none", "unknown", "n/a"})


class _Entry(msgspec.Struct, frozen=True):
    pattern: str
    tags: list[str] = []


def category_of(pattern: str, tags: Iterable[str]) -> str:
    """Our category for a package entry: the overlay first, then its tags."""
    if pattern in CATEGORY_OVERRIDES:
        return CATEGORY_OVERRIDES[pattern]
    tags = set(tags)
    if "ai-crawler" in tags:
        return ANSWER_ENGINE if "search-engine" in tags else AI_CRAWLER
    if "browser-automation" in tags:
        return AUTOMATION
    if "search-engine" in tags:
        return SEARCH_CRAWLER
    if "http-library" in tags:
        return TOOL
    return CRAWLER


def load_entries() -> list[tuple[str, str]]:
    """(pattern, category) for every package entry and every overlay entry."""
    raw = resources.files("crawleruseragents").joinpath("crawler-user-agents.json").read_bytes()
    entries = msgspec.json.decode(raw, type=list[_Entry])
    found = []
    for entry in entries:
        pattern = PATTERN_REPLACEMENTS.get(entry.pattern, entry.pattern)
        if pattern is not None:
            found.append((pattern, category_of(entry.pattern, entry.tags)))
    return found + list(EXTRA_PATTERNS)


def _literals(parsed: Any) -> list[str] | None:
    """Literal texts, one of which every match must contain; None when unknown."""
    items = list(parsed)
    if len(items) == 1 and items[0][0] is sre_constants.BRANCH:
        found: list[str] = []
        for branch in items[0][1][1]:
            sub = _literals(branch)
            if sub is None:
                return None
            found += sub
        return found
    best, run = "", []
    for op, value in items:
        if op is sre_constants.LITERAL:
            run.append(chr(value))
            continue
        best, run = max(best, "".join(run), key=len), []
    best = max(best, "".join(run), key=len)
    return [best] if len(best) >= 3 else None


def _trie(words: Iterable[str]) -> dict[str, Any]:
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = word
    return trie


def _trie_regex(node: dict[str, Any]) -> str:
    """A regex matching any word of the trie; it stops at the shortest word."""
    if "" in node:
        return ""
    parts = [re.escape(char) + _trie_regex(child) for char, child in sorted(node.items())]
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


class PatternMatcher:
    """Finds the bot category a user agent declares, with the matched product name."""

    def __init__(self, entries: list[tuple[str, str]]) -> None:
        self._compiled = [(re.compile(p), c) for p, c in entries]
        # A product name's case carries no meaning, and bots and libraries are
        # written both ways ("FeedFetcher-Google", "Python-Requests"): when no entry
        # matches as shipped, they are tried again ignoring case. (Not at once: a
        # name would then meet more generic entries, "node-fetch" a crawler's "Fetch".)
        self._caseless = [re.compile(p, re.IGNORECASE) for p, _ in entries]
        by_literal: dict[str, list[int]] = {}
        self._always: list[int] = []
        for index, (pattern, _) in enumerate(entries):
            literals = _literals(sre_parser.parse(pattern))
            if literals is None:
                self._always.append(index)
                continue
            for literal in literals:  # (the prefilter reads the user agent lower-cased)
                by_literal.setdefault(literal.lower(), []).append(index)
        self._by_literal = by_literal
        self._trie = _trie(by_literal)
        words = _trie_regex(self._trie)
        self._prefilter = re.compile(words)
        # Zero-width, so finditer reports every position where a literal starts.
        self._starts = re.compile("(?=" + words + ")")
        self.pattern_count = len(entries)

    def match(self, user_agent: str) -> tuple[str, str] | None:
        """(category, name) of the most specific matching entry, or None."""
        user_agent = user_agent.strip()  # " curl/8.5.0" must meet "^curl"
        lowered = user_agent.lower()
        if lowered in _PLACEHOLDERS:
            return (TOOL, "placeholder")
        candidates = list(self._always)
        first = self._prefilter.search(lowered)
        for hit in self._starts.finditer(lowered, first.start()) if first else ():
            # Rare for humans: walk the trie from here to every literal starting here.
            node: dict[str, Any] | None = self._trie
            for char in lowered[hit.start():]:
                node = node.get(char) if node is not None else None
                if node is None:
                    break
                if "" in node:
                    candidates += self._by_literal[node[""]]
        unique = set(candidates)
        return self._best(user_agent, unique, caseless=False) or self._best(user_agent, unique, caseless=True)

    def _best(self, user_agent: str, candidates: set[int], *, caseless: bool) -> tuple[str, str] | None:
        best: tuple[int, str, str] | None = None
        for index in candidates:
            regex, category = self._compiled[index]
            if caseless:
                regex = self._caseless[index]
            found = regex.search(user_agent)
            if found and (best is None or PRIORITY[category] < best[0]):
                best = (PRIORITY[category], category, _name(found.group(0), regex.pattern))
        return (best[1], best[2]) if best else None


def _name(matched: str, pattern: str) -> str:
    """A short product name for the signal: the matched text unless the pattern
    could have spanned free text (a repetition), then the pattern's longest literal."""
    name = matched.strip(" /;()")
    if ("*" in pattern or "+" in pattern or not name or len(name) > 32
            or not re.fullmatch(r"[\w.\- ]+", name)):
        literals = _literals(sre_parser.parse(pattern))
        name = max(literals, key=len) if literals else re.sub(r"[^\w.\- ]", "", pattern)
    return name[:32]


@functools.cache
def default_matcher() -> PatternMatcher:
    """The package list plus overlay, compiled once per process (~0.2 s) and shared."""
    return PatternMatcher(load_entries())
