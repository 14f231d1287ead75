"""systemd/collector.service and collector.env: systemd-analyze, the directives we rely on, the settings."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from collector.cli import build_parser
from collector.settings import FIELDS, SettingsError, load_settings

SYSTEMD = Path(__file__).parents[2] / "systemd"
UNIT = SYSTEMD / "collector.service"
VERIFY = SYSTEMD / "verify"


def _ensure_systemd_analyze() -> str | None:
    """None when systemd-analyze is there (installing it as root if apt-get can), else why not."""
    if shutil.which("systemd-analyze"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "systemd-analyze is missing and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "systemd"]
    if subprocess.run(install, capture_output=True, env=env, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
        if result.returncode != 0:
            return "apt-get install systemd failed: " + result.stderr.strip().splitlines()[-1:][0]
    return (
        None if shutil.which("systemd-analyze") else "systemd-analyze still missing after install"
    )


@pytest.fixture(scope="module")
def systemd_analyze() -> None:
    why = _ensure_systemd_analyze()
    if why is not None:
        print(f"skipping: {why}")
        pytest.skip(why)


def run_verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VERIFY), *args], capture_output=True, text=True, timeout=120)


def directives(text: str) -> dict[str, list[str]]:
    """Section.Key -> values in order, as systemd reads them (comments and blanks skipped)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key}", []).append(value)
    return found


def test_unit_passes_systemd_analyze(systemd_analyze: None) -> None:
    result = run_verify()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "collector.service verified" in result.stdout


def test_verify_reports_a_bad_value(systemd_analyze: None, tmp_path: Path) -> None:
    broken = tmp_path / "collector.service"
    broken.write_text(UNIT.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    result = run_verify(str(broken))
    assert result.returncode == 1
    assert "Failed to parse service restart specifier" in result.stdout


def test_verify_reports_lost_hardening(systemd_analyze: None, tmp_path: Path) -> None:
    text = UNIT.read_text()
    for line in (
        "CapabilityBoundingSet=",
        "SystemCallFilter=~@privileged @resources",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "MemoryDenyWriteExecute=yes",
    ):
        text = text.replace(f"\n{line}\n", "\n")
    weakened = tmp_path / "collector.service"
    weakened.write_text(text)
    result = run_verify(str(weakened))
    if "exposure not scored" in result.stderr:
        pytest.skip("this systemd has no `security --offline`: " + result.stderr.strip())
    assert result.returncode == 1 and "exposure above 2.0" in result.stdout


def test_verify_reports_a_missing_executable(systemd_analyze: None, tmp_path: Path) -> None:
    moved = tmp_path / "collector.service"
    moved.write_text(
        UNIT.read_text().replace("/opt/collector/.venv/bin/collector", "/nonexistent/collector")
    )
    result = run_verify(str(moved))
    assert result.returncode == 1 and "/nonexistent/collector" in result.stdout


def test_unit_declares_what_the_collector_relies_on() -> None:
    unit = directives(UNIT.read_text())
    expect = {
        "Service.Type": ["notify"],
        "Service.NotifyAccess": ["main"],
        "Service.WatchdogSec": ["30"],
        "Service.ExecStart": [
            "/opt/collector/.venv/bin/collector serve --config /etc/collector/collector.toml"
        ],
        "Service.EnvironmentFile": ["/etc/collector/collector.env"],
        "Service.DynamicUser": ["yes"],
        "Service.StateDirectory": ["collector"],
        "Service.Restart": ["on-failure"],
        "Service.RestartSec": ["2"],
        "Service.LimitNOFILE": ["65536"],
        "Service.UMask": ["0077"],
        "Service.CapabilityBoundingSet": [""],
        "Service.AmbientCapabilities": [""],
        "Service.RestrictAddressFamilies": ["AF_INET AF_INET6 AF_UNIX"],
        "Service.SystemCallFilter": ["@system-service", "~@privileged @resources"],
        "Service.SystemCallArchitectures": ["native"],
    }
    for key, values in expect.items():
        assert unit.get(key) == values, key
    for flag in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
    ):
        assert unit.get(f"Service.{flag}") == ["yes"], flag
    assert unit["Service.ProtectSystem"] == ["strict"]
    assert "Service.ReadWritePaths" not in unit  # StateDirectory is the only writable path
    # systemd must not kill the drain: graceful_timeout is at most 9 s, exit follows within 10 s
    with pytest.raises(SettingsError, match="graceful_timeout"):
        load_settings({"graceful_timeout": 9.5}, environ={})
    assert int(unit["Service.TimeoutStopSec"][0]) > 10


def test_exec_start_is_a_valid_collector_command() -> None:
    argv = directives(UNIT.read_text())["Service.ExecStart"][0].split()
    assert argv[0].endswith("/bin/collector")
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.config) == ("serve", "/etc/collector/collector.toml")


def test_env_file_sets_known_settings_and_the_state_directory() -> None:
    environ = {}
    for line in (SYSTEMD / "collector.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            environ[name.strip()] = value.strip()
    assert all(n.startswith("COLLECTOR_") and n[10:].lower() in FIELDS for n in environ), environ
    settings = load_settings({}, environ=environ)
    assert settings.data_dir == "/var/lib/collector"  # StateDirectory=collector
    assert settings.production
