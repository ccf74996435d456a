"""Every Flower (and Celery event-state) internal that
toolfleet/cli/flower_internals.py leans on is still there, with the shape it was written
against. A failure names the internal and what changed; fix toolfleet/cli/flower_internals.py
(and nothing else) to match the installed Flower. The behaviour itself (a call named for its
tool, a failed call's runtime) is tested in tests/integration/test_flower_cli.py."""

from __future__ import annotations

import inspect

import celery
import flower
from celery import states
from celery.events.state import State, Task
from flower import command as flower_command
from flower.app import Flower
from flower.events import Events
from flower.urls import settings as flower_settings

from tests.support.internals_support import change_message, parameters
from toolfleet.cli import flower_internals
from toolfleet.cli.flower_internals import (
    AWAITING_APPROVAL,
    FLOWER_WRITTEN_AGAINST,
    FUNCTION_IN_ARGSREPR,
    ToolTask,
    track_calls,
)
from toolfleet.dispatcher.send.enqueue import _argsrepr
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

changed = change_message(
    "toolfleet/cli/flower_internals.py",
    f"Flower {FLOWER_WRITTEN_AGAINST}",
    f"Flower {flower.__version__} on Celery {celery.__version__}",
)


def test_celery_event_state_builds_tasks_we_can_subclass_and_merge() -> None:
    assert isinstance(Task.merge_rules, dict) and states.RECEIVED in Task.merge_rules, changed(
        "celery.events.state.Task.merge_rules is not a dict keyed by state"
    )
    assert "name" not in ToolTask.merge_rules[states.PENDING], "a late task-sent would rename"
    for attribute in ("runtime", "started", "failed"):
        assert attribute in Task.__slots__ or hasattr(Task, attribute), changed(
            f"celery.events.state.Task has no {attribute}"
        )
    assert State.Task is Task, changed("State no longer builds tasks from its Task attribute")
    assert parameters(State.event) == ["self", "event"], changed(
        f"State.event takes {parameters(State.event)}"
    )
    state = State()
    track_calls(state)
    assert state.Task is ToolTask, "track_calls did not install ToolTask"
    assert hasattr(state, "tasks"), changed("State has no tasks")


def test_the_tool_name_pattern_reads_the_dispatchers_argsrepr() -> None:
    # The pattern is ours over our own text (toolfleet.dispatcher.send.enqueue), but the two must
    # agree.
    message = CallMessage(
        call_id="call-1", function="word_count", arguments={"text": "it's 'quoted'"}
    )
    tool = Tool(func_callable=lambda text: text, function="word_count")
    match = FUNCTION_IN_ARGSREPR.search(_argsrepr(message, tool))
    assert match is not None and match[1] == "word_count", (
        "FUNCTION_IN_ARGSREPR no longer reads the function from "
        "toolfleet.dispatcher.send.enqueue's argsrepr"
    )


def test_flower_command_helpers_are_as_used() -> None:
    expected = {
        "apply_env_options": [],
        "apply_options": ["prog_name", "argv"],
        "extract_settings": [],
        "setup_logging": [],
        "sigterm_handler": ["signum", "_"],
    }
    for name, wanted in expected.items():
        function = getattr(flower_command, name, None)
        assert function is not None, changed(f"flower.command has no {name}")
        assert parameters(function) == wanted, changed(
            f"flower.command.{name} takes {parameters(function)}, not {wanted}"
        )
    assert isinstance(flower_settings, dict), changed("flower.urls.settings is not a dict")


def test_the_flower_app_and_its_events_thread_are_as_used() -> None:
    names = parameters(Flower.__init__)
    assert {"options", "capp"} <= set(names), changed(f"Flower() takes {names}")
    for method in ("start_http_server", "start", "stop"):
        assert callable(getattr(Flower, method, None)), changed(f"Flower has no {method}()")
    init = inspect.getsource(Flower.__init__)
    assert "self.events =" in init and "self.io_loop =" in init, changed(
        "Flower() no longer sets events and io_loop"
    )
    assert inspect.iscoroutinefunction(Events.on_enable_events), changed(
        "flower.events.Events.on_enable_events is not a coroutine function"
    )
    assert "self.state =" in inspect.getsource(Events.__init__), changed(
        "flower.events.Events no longer keeps its State as .state"
    )
    assert FLOWER_WRITTEN_AGAINST in (flower_internals.__doc__ or "")


def test_task_event_takes_what_tooltask_passes_on() -> None:
    assert parameters(Task.event)[:5] == [
        "self",
        "type_",
        "timestamp",
        "local_received",
        "fields",
    ], changed(f"celery.events.state.Task.event takes {parameters(Task.event)}")


def _fold(*events: dict[str, object]) -> State:
    state = State()
    track_calls(state)
    for clock, event in enumerate(events, start=1):
        stamp = float(clock)
        fields = {"uuid": "call-1", "hostname": "h", "clock": clock, "timestamp": stamp}
        fields["local_received"] = stamp
        state.event({**fields, **event})
    return state


def test_a_parked_call_shows_awaiting_approval_and_moves_on_once_approved() -> None:
    parked = {"type": "task-sent", "name": "tool:refund", "approval": "waiting"}
    assert _fold(parked).tasks["call-1"].state == AWAITING_APPROVAL
    approved = _fold(
        parked,
        {"type": "task-sent", "name": "toolfleet.execute", "args": "({'function': 'refund'},)"},
        {"type": "task-received", "name": "tool:refund"},
        {"type": "task-started"},
    )
    task = approved.tasks["call-1"]
    assert (task.state, task.name) == (states.STARTED, "tool:refund")
    # Celery alone ranks an unknown state above STARTED: the call would stay "waiting".
    assert _fold(parked, {"type": "task-received"}).tasks["call-1"].state == states.RECEIVED


def test_a_parked_call_that_ends_unrun_shows_revoked_with_its_time() -> None:
    for ending in ("denied", "expired", "withdrawn", "refused"):
        state = _fold(
            {"type": "task-sent", "name": "tool:refund", "approval": "waiting"},
            {"type": "task-sent", "name": "tool:refund", "approval": ending},
        )
        task = state.tasks["call-1"]
        assert (task.state, task.revoked) == (states.REVOKED, 2.0), ending
        assert not state.workers, "the dispatcher's events must not list it as a worker"


def test_flowers_sentinel_broker_builds_its_client_where_we_replace_it() -> None:
    from flower.utils import broker

    sentinel = broker.RedisSentinel
    wanted = ["self", "broker_options", "broker_use_ssl"]
    assert parameters(sentinel._get_redis_client) == wanted, changed(
        f"RedisSentinel._get_redis_client takes {parameters(sentinel._get_redis_client)}"
    )
    init = inspect.getsource(sentinel.__init__)
    assert "self.redis = self._get_redis_client(" in init, changed(
        "RedisSentinel() no longer builds self.redis with _get_redis_client"
    )
    base = inspect.getsource(broker.RedisBase.__init__)
    for name in ("self.socket_timeout", "self.socket_connect_timeout"):
        assert name in base, changed(f"RedisBase() no longer sets {name}")
