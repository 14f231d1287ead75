"""The soak: batch25 at a constant 70% of its measured maximum rate, watching RSS and fds.

wrk2 is not packaged by Debian, so the rate is held by wrk itself: a Lua
`delay()` makes each connection wait between a response and its next request.
wrk has no clock in Lua, so the delay cannot follow latency by itself: first
three 5-second calibration runs on the same server correct the delay from the
rate each achieved; then one continuous wrk run of the soak's duration holds
it (one run, so the connections stay the same and the fd count means
something). Every 2.5 s the soak samples VmRSS and the open file descriptors
of the server (parent and workers, summed). Growth is measured from the first
sample after the warm-up (the first quarter of the continuous run, 10-30 s) to
the mean of the last two samples, from the mean of the first two (fds: the
first and the last sample).

VmRSS counts LMDB's memory-mapped data pages (RssFile) as well as the heap
(RssAnon). The outbox only grows during a soak (retention keeps 7 days), so
the mapped part grows with the data the process touches, and drops whenever
the map is doubled (remapped), or the kernel reclaims them: page cache, not a
leak, which swings VmRSS by -60% to +300% between samples with no leak at all.
So the verdict (`ok`) is the anonymous part's growth, where a leak would show,
and the fds; VmRSS's growth is reported beside it.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import bodies
from bench.scenarios import Result, disagreement, group_size, parse_wrk, write_tenants, wrk_argv
from bench.server import Collector

CALIBRATION_RUNS, CALIBRATION_S = 3, 5.0
SAMPLE_EVERY_S = 2.5
LOAD_FACTOR = 0.7
SHORTFALL = 0.8  # a paced run below this share of its target is flagged


@dataclass
class Soak:
    target_rps: float
    achieved_rps: float
    seconds: float
    warmup_s: float
    connections: int
    delay_ms: float
    rss_growth_pct: float
    fd_growth: int
    rss_start_mb: float
    rss_end_mb: float
    rss_anon_growth_pct: float
    rss_anon_start_mb: float
    rss_anon_end_mb: float
    fds_start: int
    fds_end: int
    fds_min_after_warmup: int
    fds_max_after_warmup: int
    non2xx: int
    socket_errors: int
    samples: list[dict[str, float]] = field(default_factory=list)
    calibration: list[dict[str, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The verdict: the process's own memory (RssAnon) grew under 10% and no fd was left open."""
        return self.rss_anon_growth_pct < 10.0 and self.fd_growth <= 0

    @property
    def vmrss_ok(self) -> bool:
        """VmRSS alone, for information: LMDB's mapped pages swing it either way (see the module notes)."""
        return self.rss_growth_pct < 10.0 and self.fd_growth <= 0


def run_soak(wrk: str, *, max_rps: float, seconds: float, workers: int = 1,
             connections: int = 64, load_factor: float = LOAD_FACTOR,
             scenario: str = "soak", source: Path | None = None) -> tuple[Result, Soak]:
    """`connections` should be those max_rps was measured with: fewer cannot reach 70% of it.

    The same paced run at another `load_factor` is the `half-rate` scenario
    (0.5): the p99 latency at half the maximum rate.
    """
    target = max(1.0, load_factor * max_rps)
    warmup_s = min(30.0, max(10.0, seconds / 4)) if seconds >= 20 else seconds / 4
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        workdir = Path(tmp)
        tenants, _ = write_tenants(workdir)
        body = workdir / "body.json"
        body.write_bytes(bodies.batch(25))
        server = Collector(workdir, tenants, workers=workers, source=source)
        try:
            url = server.url + "/v1/events"
            delay_ms = connections * 1000.0 / target
            calibration: list[dict[str, float]] = []
            for _ in range(CALIBRATION_RUNS):
                argv = wrk_argv(wrk, url, body, CALIBRATION_S, connections, delay_ms=max(1, round(delay_ms)))
                stats = parse_wrk(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
                achieved = stats["requests"] / (stats["duration_us"] / 1e6)
                calibration.append({"delay_ms": round(delay_ms, 1), "requests_per_s": round(achieved, 1),
                                    "p99_ms": stats["p99_us"] / 1000})
                # cycle per connection = latency + delay; keep the latency, fix the delay
                if achieved > 0:
                    latency_ms = max(0.0, connections * 1000.0 / achieved - delay_ms)
                    delay_ms = max(1.0, connections * 1000.0 / target - latency_ms)
            samples: list[dict[str, float]] = []
            cpu0, before = server.cpu_seconds(), server.totals_or_why()
            argv = wrk_argv(wrk, url, body, seconds, connections, delay_ms=max(1, round(delay_ms)))
            started = time.monotonic()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def sample() -> None:
                anon, mapped = server.rss_parts()
                samples.append({
                    "t": round(time.monotonic() - started, 1),
                    "rss_mb": round(server.rss_bytes() / 2**20, 2),
                    "rss_anon_mb": round(anon / 2**20, 2),
                    "rss_file_mb": round(mapped / 2**20, 2),
                    "fds": server.open_fds(),
                })

            try:
                at = SAMPLE_EVERY_S
                while at < seconds - 0.5 and proc.poll() is None:
                    time.sleep(max(0.0, started + at - time.monotonic()))
                    sample()
                    at += SAMPLE_EVERY_S
                if not samples:  # a run shorter than one sampling interval (a quick half-rate)
                    sample()
                out, err = proc.communicate(timeout=seconds + 60)
            except BaseException:  # an interrupted run leaves no wrk behind
                proc.kill()
                proc.wait()
                raise
            if proc.returncode != 0:
                raise RuntimeError(f"wrk failed: {err}")
            stats = parse_wrk(out)
            cpu = server.cpu_seconds() - cpu0
            if workers > 1:
                time.sleep(1.2)  # every worker's metrics snapshot written after the run (each second)
            after_run = server.totals_or_why()
            peak = server.peak_rss_bytes()
            lost = server.lost_processes()
        finally:
            server.stop()
    after = [s for s in samples if s["t"] >= warmup_s] or samples[-1:]
    head, tail = after[:2], after[-2:]
    start = {"rss_mb": round(statistics.mean(s["rss_mb"] for s in head), 2),
             "rss_anon_mb": round(statistics.mean(s["rss_anon_mb"] for s in head), 2), "fds": head[0]["fds"]}
    rss_end = statistics.mean(s["rss_mb"] for s in tail)
    anon_end = statistics.mean(s["rss_anon_mb"] for s in tail)
    fds_end = int(tail[-1]["fds"])
    requests = stats["requests"]
    duration = stats["duration_us"] / 1e6
    non2xx = int(stats["non2xx"])
    soak = Soak(
        target_rps=round(target, 1),
        achieved_rps=round(requests / duration, 1),
        seconds=round(duration, 1),
        warmup_s=round(warmup_s, 1),
        connections=connections,
        delay_ms=round(delay_ms, 1),
        rss_growth_pct=round((rss_end - start["rss_mb"]) / start["rss_mb"] * 100, 2),
        fd_growth=fds_end - int(start["fds"]),
        rss_start_mb=start["rss_mb"],
        rss_end_mb=round(rss_end, 2),
        rss_anon_growth_pct=round((anon_end - start["rss_anon_mb"]) / start["rss_anon_mb"] * 100, 2),
        rss_anon_start_mb=start["rss_anon_mb"],
        rss_anon_end_mb=round(anon_end, 2),
        fds_start=int(start["fds"]),
        fds_end=fds_end,
        fds_min_after_warmup=int(min(s["fds"] for s in after)),
        fds_max_after_warmup=int(max(s["fds"] for s in after)),
        non2xx=non2xx,
        socket_errors=int(stats["socket_errors"]),
        samples=samples,
        calibration=calibration,
    )
    result = Result(
        scenario=scenario,
        connections=connections,
        requests_per_s=soak.achieved_rps,
        events_per_s=round((requests - non2xx) * 25 / duration, 1),
        p50_ms=stats["p50_us"] / 1000,
        p99_ms=stats["p99_us"] / 1000,
        p999_ms=stats["p999_us"] / 1000,
        cpu_s_per_1000_events=round(cpu / ((requests - non2xx) * 25) * 1000, 4) if requests > non2xx else None,
        cpu_ms_per_request=round(cpu / requests * 1000, 3) if requests else 0.0,
        peak_rss_mb=round(peak / 2**20, 1),
        group_commit_size=group_size(after_run["committed"] - before["committed"],
                                     after_run["transactions"] - before["transactions"]),
        non2xx=non2xx,
        socket_errors=soak.socket_errors,
        timeouts=int(stats.get("timeouts", 0)),
        events_per_request=25,
        note=(f"constant {soak.target_rps:.0f} req/s target ({load_factor:.0%} of batch25's max {max_rps:.0f});"
              f" RSS {soak.rss_growth_pct:+.1f}% (heap {soak.rss_anon_growth_pct:+.1f}%) and fds"
              f" {soak.fd_growth:+d} after {warmup_s:.0f} s warm-up"),
        workers=workers,
    )
    result.check(lost)
    result.problems += short_of_pace(soak.achieved_rps, soak.target_rps)
    # (the requests in flight when wrk stopped were finished by the server: one a connection)
    result.problems += disagreement(after_run["accepted"] - before["accepted"], (requests - non2xx) * 25,
                                    connections * 25, "accepted events")
    if scenario == "soak" and len(after) < 4:
        result.problems.append(f"{len(after)} sample(s) after the warm-up: growth needs two at each end"
                               f" ({SAMPLE_EVERY_S:.1f} s apart; run the soak for 20 s or more)")
    return result, soak


def short_of_pace(achieved_rps: float, target_rps: float) -> list[str]:
    """A problem when a paced run fell far below its target.

    The calibration lands within a few percent of the target; far below it,
    the server could not keep up, and the latencies are an overloaded one's.
    """
    if achieved_rps >= SHORTFALL * target_rps:
        return []
    return [f"reached {achieved_rps:.0f} of its {target_rps:.0f} req/s pace: the server could not keep it"]
