"""The visitor snapshot (VisitorContext, spec 2.6) from a visitor record: pure.

The spec names coverageMode, pending, stale, behavioralClass, bot.isBot,
bot.category, scores.frustration and scores.conversionReadiness; the rest
of the shape and every formula here are ours (README, "Visitor snapshots").
"""

from __future__ import annotations

from typing import Any

from storage.visitors import VisitorRecord, VisitorView, current_page

STALE_AFTER_MS = 30 * 60 * 1000  # the client session idle window (spec 8.5)
SUSPICIOUS_FROM = 25  # bot score at which a visitor that is not a bot is suspicious
NEUTRAL_CONFIDENCE = 50  # spec 2.6: native and server sessions


def bot_score(record: VisitorRecord) -> int:
    """The share of the visitor's verdict-carrying events judged bot, 0-100."""
    return round(100 * record.bot_events / record.events) if record.events else 0


def behavioral_class(record: VisitorRecord) -> str:
    if record.is_bot:
        return "bot"
    return "suspicious" if bot_score(record) >= SUSPICIOUS_FROM else "human"


def human_confidence(record: VisitorRecord) -> int:
    # Spec 2.6: behaviour is not observed in native or server sessions, so
    # their human-confidence is fixed at a neutral 50. The share is taken over
    # the events counted by type: a record folded before types were kept
    # counts its older events in `events` only.
    typed = sum(record.types.values())
    if record.native_events and record.native_events * 2 >= typed:
        return NEUTRAL_CONFIDENCE
    return 100 - bot_score(record)


def frustration(record: VisitorRecord) -> int:
    """Rage clicks per click, doubled and capped: a third of clicks in rage bursts is 67."""
    clicks = record.types.get("click", 0)
    return min(100, round(200 * record.rage_clicks / clicks)) if clicks else 0


def conversion_readiness(record: VisitorRecord) -> int:
    """Engagement points: depth of visit, scrolling, forms, identification."""
    if record.is_bot:
        return 0
    types = record.types
    points = 10 * min(types.get("pageview", 0), 4) + 5 * min(types.get("scroll", 0), 4)
    points += 20 if types.get("form") else 0
    points += 30 if types.get("identify") else 0
    return min(100, points)


def engagement(record: VisitorRecord) -> dict[str, float]:
    """Scroll depth and time on page, derived from the visitor's scroll events (spec 2.3).

    A page is a page path within a session. The current page is the one with
    the latest pageview (else the latest first event): its deepest scroll
    milestone and the longest timeOnPage its scrolls reported (0 until one
    arrives). The average and the total run over every page seen; a page
    without a scroll counts as depth 0 and time 0.
    """
    pages = len(record.pages) + record.pages_left
    if not pages:
        return {"scrollDepth": 0, "timeOnPageMs": 0, "averageScrollDepth": 0, "totalTimeOnPageMs": 0, "pages": 0}
    current = record.pages[current_page(record.pages)] if record.pages else None
    depth_total = record.depth_left + sum(page[3] for page in record.pages)
    return {
        "scrollDepth": current[3] if current else 0,
        "timeOnPageMs": current[4] if current else 0,
        "averageScrollDepth": round(depth_total / pages, 1),
        "totalTimeOnPageMs": record.time_left_ms + sum(page[4] for page in record.pages),
        "pages": pages,
    }


def snapshot(
    view: VisitorView, *, visitor_id: str, site_id: str, session_id: str | None, now_ms: int
) -> dict[str, Any]:
    """A full-coverage snapshot."""
    record = view.record
    if record is None:
        # Pending only while the fold is behind: once it has caught up, a visitor
        # without a record stays without one (consent decisions alone, or every
        # event dropped by strict consent, make none), however long one waits.
        return _neutral(visitor_id, site_id, session_id, now_ms, mode="full", pending=view.behind, klass="unknown")
    types = record.types
    return {
        "visitorId": visitor_id,
        "siteId": site_id,
        "sessionId": session_id,
        "coverageMode": "full",
        "pending": view.behind,
        "stale": now_ms - record.last_ms > STALE_AFTER_MS,
        "behavioralClass": behavioral_class(record),
        "bot": {"isBot": record.is_bot, "category": record.category, "score": bot_score(record)},
        "scores": {
            "frustration": frustration(record),
            "conversionReadiness": conversion_readiness(record),
            "humanConfidence": human_confidence(record),
        },
        "activity": {
            "events": record.events,
            "pageviews": types.get("pageview", 0),
            "clicks": types.get("click", 0),
            "scrolls": types.get("scroll", 0),
            "forms": types.get("form", 0),
            "customs": types.get("custom", 0),
            "identifies": types.get("identify", 0),
            "rageClicks": record.rage_clicks,
            "firstSeen": record.first_ms,
            "lastSeen": record.last_ms,
        },
        "engagement": engagement(record),
        "asOf": now_ms,
    }


def degraded(*, visitor_id: str, site_id: str, session_id: str | None, now_ms: int) -> dict[str, Any]:
    """The neutral placeholder (spec 3: coverage exhausted or metering unavailable).

    Nothing of the visitor is read or revealed; spec 2.6 has it carry suspicious.
    """
    return _neutral(visitor_id, site_id, session_id, now_ms, mode="degraded", pending=False, klass="suspicious")


def _neutral(
    visitor_id: str, site_id: str, session_id: str | None, now_ms: int, *, mode: str, pending: bool, klass: str
) -> dict[str, Any]:
    """A snapshot that knows nothing of the visitor: neutral verdict and scores, no activity."""
    return {
        "visitorId": visitor_id,
        "siteId": site_id,
        "sessionId": session_id,
        "coverageMode": mode,
        "pending": pending,
        "stale": False,
        "behavioralClass": klass,
        "bot": {"isBot": False, "category": "unknown", "score": 0},
        "scores": {"frustration": 0, "conversionReadiness": 0, "humanConfidence": NEUTRAL_CONFIDENCE},
        "asOf": now_ms,
    }
