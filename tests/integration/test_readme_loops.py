"""The provider loops of the documentation run as printed.

The code blocks of the README (``mytools.py`` from the quick start, ``agent_openai.py``) and of
docs/agent-ecosystem.md (``agent_anthropic.py``) are written to a folder and run in a
subprocess against real workers that import that ``mytools``; only the SDK clients are
replaced (tests/support/readme_fakes.py), by fakes that answer with the SDKs' own
``ChatCompletion`` / ``Message`` objects. The test reads what the agent sent back to the
"model": every result paired with the model's id, in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionToolParam
from pydantic import TypeAdapter

from tests.support.doc_code import doc_blocks, fleet_for_files, printed_files
from tests.support.fleet import REPO_ROOT
from tests.support.readme_fakes import CALLS

TOOL_NAMES = ["divide", "fetch", "whoami", "word_count"]


@pytest.fixture(scope="module")
def readme_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A folder holding the documents' files, and a private broker with a sync and an async
    worker importing its ``mytools``."""
    folder = tmp_path_factory.mktemp("readme")
    with fleet_for_files(folder, printed_files(), ("mytools",)) as broker_url:
        yield folder, broker_url


def run_agent(folder: Path, broker_url: str, script: str) -> tuple[list[dict[str, Any]], str]:
    """Run the documents' ``script`` with the fake clients; (requests sent, stdout)."""
    log = folder / f"{script}.requests.jsonl"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(
        {
            "TOOLFLEET_BROKER_URL": broker_url,
            "TOOLFLEET_TOOLS": "mytools",
            "TOOLFLEET_TEST_FAKE_LOG": str(log),
            "PYTHONPATH": os.pathsep.join([str(folder), str(REPO_ROOT)]),
        }
    )
    runner = (
        "import runpy, sys, tests.support.readme_fakes as fakes; fakes.install(); "
        "runpy.run_path(sys.argv[1], run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", runner, str(folder / script)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    return requests, done.stdout


def test_the_documents_hold_both_loops_and_the_tools_they_run() -> None:
    assert {"mytools.py", "agent_openai.py"} <= set(doc_blocks("README.md"))
    assert "agent_anthropic.py" in doc_blocks("docs/agent-ecosystem.md")


def test_openai_loop_from_the_readme(readme_fleet: tuple[Path, str]) -> None:
    requests, stdout = run_agent(*readme_fleet, "agent_openai.py")
    assert len(requests) == 2  # tool calls, then the answer

    tools = requests[0]["tools"]
    assert sorted(t["function"]["name"] for t in tools) == TOOL_NAMES
    for spec in tools:
        TypeAdapter(ChatCompletionToolParam).validate_python(spec)

    messages = requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] + ["tool"] * len(CALLS)
    assert [c["id"] for c in messages[1]["tool_calls"]] == [c[0] for c in CALLS]
    results = {m["tool_call_id"]: m["content"] for m in messages[2:]}
    assert [m["tool_call_id"] for m in messages[2:]] == [c[0] for c in CALLS]
    assert results["call_words"] == "6"
    assert "ZeroDivisionError" in results["call_div"]
    assert json.loads(results["call_fetch"]) == {"url": "https://example.org", "status": 200}
    assert results["call_me"] == "alice"
    assert stdout.startswith("answer: call_words=6; call_div=")


def test_anthropic_loop_from_the_agent_ecosystem_doc(readme_fleet: tuple[Path, str]) -> None:
    requests, stdout = run_agent(*readme_fleet, "agent_anthropic.py")
    assert len(requests) == 2

    tools = requests[0]["tools"]
    assert sorted(t["name"] for t in tools) == TOOL_NAMES
    for spec in tools:
        TypeAdapter(ToolParam).validate_python(spec)

    user, assistant, results_turn = requests[1]["messages"]
    assert (user["role"], assistant["role"], results_turn["role"]) == (
        "user",
        "assistant",
        "user",
    )
    uses = [b for b in assistant["content"] if b["type"] == "tool_use"]
    assert [b["id"] for b in uses] == [c[0] for c in CALLS]
    blocks = results_turn["content"]
    assert [b["type"] for b in blocks] == ["tool_result"] * len(CALLS)
    assert [b["tool_use_id"] for b in blocks] == [c[0] for c in CALLS]
    by_id = {b["tool_use_id"]: b for b in blocks}
    assert by_id["call_words"]["content"] == "6" and not by_id["call_words"].get("is_error")
    assert by_id["call_div"]["is_error"] is True
    assert "ZeroDivisionError" in by_id["call_div"]["content"]
    assert by_id["call_me"]["content"] == "alice"
    assert stdout.startswith("answer: call_words=6; call_div=")
