"""A tool that returns a value with no JSON form still completes, its output
``"<unserializable>"`` (ADR-0012 D1, kept), and the worker's log says so once per tool per
worker process, naming the tool and the type. Real prefork and asyncio-pool workers."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.fleet import call, own_queues, run, start_worker
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.unserializable_tools",)


def _warnings(log: str, tool: str) -> list[str]:
    return re.findall(rf".*tool '{tool}' returned a .*", log)


def test_a_non_json_return_completes_and_the_worker_warns_once_per_tool(
    fleet_settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    settings, env = own_queues(fleet_settings, "unserializable", tools=TOOLS)
    # One prefork process: every sync call runs in the same process.
    workers = [
        start_worker(kind, redis_url=redis_url, tools=TOOLS, concurrency=n, env=env)
        for kind, n in (("sync", 1), ("async", 10))
    ]
    try:

        async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
            calls = [call("gives_bytes", n=n) for n in range(3)]
            calls += [call("gives_object_async", n=n) for n in range(3)]
            calls += [call("gives_the_marker_text")]
            return await Branch(fleet=fleet).act(calls)

        results = run(settings, scenario)
        assert [r.status.value for r in results] == ["completed"] * 7
        assert {str(r.output) for r in results} == {"<unserializable>"}
        sync_log, async_log = (worker.log() for worker in workers)
        [said] = _warnings(sync_log, "gives_bytes")
        assert "returned a bytes, which has no JSON form" in said and "WARNING" in said
        [said] = _warnings(async_log, "gives_object_async")
        assert "returned a object" in said
        # A tool that returns the marker's text returned a string: nothing to say.
        assert not _warnings(sync_log, "gives_the_marker_text")
    finally:
        for worker in workers:
            worker.stop()
