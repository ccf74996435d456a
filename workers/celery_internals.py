"""Everything toolfleet does to Celery beyond its documented API, in one place.

Written against Celery 5.7.0 (kombu 5.7.0, billiard 4.2). Each function here leans on one
internal: a private tuple, a registry Celery keeps for itself, an attribute of the worker's
consumer. ``tests/integration/test_celery_internals.py`` checks every one of them against the
installed Celery and fails naming what changed; when it fails, fix the function here, nowhere else.

What for, in one sentence: a call shows in Flower as ``tool:<function>`` with its own state
(C10), task events cost nothing while no monitor watches, the asyncio pool reports to
Celery as the prefork pool does, and a worker survives its broker restarting.

Nothing here changes Celery or kombu when it is imported, or when an app is created: the two
process-wide patches (the ``enable_events`` remote control command, kombu's Redis channel) are
applied by :func:`patch_worker` when a worker starts (the ``worker_init`` signal,
:mod:`toolfleet.workers.app`), in the worker's process only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from billiard.einfo import ExceptionInfo
from billiard.exceptions import Terminated
from celery import Celery, Task
from celery.app.amqp import AMQP
from celery.utils.saferepr import saferepr
from celery.worker import state as worker_state
from celery.worker.control import Panel
from kombu import Connection
from kombu.transport import redis as kombu_redis

__all__ = [
    "CELERY_WRITTEN_AGAINST",
    "PoolRequest",
    "RevokedIds",
    "cancelled_info",
    "consumed_queues",
    "every",
    "exception_info",
    "install_enable_events",
    "mark_revoked",
    "mask_only_a_password",
    "patch_worker",
    "pool_app_and_hostname",
    "report_failure",
    "report_success",
    "revoked_message",
    "shadow_named_amqp",
    "store_failure",
    "store_success",
    "survive_broker_restart",
    "task_events_off",
]

CELERY_WRITTEN_AGAINST = "5.7.0"


# -- the dispatcher's task-sent event (ShadowNamedAMQP) -----------------------------------------


def shadow_named_amqp(sent_event_wanted: Callable[[Celery], bool]) -> type[AMQP]:
    """An AMQP class naming the ``task-sent`` event like the message (``tool:<function>``, C10)
    and dropping the event when ``sent_event_wanted(app)`` is false (nobody watches).

    Internal: ``AMQP.as_task_v2`` returns the private ``task_message`` namedtuple (headers,
    properties, body, sent_event); the event is a dict Celery publishes as it is.
    """

    class ShadowNamedAMQP(AMQP):
        # Celery puts the shadow name in the message but the real task name in the task-sent
        # event; Flower folds a late task-sent event over the worker's events, so a call would
        # flip to ``toolfleet.execute`` depending on event order.
        def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
            message = super().as_task_v2(task_id, name, *args, **kwargs)
            if message.sent_event is None:
                return message
            if not sent_event_wanted(self.app):
                # Nobody watches: a task-sent event would be a PUBLISH no one receives.
                return message._replace(sent_event=None)
            shadow = message.headers.get("shadow")
            if shadow:
                message.sent_event["name"] = shadow
            return message

    return ShadowNamedAMQP


# -- the enable_events remote control command --------------------------------------------------

# Celery's own handler, kept when ours replaces it in the (process-global) Panel registry.
_celery_enable_events: Callable[[Any], Any] | None = None
_on_enable: list[Callable[[Any], None]] = []


def _enable_events(state: Any) -> Any:
    """Tell worker(s) to send task-related events (for a lease, on toolfleet workers)."""
    assert _celery_enable_events is not None  # installed with this handler
    reply = _celery_enable_events(state)
    for hook in _on_enable:
        hook(state.consumer)
    return reply


def install_enable_events(on_enable: Callable[[Any], None]) -> None:
    """After Celery's ``enable_events`` turns a worker's task events on, call
    ``on_enable(consumer)``. Idempotent: a hook is installed once, whatever the app count.
    Patches this process's remote control commands: call it where a worker starts.

    Internal: ``Panel.data`` is Celery's registry of remote control commands (Celery's
    ``enable_events`` is replaced there, its ``Panel.meta`` entry kept); the command's
    ``state.consumer`` is the worker's Consumer.
    """
    global _celery_enable_events
    if on_enable not in _on_enable:
        _on_enable.append(on_enable)
    current = Panel.data["enable_events"]
    if current is not _enable_events:
        _celery_enable_events = current
        Panel.data["enable_events"] = _enable_events


def patch_worker(on_enable: Callable[[Any], None]) -> None:
    """Everything a starting worker process changes in Celery and kombu, once per process:
    ``on_enable`` runs after each ``enable_events`` (:func:`install_enable_events`), and a
    broker restart does not make the worker exit (:func:`survive_broker_restart`), and its
    banner and logs show a broker URL without a password as it is (:func:`mask_only_a_password`)."""
    install_enable_events(on_enable)
    survive_broker_restart()
    mask_only_a_password()


def task_events_off(consumer: Any) -> bool:
    """Turn the worker's task events off (``disable_events`` for the task group only); True
    when they were on.

    Internal: ``Consumer.event_dispatcher.groups`` is the set of event groups sent.
    """
    dispatcher = consumer.event_dispatcher
    if dispatcher is not None and "task" in (dispatcher.groups or ()):
        dispatcher.groups.discard("task")
        return True
    return False


def every(consumer: Any, interval_s: float, function: Callable[[], None]) -> None:
    """Run ``function`` every ``interval_s`` on the worker's main-process timer.

    Internal: ``Consumer.timer`` (a kombu Timer) and its ``call_repeatedly``.
    """
    consumer.timer.call_repeatedly(interval_s, function)


# -- the worker ---------------------------------------------------------------------------------


def consumed_queues(app: Celery) -> list[str]:
    """The names of the queues this worker consumes (``-Q``), else every queue of the app.

    Internal: ``app.amqp.queues`` (kombu's Queues mapping) and its ``consume_from``, which the
    worker sets from ``-Q``.
    """
    queues: Any = app.amqp.queues
    return [str(name) for name in (queues.consume_from or queues)]


def revoked_message(request: Any) -> tuple[Any, str | None]:
    """The first argument (the CallMessage dict) and worker hostname of a revoked request;
    ``(None, None)`` when it has no arguments.

    Internal: ``task_revoked``'s ``request`` is the worker's ``celery.worker.request.Request``
    (not a task's ``Context``), whose ``args`` are the decoded positional arguments.
    """
    args = getattr(request, "args", None) or ()
    if not args:
        return None, None
    return args[0], getattr(request, "hostname", None)


# -- toolfleet.execute ending CANCELLED -------------------------------------------------------


def mark_revoked(task: Task) -> None:
    """Show the running task as REVOKED, as Celery does for ``revoke(terminate=True)``.

    Internal: Celery sends ``task-revoked`` only from the worker's main process when it
    terminates a task; a call that ends CANCELLED by itself sends it by hand, with the fields
    Celery's own event has, and stores the REVOKED state against the task's request.
    """
    task.send_event("task-revoked", terminated=True, signum=None, expired=False)
    task.backend.mark_as_revoked(task.request.id, "cancelled", request=task.request)


class RevokedIds:
    """The task ids this worker process has seen revoked, as a container.

    Internal: ``celery.worker.state.revoked``, the worker's revoked set (read on each look, as
    Celery may replace it).
    """

    def __contains__(self, task_id: object) -> bool:
        return task_id in worker_state.revoked


# -- the asyncio pool ----------------------------------------------------------------------------


class PoolRequest(NamedTuple):
    """What ``Request.execute_using_pool`` passes a pool as ``args``: the arguments of
    ``celery.app.trace.fast_trace_task`` / ``trace_task_ret`` (private)."""

    task_name: str
    task_id: str
    request: dict[str, Any]
    body: Any
    content_type: str
    content_encoding: str


def pool_app_and_hostname(pool: Any) -> tuple[Celery | None, str | None]:
    """The app and worker hostname a pool was created for.

    Internal: the worker's Pool component passes ``initargs=(app, hostname)``.
    """
    initargs: tuple[Any, ...] = tuple(pool.options.get("initargs") or ())
    app = initargs[0] if initargs else None
    hostname = initargs[1] if len(initargs) > 1 else None
    return app, hostname


def report_success(callback: Callable[..., Any] | None, retval: Any, runtime_s: float) -> None:
    """Tell the worker's Request the task succeeded (acks, task-succeeded event).

    Internal: ``Request.on_success`` takes ``(failed, retval, runtime)``.
    """
    if callback is not None:
        callback((0, saferepr(retval), runtime_s))


def report_failure(
    callback: Callable[..., Any] | None, einfo: ExceptionInfo, runtime_s: float
) -> None:
    """Tell the worker's Request the task failed: ``Request.on_success`` routes
    ``(1, einfo, runtime)`` to ``on_failure``, which acks (acks_late) and sends task-failed with
    ``repr(einfo.exception)``, or task-revoked when the exception is ``Terminated``."""
    if callback is not None:
        callback((1, einfo, runtime_s))


def exception_info(error: BaseException) -> ExceptionInfo:
    """An ExceptionInfo for ``error``, unwrapped as a prefork child's is after unpickling, so
    Flower shows the tool's exception, not a wrapper."""
    try:
        raise error
    except BaseException:
        einfo = ExceptionInfo()
    einfo.exception = error
    return einfo


def cancelled_info(task_id: str) -> ExceptionInfo:
    """The failure a cancelled call reports: ``Terminated`` makes Celery announce it revoked
    (Flower shows REVOKED)."""
    return exception_info(Terminated(f"call {task_id} was cancelled"))


def store_success(app: Celery, task_id: str, retval: Any) -> None:
    """Store SUCCESS in the result backend, when the app keeps results."""
    if not app.conf.task_ignore_result:
        app.backend.mark_as_done(task_id, retval, request=None)


def store_failure(app: Celery, task_id: str, error: BaseException, einfo: ExceptionInfo) -> None:
    """Store FAILURE in the result backend, when the app keeps results (no errbacks: a call's
    failure is data in its record)."""
    if not app.conf.task_ignore_result:
        app.backend.mark_as_failure(
            task_id, error, traceback=einfo.traceback, request=None, call_errbacks=False
        )


# -- a broker restart must not make the worker exit (found by bench/chaos.py) -------------------
#
# When the broker connection drops, Celery closes the consumer's connection and kombu's Redis
# channel then puts the worker's reserved (unacknowledged) messages back through that closed
# connection: ``Channel._connparams`` reads ``self.connection.client``, None by then, and raises
# AttributeError, which Celery's ``ignore_errors`` does not ignore — "Unrecoverable error", the
# worker exits (a sync worker, on a persistent broker's second restart under load; its kind's
# calls then ended NoWorkerError). A redis ConnectionError instead is a connection error: Celery
# reconnects as for any broker loss, and the messages, still in Redis' ``unacked`` hash, go
# back to their queue after the visibility timeout.

_KOMBU_CONNPARAMS = kombu_redis.Channel._connparams


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if self.connection.client is None:
        raise redis.exceptions.ConnectionError(
            "the broker connection of this channel is closed; reconnecting"
        )
    return _KOMBU_CONNPARAMS(self, asynchronous=asynchronous)


def survive_broker_restart() -> None:
    """Patch kombu's Redis channel once per process (idempotent)."""
    if kombu_redis.Channel._connparams is not _connparams:
        kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]


# -- the broker URL a worker shows (kombu's Connection.as_uri) ----------------------------------
# kombu masks the password of every URL it shows, even one with no password: the worker's
# banner and its "Connected to" line said ``redis://:**@127.0.0.1:6379/0``, as though a
# password were set. A URL with no password has nothing to hide; one with a password is
# masked as before.

_KOMBU_AS_URI = Connection.as_uri


def _as_uri(self: Connection, include_password: bool = False, *args: Any, **kwargs: Any) -> str:
    shown: str = _KOMBU_AS_URI(self, include_password or not self.password, *args, **kwargs)
    return shown


def mask_only_a_password() -> None:
    """Patch kombu's ``Connection.as_uri`` once per process (idempotent)."""
    if Connection.as_uri is not _as_uri:
        Connection.as_uri = _as_uri  # type: ignore[method-assign]
