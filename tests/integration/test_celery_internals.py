"""Every Celery internal workers/celery_internals.py leans on is still there,
with the shape it was written against. A failure names the internal and what changed; fix
workers/celery_internals.py (and nothing else) to match the installed Celery."""

from __future__ import annotations

import inspect
from typing import Any

import billiard.einfo
import celery
from billiard.exceptions import Terminated
from celery.app import amqp, trace
from celery.backends.base import BaseBackend
from celery.concurrency.base import BasePool
from celery.events.dispatcher import EventDispatcher
from celery.worker import components, control, request, state
from kombu.asynchronous.timer import Timer

from tests.support.internals_support import change_message, parameters
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tasks import EXECUTE_TASK
from toolfleet.workers import celery_internals
from toolfleet.workers.app import create_app
from toolfleet.workers.celery_internals import (
    CELERY_WRITTEN_AGAINST,
    PoolRequest,
    RevokedIds,
    cancelled_info,
    consumed_queues,
    exception_info,
    install_enable_events,
)

changed = change_message(
    "workers/celery_internals.py",
    f"Celery {CELERY_WRITTEN_AGAINST}",
    f"Celery {celery.__version__}",
)


def source(function: object) -> str:
    return inspect.getsource(function)  # type: ignore[arg-type]


def test_as_task_v2_returns_the_task_message_tuple_with_a_sent_event() -> None:
    assert amqp.task_message._fields == ("headers", "properties", "body", "sent_event"), changed(
        f"celery.app.amqp.task_message fields are {amqp.task_message._fields}"
    )
    names = parameters(amqp.AMQP.as_task_v2)
    assert {"shadow", "create_sent_event"} <= set(names), changed(
        f"AMQP.as_task_v2 takes {names}, no longer shadow and create_sent_event"
    )


def test_the_shadow_named_amqp_names_task_sent_after_the_tool(redis_url: str) -> None:
    # TOOLFLEET_TASK_EVENTS=always: the event is wanted whether or not a monitor watches.
    app = create_app(Settings(broker_url=redis_url, task_events="always"))
    try:
        message = app.amqp.as_task_v2(
            "call-1", EXECUTE_TASK, args=({},), shadow="tool:echo", create_sent_event=True
        )
        assert message.sent_event is not None, changed("as_task_v2 made no sent_event")
        assert message.sent_event["name"] == "tool:echo", changed(
            f"the task-sent event is named {message.sent_event.get('name')!r}, not the shadow"
        )
    finally:
        app.close()


def test_enable_events_is_a_remote_control_command_we_can_wrap() -> None:
    assert "enable_events" in control.Panel.data, changed("Panel.data has no enable_events")
    assert parameters(control.enable_events) == ["state"], changed(
        f"celery.worker.control.enable_events takes {parameters(control.enable_events)}"
    )
    assert "state.consumer" in source(control.enable_events), changed(
        "enable_events no longer reaches the consumer as state.consumer"
    )
    install_enable_events(lambda consumer: None)
    assert control.Panel.data["enable_events"] is celery_internals._enable_events


def test_the_consumer_sends_task_events_through_a_dispatcher_with_groups() -> None:
    assert "groups" in parameters(EventDispatcher.__init__), changed(
        "EventDispatcher has no groups"
    )
    assert "self.groups = set(" in source(EventDispatcher.__init__), changed(
        "EventDispatcher.groups is no longer a set"
    )
    from celery.worker.consumer import events as consumer_events

    assert "c.event_dispatcher = " in source(consumer_events.Events.start), changed(
        "the Events bootstep no longer sets consumer.event_dispatcher"
    )
    assert "call_repeatedly" in dir(Timer), changed("kombu's Timer has no call_repeatedly")


def test_a_pool_gets_the_trace_arguments_and_app_and_hostname() -> None:
    fields = list(PoolRequest._fields)
    # PoolRequest's fields, in the tracers' own names (the first is task or name).
    traced = ["uuid", "request", "body", "content_type", "content_encoding"]
    for tracer in (trace.fast_trace_task, trace.trace_task_ret):
        names = parameters(tracer)[:6]
        assert names[1:] == traced, changed(
            f"{tracer.__name__} takes {names}; PoolRequest reads them as {fields}"
        )
    execute = source(request.Request.execute_using_pool)
    assert "args=(self._type, task_id, self._request_dict, self._body," in execute, changed(
        "Request.execute_using_pool no longer passes a pool the six trace arguments"
    )
    assert "initargs=(w.app, w.hostname)" in source(components.Pool.create), changed(
        "the worker's Pool component no longer passes initargs=(app, hostname)"
    )


def test_the_requests_callbacks_take_failed_retval_runtime() -> None:
    assert parameters(request.Request.on_success)[1] == "failed__retval__runtime", changed(
        f"Request.on_success takes {parameters(request.Request.on_success)}"
    )
    assert "Terminated" in source(request.Request.on_failure), changed(
        "Request.on_failure no longer announces a Terminated task as revoked"
    )
    einfo = cancelled_info("t-1")
    assert isinstance(einfo.exception, Terminated)
    plain = exception_info(ValueError("boom"))
    assert isinstance(plain, billiard.einfo.ExceptionInfo) and plain.traceback, changed(
        "billiard's ExceptionInfo() no longer captures the traceback being handled"
    )


def test_the_backend_and_the_revoked_set_are_as_used() -> None:
    for name, wanted in {
        "mark_as_done": {"task_id", "result", "request"},
        "mark_as_failure": {"task_id", "exc", "traceback", "request", "call_errbacks"},
        "mark_as_revoked": {"task_id", "reason", "request"},
    }.items():
        names = set(parameters(getattr(BaseBackend, name)))
        assert wanted <= names, changed(f"BaseBackend.{name} takes {sorted(names)}")
    state.revoked.add("revoked-task-id")
    try:
        assert "revoked-task-id" in RevokedIds()
        assert "other-task-id" not in RevokedIds()
    finally:
        state.revoked.discard("revoked-task-id")


def test_the_worker_exposes_its_queues_and_revoked_requests_as_used(redis_url: str) -> None:
    app = create_app(Settings(broker_url=redis_url))
    try:
        queues: Any = app.amqp.queues
        assert hasattr(queues, "consume_from"), changed("app.amqp.queues has no consume_from")
        assert set(consumed_queues(app)) == {"toolfleet.sync", "toolfleet.async"}
        queues.select(["toolfleet.async"])  # what the worker's -Q does
        assert consumed_queues(app) == ["toolfleet.async"], changed(
            "app.amqp.queues.select no longer narrows consume_from"
        )
    finally:
        app.close()
    args_property = getattr(request.Request, "args", None)
    assert isinstance(args_property, property), changed("Request.args is not a property")
    assert isinstance(getattr(request.Request, "hostname", None), property), changed(
        "Request.hostname is not a property"
    )


def test_a_pool_implements_celerys_pool_interface() -> None:
    for name in ("on_apply", "on_start", "on_stop", "on_terminate", "terminate_job", "_get_info"):
        assert callable(getattr(BasePool, name, None)), changed(f"BasePool has no {name}()")
    names = parameters(BasePool.on_apply)
    assert "apply_async" in dir(BasePool) and "limit" in parameters(BasePool.__init__), changed(
        f"BasePool's interface changed (on_apply takes {names})"
    )


def test_a_task_can_send_its_own_revoked_event() -> None:
    names = parameters(celery.Task.send_event)
    assert names[:2] == ["self", "type_"], changed(f"Task.send_event takes {names}")
    assert CELERY_WRITTEN_AGAINST in (celery_internals.__doc__ or "")


def test_kombu_shows_a_connection_by_as_uri_with_include_password_first() -> None:
    from kombu import Connection

    names = parameters(Connection.as_uri)
    assert names[:2] == ["self", "include_password"], changed(f"Connection.as_uri takes {names}")
    kombus = Connection.as_uri
    celery_internals.mask_only_a_password()  # as a starting worker does, in its process only
    try:
        assert Connection("redis://127.0.0.1:6379/0").as_uri() == "redis://127.0.0.1:6379/0"
        masked = Connection("redis://:pw@127.0.0.1:6379/0").as_uri()
        assert masked == "redis://:**@127.0.0.1:6379/0"
    finally:
        Connection.as_uri = kombus  # type: ignore[method-assign]
