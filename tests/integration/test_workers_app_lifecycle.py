"""An app's Celery signal handlers are connected once per process and go with
the app (toolfleet.workers.app_signals); closed apps are collected."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

from celery import Celery, signals
from celery.utils.dispatch import Signal

from toolfleet.schemas.settings import Settings
from toolfleet.workers import app_signals
from toolfleet.workers.app import create_app
from toolfleet.workers.app_signals import connect, detach, live_apps

# Every signal a toolfleet app handles.
_SIGNALS = {
    "worker_init": signals.worker_init,
    "worker_ready": signals.worker_ready,
    "worker_shutdown": signals.worker_shutdown,
    "task_revoked": signals.task_revoked,
    "task_failure": signals.task_failure,
}


def toolfleet_receivers(signal: Signal) -> list[Any]:
    """The receivers of ``signal`` defined in toolfleet's packages."""
    found = []
    for _key, receiver in signal.receivers:
        target = receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
        module = getattr(target, "__module__", "") or ""
        if module.startswith("toolfleet."):
            found.append(target)
    return found


def test_ten_apps_closed_are_collected_with_one_receiver_per_signal(redis_url: str) -> None:
    settings = Settings(broker_url=redis_url)
    refs: list[weakref.ReferenceType[Celery]] = []
    apps = [create_app(settings) for _ in range(10)]
    for name, signal in _SIGNALS.items():
        receivers = toolfleet_receivers(signal)
        assert len(receivers) == 1, (
            f"signal {name} has {len(receivers)} toolfleet receivers with ten apps alive: "
            f"{receivers}; toolfleet.workers.app_signals connects one per signal"
        )
    for app in apps:
        refs.append(weakref.ref(app))
        app.close()
        assert app not in live_apps(), "a closed app still has its signal handlers"
    del apps, app
    gc.collect()

    alive = [ref() for ref in refs if ref() is not None]
    assert not alive, (
        f"{len(alive)} of 10 closed apps are still alive; referrers of the first: "
        f"{[type(r).__name__ for r in gc.get_referrers(alive[0])]}"
    )
    for name, signal in _SIGNALS.items():
        receivers = toolfleet_receivers(signal)
        assert len(receivers) <= 1, f"signal {name} has {len(receivers)} toolfleet receivers"
        if not live_apps():
            assert not receivers, f"signal {name} keeps a receiver with no toolfleet app left"


def test_an_app_collected_without_close_drops_its_handlers(redis_url: str) -> None:
    app = create_app(Settings(broker_url=redis_url))
    ref = weakref.ref(app)
    del app
    gc.collect()
    assert ref() is None, "an app nobody holds is kept alive by its signal handlers"
    assert all(live is not None for live in live_apps())


class _Sender:
    """A worker, consumer or task as a signal's sender: what app_signals reads is ``app``."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def test_a_signal_reaches_only_the_handlers_of_its_senders_app(redis_url: str) -> None:
    first, second = Celery(set_as_current=False), Celery(set_as_current=False)
    seen: list[tuple[str, Any]] = []
    connect(first, signals.worker_ready, lambda sender, **_: seen.append(("first", sender)))
    connect(second, signals.worker_ready, lambda sender, **_: seen.append(("second", sender)))
    try:
        sender = _Sender(second)
        signals.worker_ready.send(sender=sender)
        assert seen == [("second", sender)]
        signals.worker_ready.send(sender=_Sender(Celery(set_as_current=False)))
        assert seen == [("second", sender)], "a foreign app's signal reached toolfleet handlers"
    finally:
        # A plain Celery app has no close hook: detach by hand.
        detach(first)
        detach(second)
    assert first not in live_apps() and second not in live_apps()


def test_an_apps_finalizer_run_by_the_collector_inside_connect_does_not_deadlock(
    redis_url: str,
) -> None:
    """The collector may finalize an old app on the thread that is inside connect() (holding
    the registry's lock): the finalizer must get through, not wait on its own thread."""
    app = create_app(Settings(broker_url=redis_url))
    old = create_app(Settings(broker_url=redis_url))
    finalizer = weakref.finalize(old, lambda: None)  # how connect() registered it, in effect
    del old
    outcome: list[str] = []

    def do_nothing(**_: Any) -> None:
        pass

    def run() -> None:
        with app_signals._lock:  # as connect() holds it while it allocates
            gc.collect()  # the old app's real finalizer (_forget) runs here
        connect(app, signals.worker_ready, do_nothing)
        outcome.append("done")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert outcome == ["done"], "connect() deadlocked on its own lock under a collection"
    assert not finalizer.alive
    detach(app)
