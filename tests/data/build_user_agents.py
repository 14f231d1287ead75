"""Regenerate tests/data/user_agents.csv from the installed packages (deterministic).

    .venv/bin/python tests/data/build_user_agents.py [OUT]   (default: user_agents.csv beside it)

Bots: `instances` examples shipped in crawler-user-agents (its
crawler-user-agents.json): the first example of every entry tagged
ai-crawler, http-library or browser-automation, and of every 8th other
entry; expected category from the entry's tags by the classifier's
documented mapping (`category_of`). Humans: distinct user agents from
fake-useragent's real-world browser list (data/browsers.jsonl), taken round-robin across
its browser names in descending traffic share; rows whose recorded
navigator.platform contradicts the user agent's OS are left out (they are
spoofed user agents, for example "iPhone OS 11_0" with Chrome on a "Linux
x86_64" platform). Plus the hand-written rows below.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import sys
from collections import defaultdict
from importlib import resources
from pathlib import Path

from collector.ingest.bots._agent import os_group, platform_group
from collector.ingest.bots._patterns import category_of

OUT = Path(__file__).with_name("user_agents.csv")
HUMANS = 230
HAND = "hand-written from the browser's current user-agent format"

# Current browsers (reduced user agents as the browsers send them in late 2026)
# and the e2e fixture's abbreviated Firefox user agent.
HAND_HUMANS = [
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36", "Chrome 142 Windows"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36", "Chrome 142 macOS"),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36", "Chrome 142 Linux"),
    ("Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36", "Chrome 142 ChromeOS"),
    ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Mobile Safari/537.36", "Chrome 142 Android"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/142.0.7444.46 Mobile/15E148 Safari/604.1", "Chrome 142 iOS"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36 Edg/142.0.0.0", "Edge 142 Windows"),
    ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Mobile Safari/537.36 EdgA/142.0.0.0", "Edge 142 Android"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:145.0) Gecko/20100101 Firefox/145.0", "Firefox 145 Windows"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10.15; rv:145.0) Gecko/20100101 Firefox/145.0", "Firefox 145 macOS"),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:145.0) Gecko/20100101 Firefox/145.0", "Firefox 145 Linux"),
    ("Mozilla/5.0 (Android 15; Mobile; rv:145.0) Gecko/145.0 Firefox/145.0", "Firefox 145 Android"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/145.0 Mobile/15E148 Safari/605.1.15", "Firefox 145 iOS"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/26.0 Safari/605.1.15", "Safari 26 macOS, also iPadOS Safari in its default desktop mode"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/26.0 Mobile/15E148 Safari/604.1", "Safari 26 iPhone"),
    ("Mozilla/5.0 (iPad; CPU OS 18_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/26.0 Mobile/15E148 Safari/604.1", "Safari 26 iPad, mobile-site mode"),
    ("Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/28.0 Chrome/130.0.0.0 Mobile Safari/537.36", "Samsung Internet 28 Android"),
    ("Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0", "the e2e test fixture's pageview user agent (tests/)"),
]

# Default user agents of tools and headless browsers the package has no instance of.
HAND_BOTS = [
    ("PostmanRuntime/7.43.0", "tool", "Postman's default User-Agent"),
    ("Java/17.0.12", "tool", "java.net.HttpURLConnection default User-Agent"),
    ("node", "tool", "Node.js built-in fetch (undici) default User-Agent"),
    ("Deno/2.1.4", "tool", "Deno fetch default User-Agent"),
    ("Bun/1.1.38", "tool", "Bun fetch default User-Agent"),
    ("Dart/3.5 (dart:io)", "tool", "Dart HttpClient default User-Agent"),
    ("GuzzleHttp/7", "tool", "PHP Guzzle default User-Agent"),
    ("Mozilla/5.0 (Windows NT 10.0; Microsoft Windows 10.0.22631; en-US) PowerShell/7.4.6", "tool", "PowerShell Invoke-WebRequest default User-Agent"),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/142.0.0.0 Safari/537.36", "automation", "Chrome headless mode's User-Agent"),
    ("meta-externalagent/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/crawler)", "ai_crawler", "Meta's documented crawler User-Agent"),
]


def _version(dist: str) -> str:
    return importlib.metadata.version(dist)


def bots() -> list[tuple[str, str, str, str]]:
    source = f"crawler-user-agents {_version('crawler-user-agents')} crawler-user-agents.json"
    raw = resources.files("crawleruseragents").joinpath("crawler-user-agents.json").read_bytes()
    rows, seen = [], set()
    for index, entry in enumerate(json.loads(raw)):
        if not entry.get("instances"):
            continue
        special = {"ai-crawler", "http-library", "browser-automation"} & set(entry["tags"])
        if not special and index % 8:
            continue
        user_agent = entry["instances"][0]
        if user_agent in seen:
            continue
        seen.add(user_agent)
        category = category_of(entry["pattern"], entry["tags"])
        rows.append(("bot", category, f"{source} pattern {entry['pattern']!r} instances[0]", user_agent))
    rows += [("bot", cat, f"{HAND}: {what}", ua) for ua, cat, what in HAND_BOTS]
    return rows


def humans() -> list[tuple[str, str, str, str]]:
    source = f"fake-useragent {_version('fake-useragent')} data/browsers.jsonl"
    text = resources.files("fake_useragent").joinpath("data/browsers.jsonl").read_text()
    by_browser: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
    for line_number, line in enumerate(text.splitlines(), start=1):
        row = json.loads(line)
        ua, platform = row["useragent"], row["platform"]
        group, claimed = os_group(ua), platform_group(platform)
        if group and claimed and group != claimed:
            continue
        by_browser[row["browser"]].append((-row["percent"], ua, line_number))
    queues = {name: sorted(rows) for name, rows in sorted(by_browser.items())}
    picked: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    while len(picked) < HUMANS and any(queues.values()):
        for name, queue in queues.items():
            while queue:
                _, ua, line_number = queue.pop(0)
                if ua not in seen:
                    seen.add(ua)
                    picked.append(("human", "human", f"{source} line {line_number} ({name})", ua))
                    break
            if len(picked) >= HUMANS:
                break
    picked += [("human", "human", f"{HAND}: {what}", ua) for ua, what in HAND_HUMANS]
    return picked


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    rows = bots() + humans()
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["label", "category", "source", "user_agent"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
