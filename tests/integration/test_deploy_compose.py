"""docker-compose.yml and deploy/Dockerfile stay runnable against the installed package.

No Docker engine runs here, so the compose file is checked by loading it and parsing every
service's command with the real ``toolfleet`` parser (and running it with ``--help``): a
renamed subcommand or option breaks this test, not a deployment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolfleet.cli import build_parser
from toolfleet.schemas.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# What an operator puts in .env; everything else falls back to the file's defaults.
ENV = {"REDIS_PASSWORD": "compose-test-pw", "FLOWER_BASIC_AUTH": "ops:compose-test-pw"}
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` substitution."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        current = env.get(name)
        if op in (":-", "-"):
            return current if current else arg
        if op in (":?", "?") and not current:
            raise AssertionError(f"compose would refuse to start: {name} unset ({arg})")
        return current or ""

    return _VARIABLE.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return dict(interpolate(loaded, ENV))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def toolfleet_services(
    services: dict[str, dict[str, Any]], profile: str | None = None
) -> list[str]:
    """The services running toolfleet: the default stack's, or those of ``profile``."""
    return [
        name
        for name, spec in services.items()
        if spec.get("command", [""])[0] == "toolfleet"
        and (profile in spec["profiles"] if "profiles" in spec else profile is None)
    ]


def test_compose_has_the_fleet_services(services: dict[str, dict[str, Any]]) -> None:
    assert {"redis", "worker-sync", "worker-async", "flower", "demo"} <= set(services)
    assert set(toolfleet_services(services)) == {"worker-sync", "worker-async", "flower", "demo"}


@pytest.mark.parametrize("service", ["worker-sync", "worker-async", "flower", "demo"])
def test_each_service_command_parses_with_the_installed_cli(
    services: dict[str, dict[str, Any]], service: str
) -> None:
    command = [str(part) for part in services[service]["command"]]
    assert command[0] == "toolfleet"
    # Full parse, not just --help: argparse stops at --help before rejecting unknown options.
    try:
        args = build_parser().parse_args(command[1:])
    except SystemExit as exc:
        pytest.fail(f"{service}: `{' '.join(command)}` is rejected by toolfleet (exit {exc.code})")
    assert getattr(args, "func", None) is not None, f"{service}: {command} names no subcommand"

    result = subprocess.run(
        [sys.executable, "-m", "toolfleet.cli", *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{service}: {command} --help failed:\n{result.stderr}"
    assert "usage: toolfleet " + command[1] in result.stdout


def test_worker_kinds_and_flower_binding(services: dict[str, dict[str, Any]]) -> None:
    sync_args = build_parser().parse_args(services["worker-sync"]["command"][1:])
    async_args = build_parser().parse_args(services["worker-async"]["command"][1:])
    assert sync_args.kind == "sync"
    assert async_args.kind == "async"
    flower_args = build_parser().parse_args(services["flower"]["command"][1:])
    assert flower_args.port == 5555
    # Inside the container it must listen beyond loopback for the published port to work.
    assert flower_args.address == "0.0.0.0"


def test_toolfleet_environment_names_are_settings(services: dict[str, dict[str, Any]]) -> None:
    for name in toolfleet_services(services):
        env = services[name].get("environment", {})
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        settings_env = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
        assert f"{ENV_PREFIX}BROKER_URL" in settings_env, f"{name} has no broker"
        # Settings.from_env rejects unknown values; unknown names would be silently ignored.
        for key in settings_env:
            field = key.removeprefix(ENV_PREFIX).lower()
            assert field in Settings.model_fields, f"{name}: {key} is not a toolfleet setting"
        settings = Settings.from_env(settings_env)
        assert settings.broker_url == "redis://:compose-test-pw@redis:6379/0"


def test_redis_is_private_password_protected_and_health_checked(
    services: dict[str, dict[str, Any]],
) -> None:
    redis = services["redis"]
    assert "ports" not in redis, "Redis must not be published by default"
    assert redis["environment"]["REDIS_PASSWORD"] == ENV["REDIS_PASSWORD"]
    assert "--requirepass" in " ".join(redis["command"])
    assert "redis-cli" in redis["healthcheck"]["test"]
    for name in toolfleet_services(services):
        depends_on = services[name]["depends_on"]
        assert depends_on["redis"]["condition"] == "service_healthy", name


def test_workers_scale_and_flower_is_authenticated(services: dict[str, dict[str, Any]]) -> None:
    for name in ("worker-sync", "worker-async"):
        # A fixed container name or host port would make `--scale` fail.
        assert "container_name" not in services[name]
        assert "ports" not in services[name]
    flower = services["flower"]
    user, _, password = flower["environment"]["FLOWER_BASIC_AUTH"].partition(":")
    assert user and password
    assert any(str(port).endswith(":5555") for port in flower["ports"])
    assert services["demo"]["restart"] == "no"


def test_compose_refuses_to_start_without_the_passwords() -> None:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    for missing in ENV:
        env = {k: v for k, v in ENV.items() if k != missing}
        with pytest.raises(AssertionError, match=missing):
            interpolate(loaded, env)


def test_dockerfile_is_slim_non_root_and_installs_the_repository() -> None:
    text = DOCKERFILE.read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert bases and all(base.startswith("python:") and base.endswith("-slim") for base in bases)
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    for source in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", text, flags=re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists() or path == "README.md", f"COPY {path}: not in the repo"
    assert re.search(r"pip (wheel|install)\b.*\s\.$", text, flags=re.MULTILINE)
    # Every package the distribution declares is copied into the build.
    assert {"schemas", "dispatcher", "workers"} <= set(re.findall(r"^COPY (\w+) ", text, re.M))


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="no docker compose client on this machine",
)
def test_docker_compose_config_is_valid() -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", **ENV},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


SENTINEL_CONF = ROOT / "deploy" / "sentinel" / "sentinel.conf"


def test_the_sentinel_profile_runs_a_primary_a_replica_three_sentinels_and_workers(
    services: dict[str, dict[str, Any]],
) -> None:
    """``docker compose --profile sentinel``: the workers know only the sentinels and the
    primary's name, which is the one deploy/sentinel/sentinel.conf monitors with quorum 2."""
    monitor = re.search(
        r"^sentinel monitor (\S+) (\S+) (\d+) (\d+)$", SENTINEL_CONF.read_text(), re.M
    )
    assert monitor, "deploy/sentinel/sentinel.conf has no `sentinel monitor` line"
    name, host, port, quorum = monitor.groups()
    assert (host, port, quorum) == ("redis-primary", "6379", "2")
    profiled = {n for n, spec in services.items() if "sentinel" in spec.get("profiles", [])}
    sentinels = {"sentinel-1", "sentinel-2", "sentinel-3"}
    assert {"redis-primary", "redis-replica", *sentinels} <= profiled
    assert "--replicaof redis-primary 6379" in services["redis-replica"]["command"][-1]
    for data in ("redis-primary", "redis-replica"):
        assert "--appendfsync always" in services[data]["command"][-1]
        assert "ports" not in services[data]
    for sentinel in sentinels:
        assert services[sentinel]["environment"]["SENTINEL_HOSTNAME"] == sentinel
        mounted = " ".join(services[sentinel]["volumes"])
        assert "deploy/sentinel/sentinel.conf" in mounted and "sentinel-entrypoint.sh" in mounted
    assert (ROOT / "deploy" / "sentinel" / "sentinel-entrypoint.sh").exists()
    workers = toolfleet_services(services, "sentinel")
    assert set(workers) == {"worker-sync-sentinel", "worker-async-sentinel"}
    for worker in workers:
        settings = Settings.from_env(services[worker]["environment"])
        assert settings.sentinel_master == name
        assert settings.broker_url == (
            "sentinel://:compose-test-pw@sentinel-1:26379/0;"
            "sentinel://sentinel-2:26379;sentinel://sentinel-3:26379"
        )
        args = build_parser().parse_args([str(p) for p in services[worker]["command"][1:]])
        assert args.kind in ("sync", "async")
