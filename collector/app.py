"""The nursery tree of one serving process: storage, writer, HTTP server, shutdown.

`serve(settings, *, task_status)` owns every long-lived task. Start-up order:
open storage, import the tenants file, start the writer, then the HTTP server;
`task_status.started()` reports the bound address. Shutdown (SIGTERM/SIGINT or
cancellation) runs in reverse: the server stops accepting and finishes
in-flight requests, the writer drains and commits what it was handed, storage
closes.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import lmdb
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from quart_trio import QuartTrio

from collector import systemd
from collector.access.keycache import KeyCache
from collector.demo import DEMO_KEYS, DEMO_TENANTS
from collector.fieldkeys import key_file_path, serving_sealer, settle_key_file
from collector.http import app_input, h2_protocol  # noqa: F401  (app_input patches hypercorn: see it)
from collector.http.access_log import flush_periodically as flush_access_log
from collector.http.asgi import Receive, Scope, Send, send_response
from collector.http.client_address import TrustedProxies
from collector.http.connections import (
    MIN_CONNECTIONS,
    Connection,
    ConnectionGuard,
    ConnectionLimits,
    OpenSends,
    default_connection_limits,
)
from collector.http.drain import Drain
from collector.http.framing import CloseAmbiguouslyFramed
from collector.http.ingest import make_ingest_handler
from collector.http.ops import ops_handlers
from collector.http.replay import make_replay_handler
from collector.http.router import Router
from collector.http.signals import PREFIX as SIGNALS_PREFIX
from collector.http.signals import make_signals_handler
from collector.http.unrouted import UnroutedAnswers
from collector.ingest.bots import BotClassifier
from collector.limits.buckets import RateLimiter
from collector.limits.usage import billing_period
from collector.log_sink import stderr_sink
from collector.logs import OncePerMinute
from collector.metrics import Metrics, gauge
from collector.metrics_share import SharedMetrics, publish_every_second
from collector.runtime import (
    STOP_SIGNALS,
    announce_listening,
    defer_stop_signals,
    early_stop_signal,
)
from collector.services import Services, wall_clock
from collector.settings import Settings, SettingsError, load_cidrs
from collector.signals.projection import VisitorProjection
from collector.tenants_admin import import_tenants, imported_term_notes, settle_account_suspension
from collector.version import version
from storage.age_clock import (
    ANCHOR_KEY,
    AgeClock,
    SharedClock,
    boot_id,
    boot_seconds,
    decode_anchor,
)
from storage.age_clock import watch as watch_wall_clock
from storage.counters import iter_counters, mark_overage_counting
from storage.env import Storage
from storage.errors import StorageError
from storage.outbox import last_seq
from storage.retention import RetentionSweep, run_retention
from storage.throttled_log import ThrottledLog
from storage.visitors import CURSOR as VISITORS_CURSOR
from storage.visitors import FoldAtCommit
from storage.writer import GroupCommitWriter

log = logging.getLogger("collector")
_metrics_read_failed = ThrottledLog(log, logging.ERROR)


def open_storage(settings: Settings) -> Storage:
    return Storage(
        settings.data_dir,
        map_size=settings.map_size_mb * 1024 * 1024,
        max_map_size=settings.max_map_size_mb * 1024 * 1024,
    )


def prepare_data_dir(storage: Storage, settings: Settings, now_ms: int) -> None:
    """The start-up writes before anything serves: the tenants (demo, file), the
    account suspensions an older version's imports left per key, and the
    period this directory began counting served overage in."""
    # First: a refusal must leave the directory as it was (and before any worker seals).
    settle_key_file(storage, key_file_path(settings))
    if settings.demo_tenant:
        import_tenants(storage, DEMO_TENANTS)
    else:
        _warn_of_demo_keys(storage)
    if settings.tenants:
        # start-up, before anything serves: a blocking read is fine here
        imported = import_tenants(storage, Path(settings.tenants).read_bytes())
        for note in imported_term_notes(storage, imported):  # what `tenants import` prints
            log.warning("tenants file %s: %s", settings.tenants, note)
    settle_account_suspension(storage)  # (idempotent: writes only what an older import left)
    mark_overage_counting(storage, billing_period(now_ms))


def _warn_of_demo_keys(storage: Storage) -> None:
    """The demo tenant's keys are published in the README: say so when an earlier --demo left them live."""
    from collector.tenants_admin import live_keys_among

    live = live_keys_among(storage, DEMO_KEYS)
    if live:
        log.warning(
            "the demo tenant's public keys are live in this data directory (%s): anyone can write with"
            " them; revoke each with `collector keys revoke KEY`",
            ", ".join(live),
        )


def bot_classifier(settings: Settings) -> BotClassifier:
    """The classifier with the operator's datacenter networks (start-up; blocking reads are fine)."""
    if not settings.datacenter_cidrs_file:
        return BotClassifier()
    try:
        return BotClassifier(load_cidrs(settings.datacenter_cidrs_file))
    except (OSError, ValueError) as exc:
        raise SettingsError(f"datacenter_cidrs_file: {exc}") from None


def trusted_proxies(settings: Settings) -> TrustedProxies:
    return _networks("trusted_proxies", settings.trusted_proxies)


def metrics_readers(settings: Settings) -> TrustedProxies:
    """The networks whose clients may read /metrics (a set of networks, as trusted_proxies is)."""
    return _networks("metrics_from", settings.metrics_from)


def _networks(setting: str, cidrs: list[str]) -> TrustedProxies:
    try:
        return TrustedProxies(cidrs)
    except ValueError as exc:
        raise SettingsError(f"{setting}: {exc}") from None


def build_services(
    settings: Settings,
    storage: Storage,
    clock: Callable[[], float] = wall_clock,
    *,
    worker_index: int = 0,
    steady: Callable[[], float] = boot_seconds,
) -> Services:
    """`steady`: seconds that pass at real speed, against which `clock` is checked for
    the ages the writer judges (storage/age_clock.py)."""
    metrics = Metrics()
    with storage.read() as txn:  # where the last process of this boot left the clock (storage/age_clock.py)
        seed = decode_anchor(txn.get(ANCHOR_KEY, db=storage.dbs.meta), boot_id())
    age_clock = AgeClock(lambda: int(clock() * 1000), steady, seed=seed)
    shared = SharedClock(age_clock, boot_id(), decides=worker_index == 0)
    writer = GroupCommitWriter(
        storage,
        max_queue=settings.writer_max_queue,
        max_group=settings.writer_max_group,
        clock_ms=age_clock,
        txn_clock=partial(shared.now_in, meta_db=storage.dbs.meta),
        on_commit=metrics.on_commit,
    )
    # Every worker folds its own groups into the visitor records as it commits
    # them; worker 0's VisitorProjection only catches up what that skipped.
    commit_fold = FoldAtCommit()
    writer.at_commit = commit_fold
    keys = KeyCache(storage, ttl=settings.key_cache_ttl, negative_ttl=settings.key_negative_ttl)
    services = Services(
        sealer=serving_sealer(storage, key_file_path(settings)),
        bots=bot_classifier(settings),
        proxies=trusted_proxies(settings),
        metrics_readers=metrics_readers(settings),
        settings=settings,
        storage=storage,
        writer=writer,
        commit_fold=commit_fold,
        keys=keys,
        # one request-rate partition per worker process (see collector/limits/buckets.py)
        limiter=RateLimiter(partitions=settings.workers),
        metrics=metrics,
        # (receipt times, billing periods, signature and rate windows: the wall clock. On the
        # guarded one, each worker's own ten minutes of distrust split billing periods and
        # re-dated consent decisions between workers: helper-112)
        clock=clock,
        worker_index=worker_index,
        workers=settings.workers,
    )
    metrics.add_gauges(lambda: _process_gauges(services))
    metrics.add_gauges(lambda: _node_gauges(services), node=True)
    return services


def _node_gauges(services: Services) -> Iterator[GaugeMetricFamily]:
    """The node's storage, outbox and meters: the same whichever worker reads them."""
    yield gauge("collector_workers", "Worker processes serving (serve --workers)", services.workers)
    try:
        read = list(_stored_gauges(services))
    except (StorageError, lmdb.Error) as exc:
        # The rest of the scrape still says what the process knows (an exception here
        # failed the whole of /metrics, which is where an operator looks then).
        _metrics_read_failed("metrics: the storage gauges could not be read: %s", exc, cause=type(exc).__name__)
        read = []
    yield gauge(
        "collector_storage_gauges_read",
        "1 when this scrape read the outbox and meter gauges from storage, 0 when the read failed (the log says why)",
        1 if read else 0,
    )
    yield from read


def _stored_gauges(services: Services) -> Iterator[GaugeMetricFamily]:
    yield gauge("collector_outbox_last_seq", "Sequence number of the newest outbox entry", last_seq(services.storage))
    with services.storage.read() as txn:
        entries = txn.stat(services.storage.dbs.outbox)["entries"]
    yield gauge("collector_outbox_entries", "Outbox entries kept (retention removes old ones)", entries)
    yield from _meter_gauges(services)


def _process_gauges(services: Services) -> Iterator[Metric]:
    # per process: under `serve --workers N` every worker's, labelled worker="I" (collector/metrics_share.py)
    yield gauge("collector_worker_index", "Index of this worker process (0-based)", services.worker_index)
    yield gauge("collector_build_info", "The collector version this process runs (always 1)", 1, {"version": version()})
    # each process's own view of the map: a worker adopts another's growth at its next transaction
    map_size, used = services.storage.usage()
    yield gauge("collector_lmdb_map_size_bytes", "LMDB map size as this process has it mapped", map_size)
    yield gauge("collector_lmdb_used_bytes", "LMDB pages in use, as this process last saw them", used)
    stats = services.writer.statistics()
    yield gauge("collector_writer_queue_depth", "Jobs waiting for the writer", stats.queued)
    yield gauge("collector_writer_transactions", "Group-commit transactions committed", stats.transactions)
    yield gauge("collector_writer_requests_committed", "Requests committed by the writer", stats.jobs_committed)
    yield gauge("collector_writer_requests_refused", "Requests refused inside admission", stats.jobs_refused)
    yield gauge("collector_writer_requests_failed", "Requests whose commit failed", stats.jobs_failed)
    yield gauge("collector_writer_busy_refusals", "Requests refused because the writer queue was full", stats.busy_refusals)
    yield gauge(
        "collector_writer_healthy",
        "0 from a failed commit until one that stores something (an event, the readiness probe) succeeds",
        1 if services.writer.healthy else 0,
    )
    limits = services.connection_limits
    if limits is not None:
        yield gauge("collector_connections_open", "Connections this process holds", limits.open)
        yield gauge("collector_connections_max", "Connections this process may hold (max_connections)", limits.total)
    yield gauge(
        "collector_log_lines_dropped",
        "Log lines dropped because stderr was not being read, or could not be written (collector/log_sink.py)",
        stderr_sink().dropped,
    )
    yield gauge("collector_lmdb_map_growths", "Times this process doubled the LMDB map", stats.map_growths)
    yield gauge("collector_lmdb_map_adoptions", "Times this process adopted a map another worker grew", stats.map_adoptions)
    fold = services.commit_fold
    yield gauge("collector_visitor_fold_at_commit_groups", "Groups this process folded into visitors as it committed them", fold.groups)
    yield gauge("collector_visitor_fold_at_commit_events", "Outbox entries those groups held", fold.events)
    yield gauge(
        "collector_visitor_fold_at_commit_skipped",
        "Groups left to the catch-up (the visitor cursor was behind them, or events lacked their facts)",
        fold.skipped,
    )
    projection = services.projection.statistics() if services.projection is not None else None
    yield gauge(
        "collector_visitor_records_rebuilt",
        "Visitor records that did not decode, which a fold started afresh from the visitor's new events",
        fold.rebuilt + (projection.rebuilt if projection is not None else 0),
    )
    if projection is not None:
        yield gauge("collector_visitor_projection_cursor", "Last outbox seq folded into visitors", projection.cursor)
        yield gauge(
            "collector_visitor_projection_lag",
            "Committed outbox entries not yet folded into visitors",
            projection.lag,
        )
        yield gauge(
            "collector_visitor_projection_passes",
            "Catch-up fold jobs committed (each counts as a writer job)",
            projection.passes,
        )
    cache = services.keys.statistics()
    yield gauge("collector_key_cache_entries", "Key records cached", cache.entries)
    yield counter("collector_key_cache_hits", "Key lookups answered from the cache", cache.hits)
    yield counter(
        "collector_key_cache_misses", "Key lookups the cache could not answer (read from storage, or no key's length)",
        cache.misses,
    )
    yield counter(
        "collector_key_cache_read_failures",
        "Key lookups whose storage read failed (answered 503, or from a stale entry)",
        cache.read_failures,
    )
    limiter = services.limiter.statistics()
    yield gauge("collector_rate_buckets", "Request-rate buckets held in memory", limiter.buckets)
    yield counter("collector_rate_checks", "Requests checked against a rate bucket", limiter.checks)
    yield counter("collector_rate_refusals", "Requests a rate bucket refused (429 rate_limit_exceeded)", limiter.refusals)
    bots = services.bots.statistics()
    yield counter("collector_bot_agent_cache_hits", "User agents whose bot verdict was cached", bots.cache_hits)
    yield counter("collector_bot_agent_cache_misses", "User agents classified afresh", bots.cache_misses)
    if services.retention is not None:
        yield from _retention_families(services.retention)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """A count that only grows, exposed as NAME_total (the older counts above are gauges)."""
    return CounterMetricFamily(name, documentation, value=value)


def _retention_families(sweep: RetentionSweep) -> Iterator[Metric]:
    """The retention sweep's work (worker 0 only): alert on failures growing or sweeps standing still."""
    stats = sweep.statistics()
    yield counter("collector_retention_sweeps", "Retention sweeps committed", stats.sweeps)
    yield counter("collector_retention_failures", "Retention sweeps that could not commit (the log says why)", stats.failures)
    removed = CounterMetricFamily(
        "collector_retention_removed", "Records the retention sweep removed, by kind", labels=["kind"]
    )
    for kind, count in (("outbox", stats.outbox_removed), ("idempotency", stats.idempotency_removed),
                        ("replay", stats.replay_removed)):  # fmt: skip
        removed.add_metric([kind], count)
    yield removed
    yield gauge("collector_retention_retained_from", "Oldest outbox seq kept after the last sweep", stats.retained_from)


def _meter_gauges(services: Services) -> Iterator[GaugeMetricFamily]:
    """Units used this month per billing account and unit kind."""
    period = billing_period(services.now_ms())
    used = GaugeMetricFamily(
        "collector_meter_used_units",
        "Monthly units used, by billing account and unit (pageview, coverage; pageview_overage and"
        " coverage_overage: the part served as paid overage, which invoices bill)",
        labels=["account", "unit", "period"],
    )
    for account, counter_period, unit, value in iter_counters(services.storage):
        if counter_period == period:
            used.add_metric([account, unit, period], value)
    yield used


def build_asgi(services: Services) -> Router:
    quart = QuartTrio("collector")
    router = Router(quart, services)
    for path, handler in ops_handlers(services).items():
        router.add(path, handler)
    router.add("/v1/events", make_ingest_handler(services, edge=False))
    router.add("/v1/edge/pageview", make_ingest_handler(services, edge=True))
    router.add("/v1/consent", make_ingest_handler(services, edge=False, consent=True))
    router.add("/v1/replay", make_replay_handler(services))
    router.add_prefix(SIGNALS_PREFIX, make_signals_handler(services))
    if services.settings.bench_routes:
        router.add("/_bench/noop", noop_handler)
    return router


async def noop_handler(scope: Scope, receive: Receive, send: Send) -> None:
    """The bench's baseline: drain the body, answer a fixed 202 (the stack's ceiling)."""
    while (await receive()).get("more_body", False):
        pass
    await send_response(send, 202, b'{"success":true}', [])


def hypercorn_config(settings: Settings) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [settings.bind]
    config.graceful_timeout = settings.graceful_timeout
    # hypercorn types it int, but only hands it to trio (as does our Connection): int() made 0.5 mean no timeout
    config.read_timeout = settings.read_timeout  # type: ignore[assignment]
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.keep_alive_max_requests = settings.keep_alive_max_requests
    config.backlog = settings.backlog
    config.accesslog = None  # the router writes its own structured lines
    # No "server: hypercorn-h11" on every response: it advertises the stack and
    # costs h11 one more header to validate per response.
    config.include_server_header = False
    config.errorlog = logging.getLogger("hypercorn.error")
    config.errorlog.addFilter(_HYPERCORN_ERRORS)  # (the same filter once, however many configs)
    return config


_HYPERCORN_ERRORS = OncePerMinute()


async def serve(
    settings: Settings,
    *,
    clock: Callable[[], float] = wall_clock,
    steady: Callable[[], float] = boot_seconds,
    worker_index: int = 0,
    metrics_dir: str | None = None,
    own_process: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled or signalled; reports the bound URLs through task_status.

    With `serve --workers N` (collector/workers.py) this runs in each worker
    process; only worker 0 runs the retention sweep and the outbox consumers
    (the visitor projection): singletons over the shared environment. The
    workers share their metrics through `metrics_dir` (collector/metrics_share.py).
    `own_process`: the process serves and nothing else (`collector serve`, a
    worker), so stop signals that come after the first may be swallowed.
    """
    # The start-up transactions run in a thread: one may wait long for LMDB's
    # writer lock (a command holding it), and a stop signal must still be
    # handled meanwhile, which Python does only on a main thread not blocked in C.
    storage = await trio.to_thread.run_sync(open_storage, settings)
    served = False
    try:
        if settings.workers <= 1:  # (with --workers N the parent did it once: collector/workers.py)
            await trio.to_thread.run_sync(prepare_data_dir, storage, settings, int(clock() * 1000))
        services = build_services(settings, storage, clock, worker_index=worker_index, steady=steady)
        # a trusted proxy's resets are its clients' (no reset budget of its own, as no connection cap)
        h2_protocol.exempt_peers = services.proxies.trusted if services.proxies else h2_protocol.no_exempt_peer
        app = build_asgi(services)
        async with trio.open_nursery() as outer:
            await outer.start(services.writer.run)
            guard = services.writer.clock_ms
            if isinstance(guard, AgeClock) and (worker_index == 0 or not boot_id()):  # (the others follow worker 0)
                outer.start_soon(watch_wall_clock, guard, services.writer.submit)
            if metrics_dir is not None:
                shared = services.metrics.shared = SharedMetrics(metrics_dir, worker_index)
                outer.start_soon(publish_every_second, shared, services.metrics.process_families)
            if settings.access_log:
                outer.start_soon(flush_access_log)
            if worker_index == 0:  # singletons: one per environment, not one per worker
                outer.start_soon(_clear_stale_readers, storage)
                services.projection = VisitorProjection(services.writer)
                await outer.start(services.projection.run)
                sweep = services.retention = RetentionSweep(
                    outbox_retention_ms=int(settings.outbox_retention_hours * 3_600_000),
                    idempotency_window_ms=settings.idempotency_window_ms,
                    consumers=(VISITORS_CURSOR,),  # every outbox consumer registers here
                    replay_retention_ms=int(settings.replay_retention_hours * 3_600_000),
                )
                await outer.start(
                    partial(run_retention, interval_s=settings.retention_interval_s),
                    services.writer,
                    sweep,
                )
            shutdown = trio.Event()
            config = hypercorn_config(settings)
            async with trio.open_nursery() as server_nursery:
                binds = await server_nursery.start(
                    _serve_http, app, config, shutdown
                )
                if own_process:
                    # From here a stop signal is remembered (_watch_signals takes
                    # it up; one that comes between "listening" and its receiver
                    # killed the process), and one after the first changes nothing:
                    # with the default action back once _watch_signals stopped
                    # receiving, it killed the drain or raised KeyboardInterrupt
                    # through the nurseries. While starting, the default action
                    # still ends the process at once.
                    defer_stop_signals()
                for url in binds:
                    announce_listening(url)
                log.info("listening on %s", ", ".join(binds), extra={"fields": _start_facts(settings, storage, worker_index)})
                systemd.notify(f"READY=1\nSTATUS=listening on {', '.join(binds)}")
                interval = systemd.watchdog_interval()
                if interval:
                    outer.start_soon(systemd.watchdog_loop, interval)
                task_status.started(binds)
                served = True
                server_nursery.start_soon(_watch_signals, shutdown)
            # The server has drained; now the writer drains and stops.
            outer.cancel_scope.cancel()
    finally:
        storage.close()
        if served:  # (a start refused, the refusal's own line is the only one: helper-100)
            log.info("storage closed")


STALE_READER_CHECK_S = 30.0


async def _clear_stale_readers(storage: Storage) -> None:
    """At start and every 30 s: free the read slots of dead processes (see Storage.clear_stale_readers)."""
    while True:
        try:
            cleared = storage.clear_stale_readers()
        except StorageError as exc:
            log.error("checking for stale LMDB readers failed: %s", exc)
        else:
            if cleared:
                log.warning("cleared %d stale LMDB reader slot(s) left by processes that died reading", cleared)
        await trio.sleep(STALE_READER_CHECK_S)


# After the last request, how long to wait for a keep-alive client's next one
# (it gets its response, with Connection: close) before closing idle connections.
DRAIN_QUIET_S = 0.1


async def _serve_http(
    app: Router,
    config: HypercornConfig,
    shutdown: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn.trio.serve (its worker_serve, hypercorn/trio/run.py), with a real drain.

    hypercorn's shutdown_trigger closes the listeners and sets the worker's
    `terminated` flag in one step (run.py:112-118), while keep-alive
    connections are mid-cycle: an idle connection is closed even as its next
    request is being read (tcp_server.py:131-140; the request still runs and
    commits), a connection is closed after a response that did not say
    `Connection: close` (h11.py:287-289), and one whose next request was
    already buffered waits on `can_read` (h11.py:174-176) until
    graceful_timeout. Here, on `shutdown`: every request that starts from then
    on is answered with `Connection: close`, the listeners close, and only
    once no request has been in flight for DRAIN_QUIET_S is `terminated` set,
    which closes the idle connections at once (a request that races that close
    is refused by Drain before it can commit). graceful_timeout bounds the
    whole drain.
    """
    services = app.services
    unrouted = UnroutedAnswers(services.metrics, services.settings.access_log)
    drain = Drain(CloseAmbiguouslyFramed(app), unrouted=unrouted)
    asgi = wrap_app(drain, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    config.set_statsd_logger_class(StatsdLogger)
    state: LifespanState = {}
    lifespan = Lifespan(asgi, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        sockets = config.create_sockets()  # plain TCP only: no certificates are configured
        listeners, binds = [], []
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
            listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
            binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
        sends = OpenSends()
        live: set[Connection] = set()  # open connections, told when the drain begins
        connection = services.connection_limits = ConnectionLimits(
            ConnectionGuard(
                partial(
                    Connection, asgi, config, context, ConnectionState(state.copy()),
                    sends=sends, request_timeout=services.settings.request_timeout, unrouted=unrouted,
                    live=live,
                ),
                partial(services.metrics.count_labelled, "collector_connection_failures"),
            ),
            **_connection_caps(services.settings),
            trusted=services.proxies.trusted,
            refused=partial(services.metrics.count_labelled, "collector_connections_refused"),
            unrouted=unrouted,
        )
        async with trio.open_nursery() as deadline_watch:
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(
                        partial(trio.serve_listeners, connection, listeners, handler_nursery=connections)
                    )
                    task_status.started(binds)
                    await shutdown.wait()
                    drain.start_draining()
                    for open_connection in list(live):  # (HTTP/2 clients: no more streams here)
                        connections.start_soon(open_connection.refuse_new_streams)
                    accepting.cancel_scope.cancel()  # closes the listeners
                deadline = services.drain_deadline = trio.current_time() + config.graceful_timeout
                connections.cancel_scope.deadline = deadline
                # (writes are shielded: one to a client that reads nothing outlives the cancel)
                deadline_watch.start_soon(_abandon_at, deadline, sends)
                with trio.move_on_at(deadline):
                    await drain.wait_idle(DRAIN_QUIET_S)
                drain.closing = True
                await context.terminated.set()  # hypercorn closes the idle keep-alive connections
            deadline_watch.cancel_scope.cancel()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def _start_facts(settings: Settings, storage: Storage, worker_index: int) -> dict[str, object]:
    """What an operator reading the start line needs: what runs, where, with how many live keys."""
    from collector.tenants_admin import list_records

    keys = sum(1 for record in list_records(storage, on_unreadable=lambda key, error: None) if not record.revokedAt)
    if not keys and settings.production and worker_index == 0:  # (once, not once a worker)
        log.warning("no live API keys (none imported, or all revoked): every request will be refused 401;"
                    " import a tenants file (`collector tenants import FILE`, or `serve --tenants FILE`)")
    return {"version": version(), "env": settings.env.value, "dataDir": str(storage.path.resolve()), "keys": keys,
            "workers": settings.workers}


def _connection_caps(settings: Settings) -> dict[str, int]:
    total, per_client = default_connection_limits()
    if total < MIN_CONNECTIONS and not settings.max_connections:
        log.warning(
            "this process's file descriptor limit leaves room for only %d connections; raise LimitNOFILE", total
        )
    if settings.max_connections > total:
        log.warning(
            "max_connections %d is more than this process's file descriptor limit allows (%d):"
            " past that, accepting fails with EMFILE instead of a 503; raise LimitNOFILE or lower it",
            settings.max_connections, total,
        )
    total = settings.max_connections or total
    return {"total": total, "per_client": settings.max_connections_per_client or min(per_client, total)}


async def _abandon_at(deadline: float, sends: OpenSends) -> None:
    await trio.sleep_until(deadline)
    sends.abandon()


async def _watch_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        signum = early_stop_signal()  # one that came while the process was starting
        if signum is None:
            signum = await signals.__anext__()
        log.info("received %s: draining", signal.Signals(signum).name)
        systemd.notify("STOPPING=1")
        shutdown.set()
