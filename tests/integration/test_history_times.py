"""A call's ActionRequest in history is dated when the call was made, its ActionResponse when
it ended: requests in input order read in time order, even when a later call ends first
(history is written in input order, each pair once its call ends)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tests.support.cli_support import toolfleet
from tests.support.fleet import call, private_workers, run
from toolfleet import Branch, Fleet
from toolfleet.schemas.settings import Settings


def test_request_rows_show_when_the_call_was_made(redis_url: str, tmp_path: Path) -> None:
    with private_workers(redis_url, "history-times", concurrency={"async": 10}) as env:

        async def scenario(fleet: Fleet) -> str:
            branch = Branch(fleet=fleet)
            # The first call ends last: its pair is written after the second call ended.
            await branch.act([call("slow_async", seconds=0.4), call("count_async", n=1)])
            return branch.id

        branch_id = run(Settings.from_env(env, tools=("tests.support.sample_tools",)), scenario)
        shown = toolfleet("history", branch_id, "--json", home=tmp_path, env=env)
        table = toolfleet("history", branch_id, home=tmp_path, env={**env, "COLUMNS": "200"})
    assert shown.returncode == 0 and table.returncode == 0, shown.stderr + table.stderr
    messages = json.loads(shown.stdout)["messages"]
    assert [m["role"] for m in messages] == ["action_request", "action_response"] * 2
    at = [datetime.fromisoformat(m["created_at"]) for m in messages]
    slow_request, slow_response, fast_request, fast_response = at
    # Both requests were made at once, before either call ended.
    assert slow_request <= fast_request < fast_response < slow_response
    assert (slow_response - slow_request).total_seconds() >= 0.4
    assert [m["content"]["error"] for m in messages[1::2]] == [None, None]
    # The table's time column shows the same instants, the requests' included.
    for moment in at:
        assert moment.strftime("%H:%M:%S.%f")[:-3] in table.stdout, table.stdout
