"""What toolfleet changes in Celery and kombu themselves (workers/celery_internals.py) it changes
when a worker starts, in the worker's process only: importing the dispatcher, the public package
or the app module, creating an app or a Fleet leaves Celery's remote-control table and kombu's
Redis channel as they were; a worker that starts has both patches, and a real ``toolfleet
worker`` answers a monitor's ``enable_events`` with its lease."""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from tests.support.fleet import REPO_ROOT, WorkerProcess, start_worker
from tests.support.waiting import until
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.workers.app import create_app
from toolfleet.workers.monitor import live_leases

_PROBE = """
import json, sys
from celery.worker.control import Panel
from kombu.transport import redis as kombu_redis

def patched():
    from toolfleet.workers import celery_internals
    return {
        "enable_events": Panel.data["enable_events"] is celery_internals._enable_events,
        "connparams": kombu_redis.Channel._connparams is celery_internals._connparams,
    }

celery_enable_events = Panel.data["enable_events"]
kombu_connparams = kombu_redis.Channel._connparams
import toolfleet, toolfleet.dispatcher, toolfleet.workers.app
from toolfleet.dispatcher import Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.workers.app import create_app

settings = Settings(broker_url=sys.argv[1])
app = create_app(settings)
Fleet(settings)
seen = {
    "untouched": Panel.data["enable_events"] is celery_enable_events
    and kombu_redis.Channel._connparams is kombu_connparams,
    "after_create_app": patched(),
}
# What `toolfleet worker` and `celery -A toolfleet.workers.app worker` build: its worker_init
# applies the patches (the worker is set up, not run).
app.WorkController(hostname="probe@localhost", pool="solo", without_heartbeat=True)
seen["after_worker_start"] = patched()
print(json.dumps(seen))
"""


def test_importing_or_creating_an_app_patches_nothing_and_a_started_worker_does(
    redis_url: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, redis_url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["untouched"], "importing toolfleet changed Celery's or kombu's tables"
    assert seen["after_create_app"] == {"enable_events": False, "connparams": False}
    assert seen["after_worker_start"] == {"enable_events": True, "connparams": True}


def test_a_started_worker_takes_a_monitors_lease(
    broker: object, workers: list[WorkerProcess]
) -> None:
    url: str = broker.url  # type: ignore[attr-defined]
    worker = start_worker("sync", redis_url=url, concurrency=1)
    workers.append(worker)
    app = create_app(Settings(broker_url=url))
    client = redis.Redis.from_url(url)
    try:
        app.control.enable_events()  # what Flower broadcasts
        until(
            lambda: worker.hostname in live_leases(client, Keys().monitor()),
            timeout_s=15,
            what=f"{worker.hostname} to record a monitor lease",
        )
    finally:
        client.close()
        app.close()
