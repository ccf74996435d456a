"""The embedded default: a private Redis and local workers, started and stopped by toolfleet.

The command line uses it when ``TOOLFLEET_BROKER_URL`` is unset; a program asks for it
explicitly with ``with Fleet.embedded(tools=[...]) as fleet:``.
"""

from toolfleet.embedded.fleet import (
    BROKER_ENV,
    EmbeddedFleet,
    EmbeddedRedis,
    find_redis_server,
    live_fleets,
    redis_py_url,
    resolve_fleet,
    run_dir,
    running_broker_url,
    saved_data_dirs,
)

__all__ = [
    "BROKER_ENV",
    "EmbeddedFleet",
    "EmbeddedRedis",
    "find_redis_server",
    "live_fleets",
    "redis_py_url",
    "resolve_fleet",
    "run_dir",
    "running_broker_url",
    "saved_data_dirs",
]
