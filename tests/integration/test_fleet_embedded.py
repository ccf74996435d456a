"""``Fleet.embedded(tools=[...])``: the embedded default from a program, with no Redis to
install: a private Redis and real workers for the block, all stopped when it ends."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.support import sample_tools
from tests.support.fleet import call
from tests.support.waiting import until
from toolfleet import Branch, ConfigurationError, Fleet


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_with_block_runs_calls_on_private_workers_and_stops_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A broker in the environment is not used: the block's Redis is its own.
    monkeypatch.setenv("TOOLFLEET_BROKER_URL", "redis://127.0.0.1:1/0")
    with Fleet.embedded(tools=[sample_tools.whoami, "tests.support.sample_tools"]) as fleet:
        assert fleet.settings.broker_url != "redis://127.0.0.1:1/0"
        results = Branch(fleet=fleet).act_sync(
            [call("whoami"), call("whoami_async"), call("add", a=2, b=3)]
        )
        assert [r.error for r in results] == [None, None, None]
        sync_pid, async_pid = results[0].output["pid"], results[1].output["pid"]
        assert results[2].output == 5
        assert os.getpid() not in (sync_pid, async_pid) and sync_pid != async_pid
    until(
        lambda: not _alive(sync_pid) and not _alive(async_pid),
        timeout_s=20,
        what="the embedded workers to stop with the block",
    )


def test_an_async_with_block_and_tools_from_the_main_script() -> None:
    async def scenario() -> object:
        async with Fleet.embedded(tools=["tests.support.sample_tools"]) as fleet:
            [result] = await Branch(fleet=fleet).act(call("echo", value="hi"))
            return result.output

    assert asyncio.run(scenario()) == "hi"

    def in_main() -> None: ...

    in_main.__module__ = "__main__"
    with pytest.raises(ConfigurationError, match="module of their own"):
        Fleet.embedded(tools=[in_main])
