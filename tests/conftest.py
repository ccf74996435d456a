"""Shared fixtures: a private Redis database for the test session, cleaned up afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

REDIS_HOST = os.environ.get("TOOLFLEET_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TOOLFLEET_TEST_REDIS_PORT", "6379"))
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
