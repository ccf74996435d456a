"""What ``toolfleet worker`` says when it starts: the broker URL masked only where it holds a
password, and ``-E`` (which Celery's banner names) is an option that turns task events on."""

from __future__ import annotations

import re

from tests.support.fleet import start_worker
from tests.support.redis_server import PrivateRedis

PASSWORD = "pw-banner-secret"


def _shown_urls(log: str) -> list[str]:
    """The broker URL of the banner's transport line and of "Connected to"."""
    return re.findall(r"(?:transport:\s+|Connected to )(\S+)", log)


def test_a_url_without_a_password_is_shown_as_it_is_and_minus_e_turns_events_on(
    redis_url: str,
) -> None:
    worker = start_worker("async", redis_url=redis_url, concurrency=2, options=["-E"])
    try:
        log = worker.log()
    finally:
        worker.stop(timeout_s=10)
    assert _shown_urls(log) == [redis_url, redis_url], log
    assert ":**@" not in log
    assert re.search(r"task events: ON", log), log


def test_a_password_is_still_masked() -> None:
    broker = PrivateRedis()
    broker.start()
    try:
        broker.client().config_set("requirepass", PASSWORD)
        url = f"redis://:{PASSWORD}@127.0.0.1:{broker.port}/0"
        worker = start_worker("async", redis_url=url, concurrency=2)
        try:
            log = worker.log()
        finally:
            worker.stop(timeout_s=10)
    finally:
        broker.kill()
    assert PASSWORD not in log
    masked = f"redis://:**@127.0.0.1:{broker.port}/0"
    assert _shown_urls(log) == [masked, masked], log
