"""Request-rate bucket edges driven by trio's autojump clock (spec 8.2; README algorithm).

Time is trio's virtual clock: `trio.sleep` moves it instantly, so minutes of
traffic at exact instants run in milliseconds, with no real sleeping.
"""

from __future__ import annotations

import trio

from collector.limits.buckets import RateDecision, RateLimiter

EPOCH = 1_800_000_000.0  # a whole minute: window edges fall on whole virtual minutes


def now() -> float:
    return EPOCH + trio.current_time()


async def test_a_client_at_exactly_the_rate_is_never_refused(autojump_clock: trio.abc.Clock) -> None:
    limiter = RateLimiter()
    refused = 0
    for _ in range(600):  # ten minutes at 1 request/s against a 1/s key
        refused += not limiter.check("k", 1, now()).allowed
        await trio.sleep(1)
    assert refused == 0


async def test_twice_the_rate_gets_the_burst_then_the_minute(autojump_clock: trio.abc.Clock) -> None:
    limiter = RateLimiter()
    allowed_per_window: dict[int, int] = {}
    for _ in range(2 * 60 * 5):  # five minutes at 2 requests/s
        decision = limiter.check("k", 1, now())
        window = int(now() // 60)
        allowed_per_window[window] = allowed_per_window.get(window, 0) + decision.allowed
        await trio.sleep(0.5)
    counts = list(allowed_per_window.values())
    # The first minute may use the 2x burst (120); every later minute follows a
    # full one, so it gets only its plain limit (60).
    assert counts == [120, 60, 60, 60, 60]


async def test_the_window_edge_and_retry_after(autojump_clock: trio.abc.Clock) -> None:
    limiter = RateLimiter()
    await trio.sleep_until(59.0)
    burst = [limiter.check("k", 1, now()) for _ in range(120)]
    assert all(d.allowed for d in burst)
    refused = limiter.check("k", 1, now())
    assert not refused.allowed and (refused.remaining, refused.burst_remaining) == (0, 0)
    assert refused.retry_after == 1 and refused.reset == EPOCH + 60
    await trio.sleep_until(59.999)
    assert not limiter.check("k", 1, now()).allowed  # still the old window
    await trio.sleep(refused.retry_after - 0.999)  # exactly the edge, as Retry-After promised
    after_edge: list[RateDecision] = [limiter.check("k", 1, now()) for _ in range(61)]
    # The previous window took the whole burst: only the plain minute is left.
    assert sum(d.allowed for d in after_edge) == 60
    assert after_edge[0].remaining == 59 and after_edge[0].burst_remaining == 0


async def test_a_quiet_minute_restores_the_burst(autojump_clock: trio.abc.Clock) -> None:
    limiter = RateLimiter()
    assert sum(limiter.check("k", 1, now()).allowed for _ in range(200)) == 120
    await trio.sleep(60)  # the next window: previous took 120, so only 60 more
    assert sum(limiter.check("k", 1, now()).allowed for _ in range(200)) == 60
    await trio.sleep(120)  # a whole idle minute in between: the burst is back
    assert sum(limiter.check("k", 1, now()).allowed for _ in range(200)) == 120


async def test_buckets_share_by_id_not_by_key(autojump_clock: trio.abc.Clock) -> None:
    limiter = RateLimiter()
    # Two keys of one account, type and scope map to one bucket id and share it.
    shared = "acme:browser:ingest"
    assert sum(limiter.check(shared, 1, now()).allowed for _ in range(100)) == 100
    assert sum(limiter.check(shared, 1, now()).allowed for _ in range(100)) == 20
    assert limiter.check("acme:mobile:mobile:ingest", 1, now()).allowed  # another bucket
