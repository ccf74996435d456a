"""A dead worker's calls are redelivered within the visibility timeout's scale.

kombu sweeps unacknowledged messages back to their queue under a Redis lock. A worker
SIGKILLed while it held that lock blocked every other worker's sweep until the lock expired —
kombu's default is 300 s — so a batch waited five minutes for a dead worker's calls
(``python -m bench.chaos``: 2,000 async calls, 10 kills, 50 calls stuck in ``unacked``).
The sweep's interval and lock now follow TOOLFLEET_VISIBILITY_TIMEOUT_S; this checks that the
channel kombu really opens carries them.
"""

from __future__ import annotations

import pytest

from toolfleet.schemas.settings import Settings
from toolfleet.workers.app import create_app


@pytest.mark.parametrize(
    ("visibility_timeout_s", "interval_s", "lock_s"),
    [(5.0, 2.5, 5), (60.0, 10.0, 30), (3600.0, 10.0, 300)],
)
def test_the_unacked_sweep_and_its_lock_follow_the_visibility_timeout(
    redis_url: str, visibility_timeout_s: float, interval_s: float, lock_s: int
) -> None:
    app = create_app(Settings(broker_url=redis_url, visibility_timeout_s=visibility_timeout_s))
    try:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            assert channel.visibility_timeout == visibility_timeout_s
            assert channel.unacked_restore_interval == interval_s
            # A killed worker's lock blocks the others' sweeps for at most this long.
            assert channel.unacked_mutex_expire == lock_s
    finally:
        app.close()
