"""C10: what Flower shows. Flower folds task events into celery.events.state.State; so does
this test, from the real events of real workers."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.events.state import State

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import WorkerProcess, collect_replies, make_call, run_calls
from tests.support.waiting import until
from toolfleet.dispatcher.send.cancel import cancel_running
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.monitor import live_leases, monitor_key
from toolfleet.workers.registry import registry


@pytest.fixture()
def flower_state(
    celery_app: Celery,
    redis_client: redis.Redis,
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
) -> Iterator[State]:
    """Task events captured from the broker as Flower captures them."""
    state = State()
    events: list[dict[str, object]] = []
    state.toolfleet_events = events  # type: ignore[attr-defined]
    receivers: list[object] = []
    probes_seen = threading.Event()

    def handle(event: dict[str, object]) -> None:
        if event.get("type") == "toolfleet-probe":
            probes_seen.set()
            return
        events.append(event)
        state.event(event)

    def capture() -> None:
        with celery_app.connection() as conn:
            receiver = celery_app.events.Receiver(conn, handlers={"*": handle})
            receivers.append(receiver)
            # Blocks; checks should_stop about once a second.
            receiver.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    # Pub/sub events are not replayed: probe until the receiver is surely subscribed.
    with celery_app.events.default_dispatcher() as dispatcher:
        until(
            lambda: dispatcher.send("toolfleet-probe") or probes_seen.wait(0.2),
            timeout_s=10,
            what="the event receiver to subscribe",
        )
    # Like Flower, ask the workers for task events (off until a monitor asks, C10), and
    # wait until both hold the lease, so every event of the test's calls is sent.
    celery_app.control.enable_events()
    until(
        lambda: (
            {sync_worker.hostname, async_worker.hostname}
            <= set(live_leases(redis_client, monitor_key(celery_app)))
        ),
        timeout_s=10,
        what="both workers to take the monitor lease",
    )
    yield state
    for receiver in receivers:
        receiver.should_stop = True  # type: ignore[attr-defined]
    thread.join(10)


def _flower_task(state: State, task_id: str, final: str) -> object:
    return until(
        lambda: (t := state.tasks.get(task_id)) is not None and t.state == final and t,
        timeout_s=15,
        what=f"Flower state {final} for {task_id}",
    )


def test_flower_shows_each_call_named_for_its_tool_with_the_matching_state(
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    flower_state: State,
) -> None:
    secret = "sk-flower-must-not-see"
    ok, failed, async_failed = run_calls(
        celery_app,
        redis_client,
        [
            ("with_secret", {"query": "q", "api_key": secret}),
            ("fail", {"message": "bad input 7"}),
            ("fail_async", {"message": "bad async 8"}),
        ],
    )
    task = _flower_task(flower_state, ok.call_id, "SUCCESS")
    assert task.name == "tool:with_secret"  # type: ignore[attr-defined]
    # Every event naming the call (task-sent from the publisher, task-received from the
    # worker) names the tool, so Flower's name does not depend on event order.
    names = {
        e["name"]
        for e in flower_state.toolfleet_events  # type: ignore[attr-defined]
        if e.get("uuid") == ok.call_id and e.get("name")
    }
    assert names == {"tool:with_secret"}
    types = {
        e["type"]
        for e in flower_state.toolfleet_events  # type: ignore[attr-defined]
        if e.get("uuid") == ok.call_id
    }
    assert {"task-sent", "task-received", "task-started", "task-succeeded"} <= types
    assert "***" in task.args and secret not in task.args  # type: ignore[attr-defined]
    assert secret not in str(task.result)  # type: ignore[attr-defined]
    for result, text in ((failed, "bad input 7"), (async_failed, "bad async 8")):
        assert result.status is EventStatus.FAILED
        task = _flower_task(flower_state, result.call_id, "FAILURE")
        assert task.exception == f"ValueError('{text}')"  # type: ignore[attr-defined]
        assert task.name == f"tool:{result.function}"  # type: ignore[attr-defined]


def test_flower_shows_a_cancelled_call_revoked(
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    flower_state: State,
) -> None:
    reply_to = "toolfleet:reply:test-flower-cancel"
    message = make_call("sleep_async", {"seconds": 60}, reply_to=reply_to)
    publish_calls(celery_app, [(message, registry.get("sleep_async"))])
    until(
        lambda: redis_client.exists(Keys().started(message.call_id)),
        timeout_s=15,
        what="the call to start",
    )
    _flower_task(flower_state, message.call_id, "STARTED")
    cancel_running(celery_app, [message.call_id])
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=10)
    assert result.status is EventStatus.CANCELLED
    _flower_task(flower_state, message.call_id, "REVOKED")
