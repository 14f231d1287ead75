"""The soak: batch25 at a constant 70% of its measured maximum rate, watching RSS and fds.

wrk2 is not packaged by Debian, so the rate is held by wrk itself: a Lua
`delay()` makes each of the connections wait between a response and its next
request. wrk has no clock in Lua, so the delay cannot follow latency by itself;
the soak runs as consecutive wrk segments (10 s each) and corrects the delay
after each segment from the rate the segment achieved. Every few seconds,
while wrk is connected, it samples VmRSS and the open file descriptors of the
server (parent and workers, summed). Growth is measured from the first
sample after the warm-up (the first quarter of the soak, 10-30 s) to the mean
of the last two samples.

VmRSS counts LMDB's memory-mapped data pages (RssFile) as well as the heap
(RssAnon). The outbox only grows during a soak (retention keeps 7 days), so
the mapped part grows with the data the process touches; that is page cache,
not a leak, and the kernel drops it under pressure. The report gives VmRSS
growth (the target) and the anonymous part's growth (where a leak would show).
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import bodies
from bench.scenarios import Result, parse_wrk, write_tenants, wrk_argv
from bench.server import Collector

SEGMENT_S = 10.0
SAMPLE_EVERY_S = 2.5
LOAD_FACTOR = 0.7


@dataclass
class Soak:
    target_rps: float
    achieved_rps: float
    seconds: float
    warmup_s: float
    connections: int
    rss_growth_pct: float
    fd_growth: int
    rss_start_mb: float
    rss_end_mb: float
    rss_anon_growth_pct: float
    rss_anon_start_mb: float
    rss_anon_end_mb: float
    fds_start: int
    fds_end: int
    non2xx: int
    socket_errors: int
    samples: list[dict[str, float]] = field(default_factory=list)
    segments: list[dict[str, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rss_growth_pct < 10.0 and self.fd_growth <= 0

    @property
    def heap_ok(self) -> bool:
        return self.rss_anon_growth_pct < 10.0 and self.fd_growth <= 0


def run_soak(wrk: str, *, max_rps: float, seconds: float, workers: int = 1,
             connections: int = 64) -> tuple[Result, Soak]:
    """`connections` should be those max_rps was measured with: fewer cannot reach 70% of it."""
    target = max(1.0, LOAD_FACTOR * max_rps)
    warmup_s = min(30.0, max(10.0, seconds / 4)) if seconds >= 20 else seconds / 4
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        workdir = Path(tmp)
        tenants, _ = write_tenants(workdir)
        body = workdir / "body.json"
        body.write_bytes(bodies.batch(25))
        server = Collector(workdir, tenants, workers=workers)
        try:
            url = server.url + "/v1/events"
            delay_ms = connections * 1000.0 / target
            samples: list[dict[str, float]] = []
            segments: list[dict[str, float]] = []
            cpu0 = server.cpu_seconds()
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds - 0.5:
                length = max(1.0, round(min(SEGMENT_S, seconds - elapsed)))
                argv = wrk_argv(wrk, url, body, length, connections, delay_ms=max(1, round(delay_ms)))
                seg_start = time.monotonic()
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                at = SAMPLE_EVERY_S
                while at < length - 0.5:
                    time.sleep(max(0.0, seg_start + at - time.monotonic()))
                    anon, mapped = server.rss_parts()
                    samples.append({
                        "t": round(time.monotonic() - started, 1),
                        "rss_mb": round(server.rss_bytes() / 2**20, 2),
                        "rss_anon_mb": round(anon / 2**20, 2),
                        "rss_file_mb": round(mapped / 2**20, 2),
                        "fds": server.open_fds(),
                    })
                    at += SAMPLE_EVERY_S
                out, err = proc.communicate(timeout=length + 30)
                if proc.returncode != 0:
                    raise RuntimeError(f"wrk failed: {err}")
                stats = parse_wrk(out)
                achieved = stats["requests"] / (stats["duration_us"] / 1e6)
                segments.append({
                    "t": round(seg_start - started, 1), "delay_ms": round(delay_ms, 1),
                    "requests_per_s": round(achieved, 1), "p50_ms": stats["p50_us"] / 1000,
                    "p99_ms": stats["p99_us"] / 1000, "non2xx": stats["non2xx"],
                    "socket_errors": stats["socket_errors"], "requests": stats["requests"],
                    "duration_s": stats["duration_us"] / 1e6,
                })
                # cycle per connection = latency + delay; keep the latency, fix the delay
                if achieved > 0:
                    latency_ms = max(0.0, connections * 1000.0 / achieved - delay_ms)
                    delay_ms = max(1.0, connections * 1000.0 / target - latency_ms)
            cpu = server.cpu_seconds() - cpu0
            peak = server.peak_rss_bytes()
        finally:
            server.stop()
    after = [s for s in samples if s["t"] >= warmup_s] or samples[-1:]
    start, tail = after[0], after[-2:]
    rss_end = statistics.mean(s["rss_mb"] for s in tail)
    anon_end = statistics.mean(s["rss_anon_mb"] for s in tail)
    fds_end = int(tail[-1]["fds"])
    requests = sum(s["requests"] for s in segments)
    duration = sum(s["duration_s"] for s in segments)
    non2xx = int(sum(s["non2xx"] for s in segments))
    soak = Soak(
        target_rps=round(target, 1),
        achieved_rps=round(requests / duration, 1),
        seconds=round(duration, 1),
        warmup_s=round(warmup_s, 1),
        connections=connections,
        rss_growth_pct=round((rss_end - start["rss_mb"]) / start["rss_mb"] * 100, 2),
        fd_growth=fds_end - int(start["fds"]),
        rss_start_mb=start["rss_mb"],
        rss_end_mb=round(rss_end, 2),
        rss_anon_growth_pct=round((anon_end - start["rss_anon_mb"]) / start["rss_anon_mb"] * 100, 2),
        rss_anon_start_mb=start["rss_anon_mb"],
        rss_anon_end_mb=round(anon_end, 2),
        fds_start=int(start["fds"]),
        fds_end=fds_end,
        non2xx=non2xx,
        socket_errors=int(sum(s["socket_errors"] for s in segments)),
        samples=samples,
        segments=segments,
    )
    measured = segments[1:] if len(segments) > 1 else segments  # the first segment settles the rate
    result = Result(
        scenario="soak",
        connections=connections,
        requests_per_s=soak.achieved_rps,
        events_per_s=round((requests - non2xx) * 25 / duration, 1),
        p50_ms=statistics.median(s["p50_ms"] for s in measured),
        p99_ms=max(s["p99_ms"] for s in measured),
        p999_ms=0.0,
        cpu_s_per_1000_events=round(cpu / ((requests - non2xx) * 25) * 1000, 4) if requests > non2xx else 0.0,
        cpu_ms_per_request=round(cpu / requests * 1000, 3) if requests else 0.0,
        peak_rss_mb=round(peak / 2**20, 1),
        group_commit_size=0.0,
        non2xx=non2xx,
        socket_errors=soak.socket_errors,
        events_per_request=25,
        note=(f"constant {soak.target_rps:.0f} req/s target (70% of batch25's max {max_rps:.0f});"
              f" RSS {soak.rss_growth_pct:+.1f}% (heap {soak.rss_anon_growth_pct:+.1f}%) and fds"
              f" {soak.fd_growth:+d} after {warmup_s:.0f} s warm-up;"
              f" p99 is the worst 10 s segment's"),
        workers=workers,
    )
    return result, soak
