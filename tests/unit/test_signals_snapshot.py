"""The visitor snapshot's formulas (collector/signals/snapshot.py), pure."""

from __future__ import annotations

import msgspec

from collector.access.tenants import KeyRecord
from collector.limits.usage import coverage_read_allowed, policy_for
from collector.signals.snapshot import STALE_AFTER_MS, degraded, snapshot
from storage.visitors import VisitorEvent, VisitorRecord, VisitorView, merge

NOW = 10_000_000


def _record(*events: tuple[str, bool], native: bool = False, click_gap_ms: int = 5000) -> VisitorRecord:
    stream = [
        VisitorEvent(NOW - 1000, is_bot, "crawler" if is_bot else "human", kind, native, (n + 1) * click_gap_ms)
        for n, (kind, is_bot) in enumerate(events)
    ]
    return merge(None, stream)


def _snap(record: VisitorRecord | None, behind: bool = False, now_ms: int = NOW) -> dict[str, object]:
    return snapshot(VisitorView(record, behind), visitor_id="v", site_id="web", session_id="s", now_ms=now_ms)


def test_a_person_reading_and_filling_a_form() -> None:
    snap = _snap(_record(("pageview", False), ("scroll", False), ("pageview", False), ("form", False)))
    assert snap["behavioralClass"] == "human" and snap["pending"] is False and snap["stale"] is False
    assert snap["bot"] == {"isBot": False, "category": "human", "score": 0}
    assert snap["scores"] == {"frustration": 0, "conversionReadiness": 10 * 2 + 5 + 20, "humanConfidence": 100}
    assert snap["activity"]["pageviews"] == 2  # type: ignore[index]


def test_bot_score_classes_and_confidence() -> None:
    crawler = _snap(_record(("pageview", True), ("pageview", True), ("pageview", False)))
    assert crawler["behavioralClass"] == "bot"
    assert crawler["bot"] == {"isBot": True, "category": "crawler", "score": 67}
    assert crawler["scores"]["conversionReadiness"] == 0  # type: ignore[index]
    mixed = _snap(_record(("pageview", True), ("pageview", False), ("pageview", False)))
    assert mixed["behavioralClass"] == "suspicious" and mixed["scores"]["humanConfidence"] == 67  # type: ignore[index]
    clean = _snap(_record(*[("pageview", False)] * 4, ("pageview", True)))
    assert clean["behavioralClass"] == "human" and clean["bot"]["score"] == 20  # type: ignore[index]  # under 25
    app = _snap(_record(("pageview", False), native=True))
    assert app["scores"]["humanConfidence"] == 50  # type: ignore[index]  # spec 2.6


def test_frustration_counts_rage_clicks() -> None:
    calm = _snap(_record(*[("click", False)] * 4))
    assert calm["scores"]["frustration"] == 0  # type: ignore[index]
    raging = _snap(_record(*[("click", False)] * 4, click_gap_ms=100))
    assert raging["activity"]["rageClicks"] == 2  # type: ignore[index]
    assert raging["scores"]["frustration"] == 100  # type: ignore[index]  # 2 of 4, doubled


def test_pending_stale_and_unknown() -> None:
    assert _snap(None, behind=True)["pending"] is True and _snap(None)["behavioralClass"] == "unknown"
    # caught up: a visitor without a record is unknown, not waiting for anything (helper-69 #1)
    assert _snap(None)["pending"] is False
    assert "activity" not in _snap(None)
    record = _record(("pageview", False))
    assert _snap(record, behind=True)["pending"] is True
    assert _snap(record, now_ms=NOW + STALE_AFTER_MS)["stale"] is True


def test_degraded_placeholder_reveals_nothing() -> None:
    snap = degraded(visitor_id="v", site_id="web", session_id=None, now_ms=NOW)
    assert snap["coverageMode"] == "degraded" and snap["behavioralClass"] == "suspicious"
    assert "activity" not in snap and snap["bot"]["isBot"] is False


def test_coverage_reads_stop_at_the_allowance_unless_overage() -> None:
    base = {"key": "cs_live_abcdefgh", "clientId": "c", "plan": "paid",
            "contract": {"signalsCoverage": 10, "coverageCeiling": 15}}
    policy = policy_for(msgspec.convert(base, KeyRecord))
    assert coverage_read_allowed(policy, 9, 1) and not coverage_read_allowed(policy, 10, 1)
    assert not coverage_read_allowed(policy, 9, 2)  # a partitioned read needs all its units
    overage = policy_for(msgspec.convert({**base, "overage": True}, KeyRecord))
    assert coverage_read_allowed(overage, 14, 1) and not coverage_read_allowed(overage, 15, 1)
