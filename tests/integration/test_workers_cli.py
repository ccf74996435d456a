"""``toolfleet worker``: configuration errors, and warm shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import redis

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import REPO_ROOT, WorkerProcess, collect_replies, make_call, start_worker
from tests.support.waiting import until
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.app import create_app
from toolfleet.workers.registry import registry


def _toolfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "toolfleet"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return subprocess.run(
        [str(script), *args],
        env={**clean, **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_broker_url_exits_2_naming_the_variable() -> None:
    proc = _toolfleet("worker", "--kind", "sync", env={})
    assert proc.returncode == 2
    assert "TOOLFLEET_BROKER_URL" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_bad_tool_module_exits_2_naming_it(redis_url: str) -> None:
    proc = _toolfleet(
        "worker",
        "--kind",
        "async",
        "--tools",
        "no_such_tools_mod",
        env={"TOOLFLEET_BROKER_URL": redis_url},
    )
    assert proc.returncode == 2
    assert "no_such_tools_mod" in proc.stderr and "TOOLFLEET_TOOLS" in proc.stderr


def test_help_explains_the_defaults() -> None:
    proc = _toolfleet("worker", "--help", env={})
    assert proc.returncode == 0
    assert "processes per CPU" in proc.stdout and "coroutines in flight" in proc.stdout
    assert "toolfleet worker --kind async" in proc.stdout


def test_sigterm_is_a_warm_shutdown_that_finishes_running_calls(
    redis_url: str, redis_client: redis.Redis
) -> None:
    # Its own worker on its own queue (not the session's) so it can be stopped mid-call.
    queue = f"toolfleet.async.warm-{uuid.uuid4().hex[:8]}"
    worker = start_worker(
        "async", redis_url=redis_url, concurrency=10, env={"TOOLFLEET_ASYNC_QUEUE": queue}
    )
    app = create_app(Settings(broker_url=redis_url, async_queue=queue))
    try:
        reply_to = "toolfleet:reply:test-warm-shutdown"
        message = make_call("sleep_async", {"seconds": 1.5}, reply_to=reply_to)
        publish_calls(app, [(message, registry.get("sleep_async"))])
        until(
            lambda: redis_client.exists(Keys().started(message.call_id)),
            timeout_s=15,
            what="the call to start",
        )
        os.kill(worker.pid, signal.SIGTERM)
        assert worker.process.wait(30) == 0
        (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=5)
        assert result.status is EventStatus.COMPLETED
        assert result.worker == worker.hostname
    finally:
        worker.stop()
        app.close()


def test_plain_celery_runs_the_app_with_the_asyncio_pool(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """``celery -A toolfleet.workers.app worker -P custom`` works as a Celery user expects."""
    queue = f"toolfleet.async.plain-{uuid.uuid4().hex[:8]}"
    hostname = f"plain-{uuid.uuid4().hex[:8]}@localhost"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(
        TOOLFLEET_BROKER_URL=redis_url,
        TOOLFLEET_TOOLS="tests.support.sample_tools",
        TOOLFLEET_ASYNC_QUEUE=queue,
        CELERY_CUSTOM_WORKER_POOL="toolfleet.workers.aio_pool:AsyncioPool",
        PYTHONPATH=str(REPO_ROOT),
    )
    log_path = tmp_path / "celery.log"
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "toolfleet.workers.app",
        "worker",
        "-P",
        "custom",
    ]
    command += ["-Q", queue, "-c", "20", "-n", hostname]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = WorkerProcess("async", hostname, process, log_path)
    app = create_app(Settings(broker_url=redis_url, async_queue=queue))
    try:
        until(
            lambda: (
                process.poll() is None and app.control.ping(destination=[hostname], timeout=0.5)
            ),
            timeout_s=60,
            what=f"celery worker {hostname} to answer (log: {log_path})",
        )
        reply_to = "toolfleet:reply:test-plain-celery"
        message = make_call("whoami_async", {}, reply_to=reply_to)
        publish_calls(app, [(message, registry.get("whoami_async"))])
        (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
        assert result.status is EventStatus.COMPLETED
        assert result.worker == hostname
        assert result.execution["response"]["pid"] == process.pid
    finally:
        worker.stop()
        app.close()
