"""Coarse facts read from a user-agent string and a navigator.platform value.

Only what the stealth heuristics compare: the browser family (which engine
sends client hints), the operating-system group, and whether the agent is a
desktop one. Each answer is None when the string does not say clearly;
an unknown never counts as a contradiction.
"""

from __future__ import annotations

# Operating-system groups. macOS and iOS share one group because iPadOS Safari
# presents itself as a Mac ("Macintosh" UA, navigator.platform "MacIntel");
# Android, ChromeOS and desktop Linux share one because Android's "request
# desktop site" reports "X11; Linux x86_64" and ChromeOS reports "Linux x86_64".
WINDOWS = "windows"
APPLE = "apple"
LINUX = "linux"

# Browser families.
CHROMIUM = "chromium"  # sends Sec-CH-UA client hints (on secure origins)
FIREFOX = "firefox"  # never sends client hints
SAFARI = "safari"  # never sends client hints


def os_group(user_agent: str) -> str | None:
    """The OS group a user agent names; None when it names none or several."""
    found = set()
    if "Windows" in user_agent:
        found.add(WINDOWS)
    if "Macintosh" in user_agent or "iPhone" in user_agent or "iPad" in user_agent \
            or "iPod" in user_agent or "Mac OS X" in user_agent:
        found.add(APPLE)
    if "Linux" in user_agent or "Android" in user_agent or "CrOS" in user_agent:
        found.add(LINUX)
    return found.pop() if len(found) == 1 else None


def browser_family(user_agent: str) -> str | None:
    """chromium, firefox or safari when the user agent says so plainly; else None.

    Browsers on iOS other than Safari and Firefox (CriOS, EdgiOS, in-app
    views) are WebKit wearing another name: None, so nothing is compared.
    """
    if "Firefox/" in user_agent or "FxiOS/" in user_agent:
        return None if "Chrome/" in user_agent else FIREFOX
    if "Chrome/" in user_agent or "Chromium/" in user_agent:
        return CHROMIUM if "iPhone" not in user_agent and "iPad" not in user_agent else None
    if ("Version/" in user_agent and "Safari/" in user_agent and "Android" not in user_agent
            and "CriOS" not in user_agent and "EdgiOS" not in user_agent):
        return SAFARI
    return None


def is_desktop(user_agent: str) -> bool:
    """True only for a Windows or Mac desktop user agent (a phone never reports these)."""
    group = os_group(user_agent)
    if group == WINDOWS:
        return "Windows Phone" not in user_agent and "Mobile" not in user_agent
    return "Macintosh" in user_agent


def platform_group(platform: str) -> str | None:
    """The OS group of a navigator.platform value ("Win32", "MacIntel", "iPhone", "Linux armv81")."""
    if platform.startswith("Win"):
        return WINDOWS
    if platform.startswith(("Mac", "iPhone", "iPad", "iPod")):
        return APPLE
    if platform.startswith(("Linux", "Android", "CrOS")):
        return LINUX
    return None


def hint_platform_group(value: str) -> str | None:
    """The OS group of a Sec-CH-UA-Platform value such as '"Windows"'."""
    return _HINT_PLATFORMS.get(value.strip().strip('"'))


_HINT_PLATFORMS = {
    "Windows": WINDOWS,
    "macOS": APPLE,
    "iOS": APPLE,
    "Android": LINUX,
    "Linux": LINUX,
    "Chrome OS": LINUX,
    "Chromium OS": LINUX,
}
