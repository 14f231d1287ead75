"""Request-rate buckets in memory, sharded by xxhash (spec 8.2).

Algorithm, per bucket `clientId:keyType:scope` with rate r requests/s:
- limit = max(1, round(60 r)) per one-minute window, burst_limit = 2 x limit;
- windows are fixed minutes of the wall clock (w = floor(now / 60)); a bucket
  counts requests in the current window and remembers the previous one;
- a request is admitted when the current window has taken fewer than
  `limit`, or, as the short-burst allowance, fewer than `burst_limit` while
  the previous and current windows together have taken fewer than
  `burst_limit`. So an idle key can take 2x its minute at once, and any two
  consecutive minutes never take more than 2x the limit plus one minute's
  worth after a quiet minute;
- refused: Remaining values 0, Retry-After the seconds to the next window.
Buckets idle for two windows are evicted. A check is a dict lookup and a few
integer operations: a refusal costs almost nothing.

Partitions (`serve --workers N`, the spec's "partitions whose quotas sum to
the key-wide allowance"): each worker process holds its own buckets with a
quota of `ceil(limit / N)` per window and a burst of `ceil(2 limit / N)`, so
the N quotas sum to at least the key-wide `limit` (and burst) and exceed it by
at most N - 1 requests per window. Responses still state the key-wide `limit` and `burst_limit`;
`remaining` and `burst_remaining` are estimates: this partition's remaining
quota times N, capped at the key-wide values.
"""

from __future__ import annotations

import math

import msgspec
import xxhash

from collector.errors import ServiceError


class RateDecision(msgspec.Struct, frozen=True):
    allowed: bool
    limit: int
    burst_limit: int
    remaining: int
    burst_remaining: int
    reset: int
    retry_after: int


class RateLimiterStatistics(msgspec.Struct, frozen=True):
    buckets: int
    checks: int
    refusals: int


class RateLimiter:
    def __init__(self, shards: int = 16, sweep_above: int = 4096, partitions: int = 1) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        self.partitions = partitions
        # bucket id -> [window, current count, previous count]
        self._shards: list[dict[str, list[int]]] = [{} for _ in range(shards)]
        self._sweep_above = sweep_above
        self._checks = 0
        self._refusals = 0

    def check(self, bucket_id: str, rate_per_s: float, now: float) -> RateDecision:
        self._checks += 1
        key_limit = max(1, round(60 * rate_per_s))
        parts = self.partitions
        limit, burst = _partition_quotas(key_limit, parts)
        window = int(now // 60)
        shard = self._shards[xxhash.xxh3_64_intdigest(bucket_id.encode()) % len(self._shards)]
        state = shard.get(bucket_id)
        if state is None:
            if len(shard) >= self._sweep_above:
                self._evict(shard, window)
            state = shard[bucket_id] = [window, 0, 0]
        elif state[0] != window:
            state[2] = state[1] if state[0] == window - 1 else 0
            state[1] = 0
            state[0] = window
        current, previous = state[1], state[2]
        reset = (window + 1) * 60
        if current < limit or (current < burst and previous + current < burst):
            state[1] = current + 1
            return _allowed(key_limit, parts, current + 1, previous, reset)
        self._refusals += 1
        return RateDecision(
            False, key_limit, 2 * key_limit, 0, 0, reset, max(1, math.ceil(reset - now))
        )

    def peek(self, bucket_id: str, rate_per_s: float, now: float) -> RateDecision:
        """The bucket as `check` reports it, without taking a request.

        For a refusal that comes before the bucket (the key is known, the gate
        said no): spec 8.2 puts the rate headers on every authenticated response.
        """
        window = int(now // 60)
        state = self._shards[xxhash.xxh3_64_intdigest(bucket_id.encode()) % len(self._shards)].get(bucket_id)
        current = previous = 0
        if state is not None and state[0] == window:
            current, previous = state[1], state[2]
        elif state is not None and state[0] == window - 1:
            previous = state[1]
        return _allowed(max(1, round(60 * rate_per_s)), self.partitions, current, previous, (window + 1) * 60)

    @staticmethod
    def _evict(shard: dict[str, list[int]], window: int) -> None:
        for key in [k for k, state in shard.items() if state[0] < window - 1]:
            del shard[key]

    def statistics(self) -> RateLimiterStatistics:
        return RateLimiterStatistics(sum(map(len, self._shards)), self._checks, self._refusals)


def _partition_quotas(key_limit: int, parts: int) -> tuple[int, int]:
    """This partition's (limit, burst): ceil(limit / N) and ceil(2 limit / N).

    (Twice the rounded-up limit would let N partitions exceed the key-wide
    burst by 2 (N - 1).)
    """
    return -(-key_limit // parts), -(-2 * key_limit // parts)


def _allowed(key_limit: int, parts: int, current: int, previous: int, reset: int) -> RateDecision:
    """An admitting decision once this partition's window holds `current` (the previous `previous`)."""
    limit, burst = _partition_quotas(key_limit, parts)
    return RateDecision(
        True,
        key_limit,
        2 * key_limit,
        min(key_limit, parts * max(0, limit - current)),
        min(2 * key_limit, parts * max(0, burst - max(current, previous + current))),
        reset,
        0,
    )


def public_scope(scope: str) -> str:
    return "ingest" if scope == "mobile:ingest" else scope


def rate_headers(decision: RateDecision, scope: str) -> list[tuple[str, str]]:
    headers = [
        ("X-RateLimit-Limit", str(decision.limit)),
        ("X-RateLimit-Burst-Limit", str(decision.burst_limit)),
        ("X-RateLimit-Policy", f"{decision.limit};w=60;burst=2"),
        ("X-RateLimit-Scope", public_scope(scope)),
        ("X-RateLimit-Unit", "requests"),
        ("X-RateLimit-Remaining", str(decision.remaining)),
        ("X-RateLimit-Burst-Remaining", str(decision.burst_remaining)),
        ("X-RateLimit-Reset", str(decision.reset)),
    ]
    if not decision.allowed:
        headers.append(("Retry-After", str(decision.retry_after)))
    return headers


def refusal(decision: RateDecision, scope: str) -> ServiceError:
    return ServiceError(
        "rate_limit_exceeded",
        f"the {public_scope(scope)} request rate is exhausted; retry after {decision.retry_after} s",
        retryAfter=decision.retry_after,
    )
