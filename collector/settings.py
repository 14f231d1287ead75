"""Settings from flags, a TOML file and the environment, as one msgspec Struct.

Precedence: command-line flags, then the `--config` TOML file (snake_case
keys), then `COLLECTOR_<NAME>` environment variables, then the defaults below.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec


class Environment(enum.StrEnum):
    PRODUCTION = "production"
    DEVELOPMENT = "development"


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    data_dir: str = "./data"
    bind: str = "127.0.0.1:8080"
    env: Environment = Environment.PRODUCTION
    tenants: str | None = None
    trusted_origin: list[str] = []
    # bot classification: a text file of datacenter CIDRs, one a line (see load_cidrs)
    datacenter_cidrs_file: str | None = None
    # load balancers whose X-Forwarded-For names the visitor (CIDRs)
    trusted_proxies: list[str] = []
    # access: key cache (spec 5.6)
    key_cache_ttl: Annotated[float, msgspec.Meta(ge=0)] = 120.0
    key_negative_ttl: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # privacy: the field-encryption key file (default: field-keys.json in data_dir)
    field_key_file: str | None = None
    # ingest
    idempotency_window_hours: Annotated[float, msgspec.Meta(ge=24)] = 7 * 24.0
    # retention (outbox entries also wait for every registered consumer)
    outbox_retention_hours: Annotated[float, msgspec.Meta(gt=0)] = 7 * 24.0
    retention_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # session-replay chunks (POST /v1/replay) older than this are swept
    replay_retention_hours: Annotated[float, msgspec.Meta(gt=0)] = 30 * 24.0
    # storage
    map_size_mb: Annotated[int, msgspec.Meta(ge=1)] = 64
    max_map_size_mb: Annotated[int, msgspec.Meta(ge=1)] = 1024 * 1024
    writer_max_queue: Annotated[int, msgspec.Meta(ge=1)] = 2048
    writer_max_group: Annotated[int, msgspec.Meta(ge=1)] = 256
    # HTTP server
    graceful_timeout: Annotated[float, msgspec.Meta(ge=0, le=9)] = 8.0
    read_timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    keep_alive_timeout: Annotated[float, msgspec.Meta(gt=0)] = 75.0
    keep_alive_max_requests: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    backlog: Annotated[int, msgspec.Meta(ge=1)] = 1024
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


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in FIELDS:
        raw = environ.get(f"COLLECTOR_{name.upper()}")
        if raw is None:
            continue
        values[name] = raw.split(",") if name in ("trusted_origin", "trusted_proxies") else raw
    return values


def load_settings(
    flags: Mapping[str, Any],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """Merge the three sources; raises SettingsError naming a bad or unknown field."""
    merged: dict[str, Any] = _from_environment(environ)
    if config_file:
        try:
            with open(config_file, "rb") as handle:
                merged.update(tomllib.load(handle))
        except OSError as exc:
            raise SettingsError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {config_file} is not valid TOML: {exc}") from None
    merged.update({k: v for k, v in flags.items() if v is not None and v != []})
    try:
        # strict=False lets environment strings become numbers and booleans
        settings = msgspec.convert(merged, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid setting: {exc}") from None
    _check_bind(settings.bind)
    return settings


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
