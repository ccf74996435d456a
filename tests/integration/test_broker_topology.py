"""The broker's persistence and topology as ``toolfleet status`` and ``toolfleet worker`` see
them: a warning (once) for a broker without persistence, "cannot tell" for one that refuses
CONFIG, and the role, replicas and lag of a real primary + replica pair of redis-servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.cli_support import toolfleet
from tests.support.fleet import start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.cli.broker_topology import persistence, persistence_warning, topology


@pytest.fixture()
def pair() -> Iterator[tuple[PrivateRedis, PrivateRedis]]:
    """A primary (no persistence) and a replica following it."""
    primary, replica = PrivateRedis(), PrivateRedis()
    primary.start()
    replica.start()
    try:
        replica.client().replicaof(primary.host, primary.port)

        def online() -> bool:
            info = primary.client().info("replication")
            return int(info.get("connected_slaves", 0)) == 1 and (
                info["slave0"]["state"] == "online"
            )

        until(online, timeout_s=15, what="the replica online")
        yield primary, replica
    finally:
        replica.kill()
        primary.kill()


def _status(url: str, home: Path) -> tuple[dict[str, Any], str]:
    env = {"TOOLFLEET_BROKER_URL": url}
    as_json = toolfleet("status", "--json", "--timeout", "0.3", home=home, env=env)
    assert as_json.returncode == 0, as_json.stderr
    table = toolfleet("status", "--timeout", "0.3", home=home, env={**env, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    return json.loads(as_json.stdout), table.stdout


def test_status_shows_a_primary_its_replica_and_lag_and_warns_without_persistence(
    pair: tuple[PrivateRedis, PrivateRedis], tmp_path: Path
) -> None:
    primary, replica = pair
    primary.client().set("toolfleet:test:x", "1")  # a write for the replica to follow
    status, table = _status(primary.url, tmp_path)
    broker = status["topology"]
    assert broker["role"] == "primary"
    [follower] = broker["replicas"]
    assert follower["address"] == f"127.0.0.1:{replica.port}"
    assert follower["state"] == "online"
    assert follower["lag_s"] >= 0 and follower["lag_bytes"] >= 0
    assert broker["persistence"]["mode"] == "none"
    [warning] = status["warnings"]
    assert "no persistence" in warning and "appendonly yes" in warning
    assert "\n" not in warning and len(warning) < 200  # one line, not a paragraph
    assert "broker: primary" in table
    assert f"127.0.0.1:{replica.port}" in table and "online" in table
    assert "persistence none" in table
    assert table.count("no persistence") == 1
    # The replica's side, read directly (status publishes, which a read-only replica refuses).
    seen = topology(replica.client())
    assert seen["role"] == "replica" and seen["replicas"] == []
    assert seen["primary"]["address"] == f"127.0.0.1:{primary.port}"
    assert seen["primary"]["link"] == "up"


def test_a_persistent_broker_draws_no_warning(tmp_path: Path) -> None:
    for fsync in ("always", "everysec"):
        broker = PrivateRedis(persist=True, fsync=fsync)
        broker.start()
        try:
            status, table = _status(broker.url, tmp_path)
            assert status["warnings"] == []
            assert status["topology"]["persistence"]["mode"] == f"aof-{fsync}"
            assert f"persistence aof-{fsync}" in table
        finally:
            broker.kill()


def test_a_broker_refusing_config_is_named_not_fatal(tmp_path: Path) -> None:
    """As a managed Redis does: CONFIG is not allowed to the fleet's user."""
    broker = PrivateRedis()
    broker.start()
    try:
        broker.client().acl_setuser(
            "fleet",
            enabled=True,
            passwords=["+secret-pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-config"],
        )
        url = f"redis://fleet:secret-pw@127.0.0.1:{broker.port}/0"
        found = persistence(redis.Redis.from_url(url))
        assert found["mode"] == "unknown" and found["source"] == "info"
        assert "CONFIG GET refused" in found["note"]
        status, _table = _status(url, tmp_path)
        [warning] = status["warnings"]
        assert "cannot tell whether the broker" in warning and "CONFIG GET refused" in warning
        assert "secret-pw" not in warning
        assert persistence_warning(found, "b") is not None
    finally:
        broker.kill()


def test_a_worker_on_a_broker_without_persistence_warns_once() -> None:
    broker = PrivateRedis()
    broker.start()
    try:
        worker = start_worker("async", redis_url=broker.url, concurrency=2)
        try:
            said = [line for line in worker.log().splitlines() if "persistence" in line]
            assert len(said) == 1, said  # one line, once
            assert "has no persistence" in said[0] and "set appendonly yes" in said[0]
        finally:
            worker.stop(timeout_s=5)
    finally:
        broker.kill()
