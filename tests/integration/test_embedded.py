"""The embedded default in-process: a private Redis and two real workers that a call can run
on, all stopped on exit; a clear error when a worker cannot start; no orphans when the
process that started them is SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.support.chaos_support import group_pids
from tests.support.cli_support import REPO_ROOT, cli_env
from tests.support.waiting import until
from toolfleet.cli.batch_file import BatchLine
from toolfleet.cli.batch_runner import run_batch
from toolfleet.embedded import EmbeddedFleet, EmbeddedRedis, live_fleets, resolve_fleet
from toolfleet.schemas.errors import EmbeddedStartError
from toolfleet.schemas.settings import Settings

pytestmark = pytest.mark.slow  # real processes: embedded Redis and workers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture()
def short_dir() -> Iterator[Path]:
    """A directory whose socket paths stay under the 107 bytes a Unix socket may have, however
    deep pytest's own temporary directories are (a parallel run nests them one level more)."""
    with tempfile.TemporaryDirectory(prefix="tf-", dir="/tmp") as name:
        yield Path(name)


def test_embedded_fleet_runs_calls_and_stops_every_process(short_dir: Path) -> None:
    tmp_path = short_dir
    base = Settings(run_dir=str(tmp_path / "tf"))
    # Left by a toolfleet that was SIGKILLed (pid beyond pid_max: never alive).
    stale = tmp_path / "tf" / "run" / "999999999"
    stale.mkdir(parents=True)
    (stale / "broker_url").write_text("redis+socket:///nowhere/redis.sock")
    fleet = EmbeddedFleet(tools=["tests.support.sample_tools"], base=base)
    with fleet as settings:
        assert not stale.exists()
        assert settings.broker_url == f"redis+socket://{fleet.redis.socket_path}"
        assert fleet.redis.socket_path.parent == fleet.run_dir
        assert settings.tools == ("tests.support.sample_tools",)
        assert redis.Redis(unix_socket_path=str(fleet.redis.socket_path)).ping()
        assert stat.S_IMODE(fleet.redis.socket_path.stat().st_mode) == 0o700
        pids = fleet.pids()
        assert len(pids) == 3 and all(_alive(pid) for pid in pids)
        groups = {proc.pid for proc in fleet.workers.values()}
        # The sync worker's prefork pool runs in its group: leader + 2 processes.
        assert len(group_pids(*groups, live_only=True)) >= 4
        assert [pid for pid, _ in live_fleets(base)] == [os.getpid()]
        lines = [
            BatchLine(1, "add", {"a": 2, "b": 3}),
            BatchLine(2, "whoami_async", {}),
            BatchLine(3, "whoami", {}),
        ]
        result = asyncio.run(run_batch(lines, settings=settings))
        add, async_who, sync_who = result.records
        assert add.outcome == "done" and add.output == 5
        # Sync and async tools ran in the workers, neither in this process.
        assert async_who.output["pid"] == fleet.workers["async"].pid
        assert sync_who.output["pid"] not in (os.getpid(), fleet.workers["sync"].pid)
    for pid in pids:
        until(lambda pid=pid: not _alive(pid), timeout_s=5, what=f"pid {pid} to exit")
    assert group_pids(*groups, live_only=True) == set()
    assert list(live_fleets(base)) == []
    # The data survives for the next run; the per-run directory does not.
    assert (tmp_path / "tf" / "embedded" / "dump.rdb").exists()
    assert not fleet.run_dir.exists()


def test_a_worker_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    base = Settings(run_dir=str(tmp_path / "tf"))
    fleet = EmbeddedFleet(tools=["no_such_tool_module_xyz"], base=base, ready_timeout_s=30)
    with pytest.raises(EmbeddedStartError) as caught:
        fleet.start()
    message = str(caught.value)
    assert "worker" in message and str(fleet.run_dir) in message
    assert "no_such_tool_module_xyz" in message  # the log's tail says what went wrong
    assert fleet.pids() == []
    assert fleet.run_dir.exists()  # kept: the message points at its logs


def test_a_socket_path_too_long_falls_back_to_a_loopback_port(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    server = EmbeddedRedis(run_dir=deep)
    url = server.start()
    try:
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1" and parts.password
        assert redis.Redis.from_url(url).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=parts.port).ping()
    finally:
        server.stop()
    assert server.pid is None


def test_resolve_fleet_uses_the_external_broker_when_set(redis_url: str) -> None:
    env = {"TOOLFLEET_BROKER_URL": redis_url, "TOOLFLEET_TOOLS": "a"}
    with resolve_fleet(["b"], environ=env) as settings:
        assert settings.broker_url == redis_url
        assert settings.tools == ("a", "b")


_STARTER = textwrap.dedent(
    """
    import sys, time
    from toolfleet.embedded import EmbeddedFleet
    from toolfleet.schemas.settings import Settings
    fleet = EmbeddedFleet(tools=["tests.support.sample_tools"], base=Settings(run_dir=sys.argv[1]))
    fleet.start()
    groups = [p.pid for p in fleet.workers.values()]
    print(" ".join(map(str, [*groups, fleet.redis.pid])), flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_parent_leaves_no_orphans(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path / "tf")],
        cwd=REPO_ROOT,
        env=cli_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        *groups, redis_pid = map(int, line.split())
        assert len(group_pids(*groups, live_only=True)) >= 4 and _alive(redis_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        until(
            lambda: not group_pids(*groups, live_only=True) and not _alive(redis_pid),
            timeout_s=10,
            what="the workers, their pool and redis to die with their parent",
        )
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
