"""Named scenarios: each starts a fresh collector, warms up, then measures with wrk."""

from __future__ import annotations

import gzip
import json
import re
import secrets
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import bodies
from bench.server import Collector

LUA = Path(__file__).parent / "lua" / "fresh_ids.lua"
READ_LUA = Path(__file__).parent / "lua" / "signals_read.lua"
SUMMARY_LUA = Path(__file__).parent / "lua" / "summary.lua"


def lua_script(directory: Path, name: str, source: Path, extra: str = "") -> Path:
    """A wrk script in `directory`: `source`, then `extra`, then the shared summary (done())."""
    script = directory / name
    script.write_text(source.read_text() + extra + "\n" + SUMMARY_LUA.read_text())
    return script
BENCH_KEY = "cs_live_bench00000000"
SLOW_KEY = "cs_live_benchslow0000"
ORIGIN = "https://bench.example"
BIG = 1_000_000_000
# (no ceilings: with overage off they do nothing, and the server warns of them in every start's log)
CONTRACT = {"monthlyPageviews": BIG, "signalsCoverage": BIG}


@dataclass
class Result:
    scenario: str
    connections: int
    requests_per_s: float
    events_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    cpu_s_per_1000_events: float | None  # None: the row's events are not what its CPU served
    cpu_ms_per_request: float
    peak_rss_mb: float
    group_commit_size: float | None  # None: no commit in the measured window
    non2xx: int
    socket_errors: int  # connect, read, write errors and timeouts, as wrk counts them
    events_per_request: int
    note: str = ""
    workers: int = 1
    cpu_is_per_request: bool = True  # False: cpu_ms_per_request also counts load beside the requests
    timeouts: int = 0  # requests unanswered after wrk's 10 s timeout: missing from the latencies
    expects_2xx: bool = True  # False: refusals are the point (over-limit)
    problems: list[str] = field(default_factory=list)  # why the row's figures cannot be trusted

    def check(self, lost_processes: str = "") -> None:
        """Record what makes the figures untrustworthy: errors, timeouts, refusals, a dead server process."""
        if self.timeouts:
            self.problems.append(f"{self.timeouts} requests timed out after 10 s and are missing from the latencies")
        if self.socket_errors > self.timeouts:
            self.problems.append(f"{self.socket_errors - self.timeouts} socket errors (connect, read or write)")
        if self.non2xx and self.expects_2xx:
            self.problems.append(f"{self.non2xx} answers were not 2xx")
        if lost_processes:
            self.problems.append(f"{lost_processes}: CPU, RSS and group size miss what it had used")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def tenant(key: str, client: str, rate: float, plan: str = "paid") -> dict[str, object]:
    return {"key": key, "clientId": client, "plan": plan, "rateLimit": rate,
            "sites": [{"siteId": "web", "domains": ["bench.example"]}], "contract": CONTRACT}


def write_tenants(workdir: Path, extra_keys: int = 0) -> tuple[Path, Path | None]:
    keys = [tenant(BENCH_KEY, "bench", 1_000_000), tenant(SLOW_KEY, "slow", 1, plan="free")]
    key_file = None
    if extra_keys:
        names = [f"cs_live_mix{n:012d}" for n in range(extra_keys)]
        keys += [tenant(name, f"mix{n}", 1_000_000) for n, name in enumerate(names)]
        key_file = workdir / "keys.txt"
        key_file.write_text("\n".join(names) + "\n")
    path = workdir / "tenants.json"
    path.write_text(json.dumps({"keys": keys}))
    return path, key_file


def wrk_argv(wrk: str, url: str, body: Path, seconds: float, connections: int, *,
             key: str = BENCH_KEY, mode: str = "fresh", key_file: Path | None = None,
             delay_ms: int | None = None, start: int = 0) -> list[str]:
    """wrk's command line; `start`: the first request counter (see fresh_ids.lua)."""
    extra = ""
    if delay_ms is not None:
        # wrk's delay(): each connection waits before its next request, uniformly 0 to
        # twice `delay_ms` (the mean is delay_ms). A fixed delay keeps the connections
        # in lock-step, so every request would queue behind a burst of all the others
        # and the measured latency would be the burst's, not the paced rate's. wrk looks
        # for the function before init() runs, so it is written into a copy.
        extra = f"\nfunction delay() return math.random(0, {2 * int(delay_ms)}) end\n"
    script = lua_script(body.parent, "paced.lua" if delay_ms is not None else "fresh_ids.lua", LUA, extra)
    return [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(script), url, "--", str(body), key, ORIGIN, str(key_file or ""), mode, str(start),
            str(secrets.randbelow(2**31))]  # each run its own id prefix


def parse_wrk(out: str) -> dict[str, float]:
    match = re.search(r"BENCH_JSON (\{.*\})", out)
    if not match:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    return json.loads(match.group(1))


def run_wrk(wrk: str, url: str, body: Path, seconds: float, connections: int, *,
            key: str = BENCH_KEY, mode: str = "fresh", key_file: Path | None = None,
            start: int = 0) -> dict[str, float]:
    argv = wrk_argv(wrk, url, body, seconds, connections, key=key, mode=mode, key_file=key_file, start=start)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}")
    return parse_wrk(done.stdout)


def gzip_pool(workdir: Path, count: int) -> Path:
    template = bodies.batch(25).decode()
    path = workdir / "gzpool.bin"
    with path.open("wb") as out:
        for n in range(count):
            blob = gzip.compress(template.replace("@ID@", f"gz{n}").encode(), 6)
            out.write(f"{len(blob)}\n".encode() + blob)
    return path


def disagreement(server: float, bench: float, in_flight: float, what: str) -> list[str]:
    """A problem when the server's own count of `what` is not the bench's, allowing for
    `in_flight`: what the server finished after wrk stopped counting (a request a
    connection, at each stop)."""
    if bench <= server <= bench + in_flight:
        return []
    return [f"the server counted {server:.0f} {what} where the bench counts {bench:.0f}: the row does not hold"]


def group_size(committed: float, transactions: float) -> float | None:
    """Requests per group commit in a window; None when nothing was committed."""
    return round(committed / transactions, 1) if transactions > 0 else None


SCENARIOS = ("baseline", "single", "batch25", "batch25-gzip", "replay", "mixed-tenants", "over-limit",
             "signals-read")
# `soak` runs after these (bench/soak.py): it needs batch25's maximum rate


def run_scenario(name: str, wrk: str, *, seconds: float, warmup: float, connections: int,
                 workers: int = 1, source: Path | None = None) -> Result:
    """One scenario on a fresh server; `source`: another revision's tree to serve from (None: this one)."""
    if name == "signals-read":
        return run_signals_read(wrk, seconds=seconds, warmup=warmup, connections=connections, workers=workers,
                                source=source)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        workdir = Path(tmp)
        tenants, key_file = write_tenants(workdir, 10_000 if name == "mixed-tenants" else 0)
        size = 1 if name == "single" else 25
        body = workdir / "body.json"
        body.write_bytes(bodies.batch(size))
        path, key, mode, note = "/v1/events", BENCH_KEY, "fresh", ""
        if name == "baseline":
            path = "/_bench/noop"
        elif name == "batch25-gzip":
            body, mode = gzip_pool(workdir, 20_000), "gzpool"
            note = "pool of 20,000 gzipped bodies, the timed run carrying on after the warm-up's; ids repeat after that"
        elif name == "replay":
            mode = "static"
            body.write_bytes(body.read_bytes().replace(b"@ID@", b"replayed"))
        elif name == "over-limit":
            key = SLOW_KEY
            note = "rateLimit 1: every timed request is 429 (the warm-up spent the 120 a minute allows)"
        server = Collector(workdir, tenants, workers=workers, source=source)
        try:
            url = server.url + path
            if name == "replay":  # store the batch once, so every measured request is a duplicate
                import httpx

                httpx.post(url, content=body.read_bytes(),
                           headers={"X-API-Key": key, "Origin": ORIGIN, "Content-Type": "application/json"})
            start = 0
            if warmup:
                warm = run_wrk(wrk, url, body, warmup, connections, key=key, mode=mode, key_file=key_file)
                # past the warm-up's answered requests and the one each connection had in flight
                start = int(warm["requests"]) + connections
            if workers > 1:
                time.sleep(1.2)  # the warm-up's last figures in every worker's metrics snapshot
            cpu0, before = server.cpu_seconds(), server.totals()
            started = time.monotonic()
            stats = run_wrk(wrk, url, body, seconds, connections, key=key, mode=mode, key_file=key_file,
                            start=start)
            cpu = server.cpu_seconds() - cpu0
            if workers > 1:
                time.sleep(1.2)  # every worker's metrics snapshot written after the run (each second)
            after = server.totals_or_why()
            jobs1, txns1 = after["committed"] - before["committed"], after["transactions"] - before["transactions"]
            elapsed = stats["duration_us"] / 1e6 or (time.monotonic() - started)
            requests = stats["requests"]
            # only answered-2xx requests carried stored (or duplicate) events
            events = (requests - stats["non2xx"]) * size if path != "/_bench/noop" else 0
            rps = requests / elapsed
            result = Result(
                scenario=name,
                connections=connections,
                requests_per_s=round(rps, 1),
                events_per_s=round(events / elapsed, 1),
                p50_ms=stats["p50_us"] / 1000,
                p99_ms=stats["p99_us"] / 1000,
                p999_ms=stats["p999_us"] / 1000,
                # (refusals: the CPU served them, not the few events a run without warm-up stores)
                cpu_s_per_1000_events=round(cpu / events * 1000, 4) if events and name != "over-limit" else None,
                cpu_ms_per_request=round(cpu / requests * 1000, 3) if requests else 0.0,
                peak_rss_mb=round(server.peak_rss_bytes() / 2**20, 1),
                group_commit_size=group_size(jobs1, txns1),
                non2xx=int(stats["non2xx"]),
                socket_errors=int(stats["socket_errors"]),
                timeouts=int(stats.get("timeouts", 0)),
                events_per_request=size,
                note=note,
                workers=workers,
                expects_2xx=name != "over-limit",
            )
            result.check(server.lost_processes())
            if name == "over-limit":  # a wrong key's 401 or a 500 is no rate-limit refusal
                limited = after["rate_limited"] - before["rate_limited"]
                result.problems += disagreement(limited, stats["non2xx"], 2 * connections, "429 answers")
            if events:
                outcome = "duplicate" if name == "replay" else "accepted"
                stored = after[outcome] - before[outcome]
                # (the requests in flight when the warm-up and the timed run stopped)
                result.problems += disagreement(stored, events, 2 * connections * size, f"{outcome} events")
            return result
        finally:
            server.stop()


def run_signals_read(wrk: str, *, seconds: float, warmup: float, connections: int, workers: int = 1,
                     source: Path | None = None) -> Result:
    """Snapshot reads of the batch25 visitor while batch25 ingest runs beside them.

    Half the connections read (GET /v1/signals/:visitorId with its sessionId:
    one coverage unit each, metered through the group-commit writer), half
    ingest 25-event batches. The row reports the reads; the note the ingest.
    """
    with tempfile.TemporaryDirectory(prefix="bench-signals-read-") as tmp:
        workdir = Path(tmp)
        tenants, _ = write_tenants(workdir)
        body = workdir / "body.json"
        body.write_bytes(bodies.batch(25))
        sample = json.loads(body.read_bytes().replace(b"@ID@", b"x"))["events"][0]
        server = Collector(workdir, tenants, workers=workers, source=source)
        readers, writers = max(1, connections // 2), max(1, connections - connections // 2)
        try:
            ingest_argv = wrk_argv(wrk, server.url + "/v1/events", body, warmup + seconds + 1, writers)
            read_lua = lua_script(workdir, "signals_read.lua", READ_LUA)
            read_argv = [wrk, "-t1", f"-c{readers}", "--timeout", "10s", "-s", str(read_lua), server.url,
                         "--", sample["visitorId"], sample["sessionId"], BENCH_KEY, ORIGIN]
            ingest = subprocess.Popen(ingest_argv, stdout=subprocess.PIPE, text=True)
            try:
                if warmup:
                    subprocess.run([*read_argv[:3], f"-d{max(1, round(warmup))}s", *read_argv[3:]],
                                   capture_output=True, check=True)
                cpu0, (jobs0, txns0) = server.cpu_seconds(), server.writer_counts()
                out = subprocess.run([*read_argv[:3], f"-d{max(1, round(seconds))}s", *read_argv[3:]],
                                     capture_output=True, text=True, check=True).stdout
                cpu = server.cpu_seconds() - cpu0
                jobs1, txns1 = server.writer_counts()
            except BaseException:  # an interrupted or failed run leaves no wrk behind
                ingest.kill()
                ingest.wait()
                raise
            ingest_stats = parse_wrk(ingest.communicate(timeout=seconds + warmup + 30)[0])
            reads = parse_wrk(out)
            elapsed = reads["duration_us"] / 1e6
            ingest_rps = ingest_stats["requests"] / (ingest_stats["duration_us"] / 1e6)
            result = Result(
                scenario="signals-read",
                connections=readers,
                requests_per_s=round(reads["requests"] / elapsed, 1),
                events_per_s=round((ingest_stats["requests"] - ingest_stats["non2xx"]) * 25
                                   / (ingest_stats["duration_us"] / 1e6), 1),
                p50_ms=reads["p50_us"] / 1000,
                p99_ms=reads["p99_us"] / 1000,
                p999_ms=reads["p999_us"] / 1000,
                cpu_s_per_1000_events=None,
                # CPU of the whole server (reads and ingest) per read
                cpu_ms_per_request=round(cpu / reads["requests"] * 1000, 3) if reads["requests"] else 0.0,
                peak_rss_mb=round(server.peak_rss_bytes() / 2**20, 1),
                group_commit_size=group_size(jobs1 - jobs0, txns1 - txns0),
                non2xx=int(reads["non2xx"]),
                socket_errors=int(reads["socket_errors"]),
                timeouts=int(reads.get("timeouts", 0)),
                events_per_request=0,
                cpu_is_per_request=False,
                note=(f"reads of one active visitor on {readers} connections while batch25 ingest ran on"
                      f" {writers}: ingest {ingest_rps:.0f} req/s, p99 {ingest_stats['p99_us'] / 1000:.1f} ms,"
                      f" {int(ingest_stats['non2xx'])} non-2xx; events/s is the ingest's; cpu per read"
                      " counts the whole server"),
                workers=workers,
            )
            result.check(server.lost_processes())
            if ingest_stats["non2xx"] or ingest_stats["socket_errors"]:
                result.problems.append(f"the ingest beside the reads had {int(ingest_stats['non2xx'])} non-2xx"
                                       f" answers and {int(ingest_stats['socket_errors'])} socket errors")
            if workers > 1:
                time.sleep(1.2)  # every worker's metrics snapshot written after the run (each second)
            ingested = (ingest_stats["requests"] - ingest_stats["non2xx"]) * 25
            stored = server.totals_or_why()["accepted"]  # (the server's whole life: the ingest ran all of it)
            result.problems += disagreement(stored, ingested, writers * 25, "accepted events of the ingest beside")
            return result
        finally:
            server.stop()
