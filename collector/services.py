"""The long-lived components one serving process shares, built once by `app.serve`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.access.keycache import KeyCache
from collector.http.client_address import TrustedProxies
from collector.http.connections import ConnectionLimits
from collector.ingest.bots import BotClassifier
from collector.ingest.sealing import FieldSealer
from collector.limits.buckets import RateLimiter
from collector.metrics import Metrics
from collector.settings import Settings
from collector.signals.projection import VisitorProjection
from storage.env import Storage
from storage.retention import RetentionSweep
from storage.visitors import FoldAtCommit
from storage.writer import GroupCommitWriter


def wall_clock() -> float:
    return time.time()


@dataclass
class Services:
    settings: Settings
    storage: Storage
    writer: GroupCommitWriter
    commit_fold: FoldAtCommit  # the writer's in-transaction visitor fold (its counters)
    keys: KeyCache
    limiter: RateLimiter
    metrics: Metrics
    sealer: FieldSealer  # seals form values and raw identity fields before storage
    bots: BotClassifier  # bot verdicts; holds the operator's datacenter networks
    proxies: TrustedProxies  # whose X-Forwarded-For names the visitor
    metrics_readers: TrustedProxies  # the networks whose clients may read /metrics (metrics_from)
    # Wall-clock seconds; tests pass a clock they can move (period rollover).
    clock: Callable[[], float] = field(default=wall_clock)
    # The visitor projection, in the one process that runs it (None elsewhere).
    projection: VisitorProjection | None = None
    retention: RetentionSweep | None = None  # the retention sweep, in the same one process
    # `serve --workers N`: which worker process this is (0 runs retention and the visitor projection) and how many there are
    worker_index: int = 0
    connection_limits: ConnectionLimits | None = None  # set once the HTTP server runs (its open count)
    # trio time at which a drain stops waiting for requests in flight (None: not draining)
    drain_deadline: float | None = None
    workers: int = 1

    def now_ms(self) -> int:
        return int(self.clock() * 1000)
