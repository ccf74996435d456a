"""A call whose arguments do not fit the tool's published schema fails alone, before it is
enqueued; a hand-made message that skips the dispatcher is refused again by the worker. The
tool writes a side channel (a file), so "never ran" is measured, not assumed."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.support.fleet import call, run, run_calls
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")


def test_a_wrongly_typed_call_fails_alone_and_never_reaches_a_worker(
    fleet_settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    side_channel = tmp_path / "lines.txt"

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [
                call("append_line", path=str(side_channel), text="first"),
                call("append_line", path=str(side_channel), text=12345),
                call("add", a="5", b=1),  # lax: "5" is an int
                call("add", a="x", b=1),
            ]
        )
        return branch, results

    branch, results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
    ]
    assert side_channel.read_text() == "first\n"  # the refused call never ran
    assert results[2].output == 6
    refused_text, refused_add = results[1], results[3]
    assert refused_text.error is not None and refused_add.error is not None
    assert refused_text.error.startswith("ArgumentValidationError: tool 'append_line'")
    assert "argument 'text' expects str, got 12345" in refused_text.error
    assert "argument 'a' expects float, got 'x'" in refused_add.error
    # Never enqueued: no worker ever marked them started.
    keys = Keys(fleet_settings.key_prefix)
    refused = [e for e in branch.events if e.execution["status"] == EventStatus.ABORTED]
    assert len(refused) == 2
    for event in refused:
        assert event.call_id and not redis_client.exists(keys.started(event.call_id))


def test_a_worker_refuses_a_hand_made_message_whose_arguments_do_not_fit(
    celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    side_channel = tmp_path / "lines.txt"
    [wrong, right] = run_calls(
        celery_app,
        redis_client,
        [
            ("append_line", {"path": str(side_channel), "text": ["not", "text"]}),
            ("append_line", {"path": str(side_channel), "text": "fits"}),
        ],
    )
    assert wrong.status != EventStatus.COMPLETED
    assert "argument 'text' expects str" in str(wrong.execution["error"])
    assert right.status == EventStatus.COMPLETED
    assert side_channel.read_text() == "fits\n"
