"""Realistic request bodies: a mix of the seven event types at realistic sizes.

Event ids carry the placeholder @ID@, which the wrk Lua script replaces with
a fresh per-request id, so every request of a run stores new events.
"""

from __future__ import annotations

import hashlib
import json
import time

UA = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko)"
    " Chrome/131.0.0.0 Safari/537.36"
)


def _envelope(kind: str, index: int, now_ms: int, origin: str) -> dict[str, object]:
    return {
        "type": kind,
        "_eid": f"@ID@-{index}",
        "visitorId": "v_8f14e45fceea167a5a36dedd4bea2543",
        "sessionId": "s_c9f0f895fb98ab9159f51fd0297e236d",
        "timestamp": now_ms,
        "page": {
            "url": f"https://{origin}/products/trail-running-shoes?utm_source=mail",
            "path": "/products/trail-running-shoes",
            "title": "Trail running shoes | Bench Outfitters",
        },
        "device": {
            "userAgent": UA,
            "viewport": {"width": 1440, "height": 900},
            "timezone": "Europe/Berlin",
            "language": "de-DE",
            "platform": "MacIntel",
            "pixelRatio": 2,
        },
    }


def event(index: int, now_ms: int, origin: str = "bench.example") -> dict[str, object]:
    kinds = ["pageview", "click", "scroll", "click", "custom", "form", "scroll", "identify", "click",
             "_consent_transition"]  # fmt: skip
    kind = kinds[index % len(kinds)]
    base = _envelope(kind, index, now_ms, origin)
    if kind == "pageview":
        base["performance"] = {"loadTime": 812, "domContentLoaded": 430, "firstContentfulPaint": 390}
    elif kind == "click":
        base["element"] = {"selector": "main > div.product > button.add-to-cart", "text": "Add to cart",
                           "x": 612, "y": 488, "pageX": 612, "pageY": 1288, "normX": 0.42, "normY": 0.54}
    elif kind == "scroll":
        base.update(depth=50, timeOnPage=18_250)
    elif kind == "custom":
        base.update(name="size_selected", category="product", action="select", label='{"size":"44"}', value=44)
    elif kind == "form":
        base.update(action="submit", formId="newsletter", fieldCount=2, form_selector="form#newsletter",
                    raw_fields='{"email":"email","consent":"checkbox"}', detected_email=True,
                    completion_rate=100)
    elif kind == "identify":
        base["hem"] = hashlib.sha256(b"runner@example.com").hexdigest()
    else:
        base = {k: base[k] for k in ("type", "_eid", "visitorId", "sessionId", "timestamp")}
        # A grant, as most consent-banner callbacks are: a denial here would drop the
        # identify that follows it, and the body would store 24 of its 25 events.
        base["consent"] = {"analytics": True, "identityResolution": True, "thirdPartySharing": False}
    return base


def batch(size: int, origin: str = "bench.example") -> bytes:
    now_ms = int(time.time() * 1000)
    if size == 1:
        return json.dumps(event(0, now_ms, origin)).encode()
    return json.dumps({"events": [event(i, now_ms, origin) for i in range(size)]}).encode()
