"""Settings from flags, a TOML file and the environment, as one msgspec Struct.

Precedence: command-line flags, then the `--config` TOML file (snake_case
keys), then `COLLECTOR_<NAME>` environment variables, then the defaults below.
"""

from __future__ import annotations

import difflib
import enum
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec


class Environment(enum.StrEnum):
    PRODUCTION = "production"
    DEVELOPMENT = "development"


# Upper bounds: every number must be one the code can use (TOML has inf, and a
# 17-digit map size overflowed LMDB's size type with a traceback).
DAY_S = 86_400.0
TEN_YEARS_H = 10 * 366 * 24.0
MAX_MAP_MB = 1 << 30  # 1 PiB


# loopback, RFC 1918, CGNAT (RFC 6598), IPv6 unique local: where a scraper usually is
PRIVATE_NETWORKS = (
    "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
)


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    data_dir: Annotated[str, msgspec.Meta(min_length=1)] = "./data"
    bind: str = "127.0.0.1:8080"
    env: Environment = Environment.PRODUCTION
    tenants: str | None = None
    trusted_origin: list[str] = []
    # bot classification: a text file of datacenter CIDRs, one a line (see load_cidrs)
    datacenter_cidrs_file: str | None = None
    # load balancers whose X-Forwarded-For names the visitor (CIDRs)
    trusted_proxies: list[str] = []
    # who may read /metrics (CIDRs; the client's address, behind trusted_proxies too):
    # it names every billing account and its usage (helper-101)
    metrics_from: list[str] = msgspec.field(default_factory=lambda: list(PRIVATE_NETWORKS))
    # access: key cache (spec 5.6)
    key_cache_ttl: Annotated[float, msgspec.Meta(ge=0, le=DAY_S)] = 120.0
    key_negative_ttl: Annotated[float, msgspec.Meta(ge=0, le=DAY_S)] = 30.0
    # privacy: the field-encryption key file (default: field-keys.json in data_dir)
    field_key_file: str | None = None
    # ingest
    idempotency_window_hours: Annotated[float, msgspec.Meta(ge=24, le=TEN_YEARS_H)] = 7 * 24.0
    # retention (outbox entries also wait for every registered consumer)
    outbox_retention_hours: Annotated[float, msgspec.Meta(gt=0, le=TEN_YEARS_H)] = 7 * 24.0
    retention_interval_s: Annotated[float, msgspec.Meta(gt=0, le=DAY_S)] = 60.0
    # session-replay chunks (POST /v1/replay) older than this are swept
    replay_retention_hours: Annotated[float, msgspec.Meta(gt=0, le=TEN_YEARS_H)] = 30 * 24.0
    # storage
    map_size_mb: Annotated[int, msgspec.Meta(ge=1, le=MAX_MAP_MB)] = 64
    max_map_size_mb: Annotated[int, msgspec.Meta(ge=1, le=MAX_MAP_MB)] = 1024 * 1024
    writer_max_queue: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 2048
    writer_max_group: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256
    # HTTP server
    graceful_timeout: Annotated[float, msgspec.Meta(ge=0, le=9)] = 8.0
    read_timeout: Annotated[float, msgspec.Meta(gt=0, le=DAY_S)] = 30.0
    request_timeout: Annotated[float, msgspec.Meta(gt=0, le=DAY_S)] = 120.0  # reading one request, in all
    keep_alive_timeout: Annotated[float, msgspec.Meta(gt=0, le=DAY_S)] = 75.0
    keep_alive_max_requests: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 100_000
    backlog: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 1024
    # connections one process holds, in all and from one address; 0: from the file descriptor limit
    max_connections: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 0
    max_connections_per_client: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 0
    access_log: bool = True
    # processes: `serve --workers N` runs N worker processes on one socket and one environment
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # development conveniences
    demo_tenant: bool = False  # import the built-in demo tenant at start-up
    bench_routes: bool = False  # POST /_bench/noop answers a fixed 202 (the bench's baseline)

    @property
    def production(self) -> bool:
        return self.env is Environment.PRODUCTION

    @property
    def idempotency_window_ms(self) -> int:
        return int(self.idempotency_window_hours * 3_600_000)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.bind.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


FIELDS = frozenset(Settings.__struct_fields__)


class SettingsError(ValueError):
    """The settings cannot be used; the message names the field."""


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """A note for each COLLECTOR_* variable that is no setting, which is ignored (helper-119:
    a misspelt COLLECTOR_DATADIR in the unit's env file left the data directory ./data,
    relative to systemd's working directory /, and nothing said why)."""
    known = {f"COLLECTOR_{name.upper()}" for name in FIELDS}
    notes = []
    for variable in sorted(environ):
        if variable.startswith("COLLECTOR_") and variable not in known:
            close = difflib.get_close_matches(variable.removeprefix("COLLECTOR_").lower(), FIELDS, n=1)
            hint = f" (did you mean COLLECTOR_{close[0].upper()}?)" if close else ""
            notes.append(f"environment variable {variable} is not a setting and is ignored{hint}")
    return notes


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in FIELDS:
        raw = environ.get(f"COLLECTOR_{name.upper()}")
        if raw is None:
            continue
        if not raw.strip():
            continue  # set but empty (an env file's NAME=): as if unset, so data_dir is ./data, not "."
        if name in ("trusted_origin", "trusted_proxies", "metrics_from"):
            values[name] = [item.strip() for item in raw.split(",") if item.strip()]
        else:
            values[name] = raw
    return values


def load_settings(
    flags: Mapping[str, Any],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """Merge the three sources; raises SettingsError naming a bad or unknown field."""
    merged: dict[str, Any] = _from_environment(environ)
    # Where each value came from, for the error: an operator command refused for
    # a COLLECTOR_* variable meant for serve must say which variable.
    sources = {name: f"environment variable COLLECTOR_{name.upper()}" for name in merged}
    if config_file:
        try:
            with open(config_file, "rb") as handle:
                from_file = tomllib.load(handle)
        except OSError as exc:
            raise SettingsError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SettingsError(f"config file {config_file} is not valid TOML: {exc}") from None
        merged.update(from_file)
        sources.update(dict.fromkeys(from_file, f"config file {config_file}"))
    from_flags = {k: v for k, v in flags.items() if v is not None and v != []}
    merged.update(from_flags)
    sources.update(dict.fromkeys(from_flags, "the command line"))
    try:
        # strict=False lets environment strings become numbers and booleans
        settings = msgspec.convert(merged, Settings, strict=False)
    except msgspec.ValidationError as exc:
        field = re.search(r"at `\$\.(\w+)|unknown field `(\w+)`", str(exc))
        source = sources.get(field.group(1) or field.group(2)) if field else None
        raise SettingsError(f"invalid setting: {exc}" + (f" (from {source})" if source else "")) from None
    try:
        _check_bind(settings.bind)
    except SettingsError as exc:
        raise SettingsError(f"{exc} (from {sources['bind']})" if "bind" in sources else str(exc)) from None
    if settings.map_size_mb > settings.max_map_size_mb:
        raise SettingsError(
            f"invalid setting: map_size_mb ({settings.map_size_mb}; the default is 64) is over"
            f" max_map_size_mb ({settings.max_map_size_mb})"
        )
    for origin in settings.trusted_origin:
        _check_origin(origin)
    return settings


def _check_origin(origin: str) -> None:
    """A trusted dashboard origin is an origin as browsers send it: scheme://host[:port].

    (A trailing slash is let through; a space, a wildcard, an empty port or a
    host that is not ASCII, which no browser sends in Origin, are not.)
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if (
        not port_ok
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or not origin.isascii()
        or any(char.isspace() or char == "*" for char in origin)
        or parts.netloc.endswith(":")
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
        or parts.password
    ):
        raise SettingsError(
            f"invalid setting: trusted_origin must be scheme://host[:port] (a host in ASCII, punycode"
            f" for others), got {origin!r}"
        )


def _check_bind(bind: str) -> None:
    """HOST:PORT with a port of 0 to 65535 (0: any free port).

    Whether the host resolves is found by `serve` when it binds (cli._probe_listen):
    every other command loads the same settings and must not wait on a DNS lookup.
    """
    if bind.startswith("fd://"):  # a worker process handed its parent's socket
        return
    host, colon, port = bind.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"invalid setting: bind must be HOST:PORT with a port of 0 to 65535, got {bind!r}")


def load_cidrs(path: str) -> list[str]:
    """The networks of a datacenter CIDR file: one IPv4 or IPv6 CIDR a line.

    Blank lines and `#` comments (whole-line or trailing) are skipped. Raises
    ValueError naming the file and line number of a line that is not a
    network, and OSError when the file cannot be read.
    """
    cidrs: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(f"{path}:{number}: not an IP network: {text!r}") from None
            cidrs.append(text)
    return cidrs
