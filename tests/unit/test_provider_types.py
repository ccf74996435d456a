"""The renderers and spec builders are typed with the provider SDKs' own TypedDicts: an agent
loop typed with the SDKs' types type-checks under ``mypy --strict`` (the installed mypy, run on
small loops that are type-checked only, never run), and toolfleet still imports and renders
without the SDKs installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.doc_code import printed_files

ROOT = Path(__file__).resolve().parents[2]

# Three loops as a user writes them with the SDKs' types, plus the type of each format.
TYPED_LOOPS = """
from __future__ import annotations

from typing import Any, assert_type, cast

import anthropic
import openai
from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import (
    FunctionToolParam,
    ResponseCustomToolCallOutputParam,
    ResponseInputParam,
)
from openai.types.responses.response_input_param import FunctionCallOutput

from toolfleet import ActionResponseModel, Branch, Fleet, render_results, tool_calls_in
from toolfleet.workers.specs import tool_spec, tool_specs


def chat_loop(client: openai.OpenAI, fleet: Fleet, branch: Branch) -> str:
    tools = tool_specs(list(fleet.registry), "openai")
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "1 + 2?"}]
    while True:
        completion = client.chat.completions.create(
            model="gpt-4.1", messages=messages, tools=tools
        )
        message = completion.choices[0].message
        calls = tool_calls_in(message)
        if not calls:
            return message.content or ""
        messages.append(cast(ChatCompletionAssistantMessageParam, message.to_dict()))
        messages.extend(render_results(branch.act_sync(calls), "openai"))
        messages += render_results(branch.act_sync(calls))  # "openai" is the default
        client.chat.completions.create(
            model="gpt-4.1", messages=messages, tools=fleet.registry.specs("openai")
        )


def responses_loop(client: openai.OpenAI, fleet: Fleet, branch: Branch) -> str:
    tools = tool_specs(list(fleet.registry), "openai-responses")
    items: ResponseInputParam = [{"role": "user", "content": "1 + 2?"}]
    while True:
        response = client.responses.create(model="gpt-4.1", input=items, tools=tools)
        calls = tool_calls_in(response)
        if not calls:
            return response.output_text
        items.extend(render_results(branch.act_sync(calls), "openai-responses"))
        client.responses.create(
            model="gpt-4.1", input=items, tools=fleet.registry.specs("openai-responses")
        )


def anthropic_loop(client: anthropic.Anthropic, fleet: Fleet, branch: Branch) -> str:
    tools = fleet.registry.specs("anthropic")
    messages: list[MessageParam] = [{"role": "user", "content": "1 + 2?"}]
    while True:
        reply = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=1024, messages=messages, tools=tools
        )
        calls = tool_calls_in(reply)
        if not calls:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": reply.content})
        messages.append(
            {"role": "user", "content": render_results(branch.act_sync(calls), "anthropic")}
        )
        client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=1024,
            messages=messages,
            tools=tool_specs(list(fleet.registry), "anthropic"),
        )


def types_per_format(results: list[ActionResponseModel], fmt: str, fleet: Fleet) -> None:
    tool = fleet.tool("add")
    assert_type(render_results(results), list[ChatCompletionToolMessageParam])
    assert_type(
        render_results(results, "openai-responses"),
        list[FunctionCallOutput | ResponseCustomToolCallOutputParam],
    )
    assert_type(render_results(results, "anthropic"), list[ToolResultBlockParam])
    assert_type(render_results(results, fmt), list[dict[str, Any]])
    assert_type(results[0].to_openai(), ChatCompletionToolMessageParam)
    assert_type(results[0].to_anthropic(), ToolResultBlockParam)
    assert_type(tool_spec(tool, "openai"), ChatCompletionFunctionToolParam)
    assert_type(tool_spec(tool, "openai-responses"), FunctionToolParam)
    assert_type(tool_spec(tool, "anthropic"), ToolParam)
    assert_type(tool_spec(tool, "mcp"), dict[str, Any])
    assert_type(tool_specs([tool], fmt), list[dict[str, Any]])
    assert_type(fleet.registry.specs("mcp"), list[dict[str, Any]])
"""

# A minimal configuration: --strict on the loops; toolfleet found in the checkout and checked
# with its own errors silenced (the project's `mypy` run reports those).
MYPY_CONFIG = """
[mypy]
python_version = 3.11
strict = True
mypy_path = {root}

[mypy-toolfleet.*]
follow_imports = silent
"""


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "loops.py").write_text(source)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG.format(root=ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            str(tmp_path / "cache"),
            "loops.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MYPYPATH": ""},
    )


def test_loops_typed_with_the_sdk_types_pass_mypy_strict(tmp_path: Path) -> None:
    done = _mypy(tmp_path, TYPED_LOOPS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
    # The check has teeth: a result of the wrong format in a chat loop is an error.
    wrong = TYPED_LOOPS.replace(
        'messages.extend(render_results(branch.act_sync(calls), "openai"))',
        'messages.extend(render_results(branch.act_sync(calls), "anthropic"))',
    )
    assert wrong != TYPED_LOOPS
    done = _mypy(tmp_path, wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Argument 1 to "extend" of "list" has incompatible type' in done.stdout
    assert "list[ToolResultBlockParam]" in done.stdout


def test_toolfleet_renders_and_builds_specs_without_the_sdks() -> None:
    # A finder that refuses the SDKs, as on a machine without them.
    script = textwrap.dedent(
        """
        import sys

        class NoSDKs:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("openai", "anthropic"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoSDKs())
        from toolfleet import ActionResponseModel, render_results
        from toolfleet.workers.registry import Registry, tool

        reg = Registry()

        @tool(registry=reg)
        def shout(text: str) -> str:
            return text.upper()

        result = ActionResponseModel(
            function="shout", output="HI", tool_call_id="c1", tool_call_type="custom"
        )
        assert render_results([result], "openai-responses")[0]["type"] == (
            "custom_tool_call_output"
        )
        assert render_results([result])[0]["role"] == "tool"
        assert reg.specs("openai-responses")[0]["strict"] is True
        assert not any(m.split(".")[0] in ("openai", "anthropic") for m in sys.modules)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# The loops the documentation prints, with the tools they import; each types its message list
# with its SDK's own type.
DOCUMENTED_LOOPS = ("mytools.py", "agent_openai.py", "agent_anthropic.py", "agent_responses.py")
DOCS_CONFIG = """
[mypy]
python_version = 3.11
check_untyped_defs = True
warn_unused_ignores = True
mypy_path = {root}

[mypy-toolfleet.*]
follow_imports = silent
"""


def test_the_documented_loops_type_check(tmp_path: Path) -> None:
    files = printed_files()
    assert set(DOCUMENTED_LOOPS) <= set(files), sorted(files)
    assert "list[ChatCompletionMessageParam]" in files["agent_openai.py"]
    assert "list[MessageParam]" in files["agent_anthropic.py"]
    assert "ResponseInputParam" in files["agent_responses.py"]
    for name in DOCUMENTED_LOOPS:
        (tmp_path / name).write_text(files[name])
    (tmp_path / "mypy.ini").write_text(DOCS_CONFIG.format(root=ROOT))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
         "--cache-dir", str(tmp_path / "cache"), *DOCUMENTED_LOOPS],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
