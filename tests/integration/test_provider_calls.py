"""Provider tool calls in, provider-shaped results out (C4: one normalized call context).

Unit tests read the OpenAI and Anthropic SDK objects (built locally, no network) and dicts;
the end-to-end tests run them through real sync and async workers and check that the model's
tool-call id is kept on the result, both history messages, the dispatcher's and the worker's
event records and the published message, and that replaying a response re-runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from anthropic.types import Message as AnthropicMessage
from anthropic.types import ToolResultBlockParam, ToolUseBlock
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageCustomToolCall,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseCustomToolCallOutputParam,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
)
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from tests.support.cli_support import toolfleet
from tests.support.fleet import WorkerProcess, assert_linked_pairs, run
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.accept.envelope import normalize, tool_calls_in
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.errors import ConfigurationError, MalformedRequestError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionRequestContent
from toolfleet.schemas.provider import render_results
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult


def openai_call(id: str, name: str, arguments: str) -> ChatCompletionMessageFunctionToolCall:
    return ChatCompletionMessageFunctionToolCall.model_validate(
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
    )


def responses_call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall.model_validate(
        {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
    )


def anthropic_call(id: str, name: str, input: dict[str, Any]) -> ToolUseBlock:
    return ToolUseBlock.model_validate({"type": "tool_use", "id": id, "name": name, "input": input})


def openai_custom_call(id: str, name: str, input: str) -> ChatCompletionMessageCustomToolCall:
    return ChatCompletionMessageCustomToolCall.model_validate(
        {"id": id, "type": "custom", "custom": {"name": name, "input": input}}
    )


def responses_custom_call(call_id: str, name: str, input: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall.model_validate(
        {
            "type": "custom_tool_call",
            "id": f"ctc_{call_id}",
            "call_id": call_id,
            "name": name,
            "input": input,
        }
    )


# -- normalization (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        openai_call("call_1", "add", '{"a": 1, "b": 2}'),
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
        },
        responses_call("call_1", "add", '{"a": 1, "b": 2}'),
        {
            "type": "function_call",
            "id": "fc_x",
            "call_id": "call_1",
            "name": "add",
            "arguments": '{"a": 1, "b": 2}',
        },
        anthropic_call("call_1", "add", {"a": 1, "b": 2}),
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1, "b": 2}},
        {"function": "add", "arguments": '{"a": 1, "b": 2}', "id": "call_1"},
        {"function": "add", "arguments": {"a": 1, "b": 2}, "tool_call_id": "call_1"},
    ],
    ids=[
        "openai-sdk",
        "openai-dict",
        "responses-sdk",
        "responses-dict",
        "anthropic-sdk",
        "anthropic-dict",
        "adr-json-string",
        "adr-tool_call_id",
    ],
)
def test_every_shape_normalizes_to_function_arguments_and_id(request_: Any) -> None:
    envelope = normalize(request_)
    assert (envelope.function, envelope.arguments, envelope.tool_call_id) == (
        "add",
        {"a": 1, "b": 2},
        "call_1",
    )
    assert envelope.arguments_error is None


def test_bad_json_arguments_are_the_calls_error_not_a_malformed_envelope() -> None:
    broken = normalize(openai_call("call_9", "add", '{"a": 1,'))
    assert broken.tool_call_id == "call_9"
    assert "not JSON" in (broken.arguments_error or "") and "'add'" in broken.arguments_error
    listed = normalize({"function": "add", "arguments": "[1, 2]"})
    assert "a JSON list, not a JSON object" in (listed.arguments_error or "")
    assert normalize(openai_call("c", "now", "")).arguments == {}
    with pytest.raises(MalformedRequestError, match="provider tool call"):
        normalize({"type": "text", "text": "hello"})
    with pytest.raises(MalformedRequestError, match="tool call id must be a non-empty string"):
        normalize({"type": "tool_use", "id": 7, "name": "add", "input": {}})


def test_tool_calls_in_whole_responses() -> None:
    completion = ChatCompletion.model_validate(
        {
            "id": "cc",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [openai_call("call_a", "add", "{}").model_dump()],
                    },
                }
            ],
        }
    )
    assert [c.id for c in tool_calls_in(completion)] == ["call_a"]
    message = AnthropicMessage.model_validate(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [
                {"type": "text", "text": "let me add"},
                anthropic_call("toolu_1", "add", {"a": 1, "b": 1}).model_dump(),
            ],
        }
    )
    assert [b.id for b in tool_calls_in(message)] == ["toolu_1"]
    output = {
        "output": [
            {"type": "message", "content": []},
            responses_call("call_r", "add", "{}").model_dump(),
        ]
    }
    assert [i["call_id"] for i in tool_calls_in(output)] == ["call_r"]


def test_results_render_in_each_providers_shape() -> None:
    done = ActionResponseModel(function="add", output={"sum": 3}, call_id="x", tool_call_id="c1")
    text = ActionResponseModel(function="echo", output="hi", call_id="y", tool_call_id="c2")
    failed = ActionResponseModel(
        function="add",
        status=EventStatus.FAILED,
        error="TypeError: bad",
        call_id="z",
        tool_call_id="c3",
    )
    assert done.to_openai() == {"role": "tool", "tool_call_id": "c1", "content": '{"sum": 3}'}
    assert text.to_openai_responses() == {
        "type": "function_call_output",
        "call_id": "c2",
        "output": "hi",
    }
    assert failed.to_anthropic() == {
        "type": "tool_result",
        "tool_use_id": "c3",
        "content": "TypeError: bad",
        "is_error": True,
    }
    assert done.to_anthropic()["is_error"] is False
    for message in render_results([done, text, failed], "openai"):
        TypeAdapter(ChatCompletionToolMessageParam).validate_python(message)
    for item in render_results([done, text, failed], "openai-responses"):
        TypeAdapter(FunctionCallOutput).validate_python(item)
    blocks = render_results([done, text, failed], "anthropic")
    assert [b["tool_use_id"] for b in blocks] == ["c1", "c2", "c3"]
    for block in blocks:
        TypeAdapter(ToolResultBlockParam).validate_python(block)
    with pytest.raises(ConfigurationError, match="'gemini' is not one of"):
        render_results([done], "gemini")


# Free-form text that happens to look like JSON: a custom call's input is never decoded.
_TEXT = '{"not": "decoded"}'


@pytest.mark.parametrize(
    "request_",
    [
        openai_custom_call("call_1", "shout", _TEXT),
        {"id": "call_1", "type": "custom", "custom": {"name": "shout", "input": _TEXT}},
        responses_custom_call("call_1", "shout", _TEXT),
        {"type": "custom_tool_call", "call_id": "call_1", "name": "shout", "input": _TEXT},
    ],
    ids=["chat-sdk", "chat-dict", "responses-sdk", "responses-dict"],
)
def test_custom_tool_calls_keep_their_text_input_and_id(request_: Any) -> None:
    envelope = normalize(request_)
    assert (envelope.function, envelope.arguments, envelope.tool_call_id) == (
        "shout",
        _TEXT,
        "call_1",
    )
    assert envelope.tool_call_type == "custom" and envelope.arguments_error is None
    assert normalize(openai_call("call_2", "add", "{}")).tool_call_type == "function"
    with pytest.raises(MalformedRequestError, match="non-empty tool name") as raised:
        normalize(responses_custom_call("call_3", "", "text"))
    assert (raised.value.tool_call_id, raised.value.tool_call_type) == ("call_3", "custom")


def test_custom_results_render_as_their_own_item_type() -> None:
    custom = ActionResponseModel(
        function="shout", output="HI", call_id="x", tool_call_id="c1", tool_call_type="custom"
    )
    function = ActionResponseModel(function="add", output=3, call_id="y", tool_call_id="c2")
    assert custom.to_openai_responses() == {
        "type": "custom_tool_call_output",
        "call_id": "c1",
        "output": "HI",
    }
    items = render_results([custom, function], "openai-responses")
    assert [i["type"] for i in items] == ["custom_tool_call_output", "function_call_output"]
    TypeAdapter(ResponseCustomToolCallOutputParam).validate_python(items[0])
    TypeAdapter(FunctionCallOutput).validate_python(items[1])
    # Chat Completions answers a custom call with the same tool message as any call.
    assert custom.to_openai() == {"role": "tool", "tool_call_id": "c1", "content": "HI"}
    assert render_results([custom], "anthropic")[0]["tool_use_id"] == "c1"


# -- through real workers ----------------------------------------------------------------


# A custom tool call's input goes to the tool's one string parameter: loaded_modules(prefix)
# answers with the modules under its input (the worker's own tool module, here), fail(message)
# raises it. add (two numbers) and echo (any JSON value) take no free-form text.
_TOOL_MODULE = "tests.support.sample_tools"


def test_chat_custom_and_function_calls_run_in_one_batch_with_the_models_ids(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    message = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                openai_call("call_f1", "add", '{"a": 1, "b": 2}').model_dump(),
                openai_custom_call("call_c1", "loaded_modules", _TOOL_MODULE).model_dump(),
                openai_custom_call("call_c2", "add", "1 + 2").model_dump(),
                openai_custom_call("call_c3", "loaded_modules_async", _TOOL_MODULE).model_dump(),
                openai_custom_call("call_c4", "fail", "said by the model").model_dump(),
                openai_custom_call("call_c5", "no_such_tool", "text").model_dump(),
            ],
        }
    )
    calls = tool_calls_in(message)
    assert [type(c).__name__ for c in calls[:2]] == [
        "ChatCompletionMessageFunctionToolCall",
        "ChatCompletionMessageCustomToolCall",
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(calls)

    branch, results = run(fleet_settings, scenario)
    ids = ["call_f1", "call_c1", "call_c2", "call_c3", "call_c4", "call_c5"]
    assert [r.tool_call_id for r in results] == ids
    assert [r.call_id for r in results] == [call_id_for(branch.id, i) for i in ids]
    assert [r.tool_call_type for r in results] == ["function"] + ["custom"] * 5
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
        EventStatus.ABORTED,
    ]
    assert results[0].output == 3
    assert results[1].output == results[3].output == [_TOOL_MODULE]
    assert results[1].arguments == {"prefix": _TOOL_MODULE}
    assert "must take exactly one string parameter" in (results[2].error or "")
    assert "said by the model" in (results[4].error or "")
    assert "no_such_tool" in (results[5].error or "")
    assert_linked_pairs(branch, results)
    for i, tool_call_id in enumerate(ids):
        request, response = branch.messages[2 * i], branch.messages[2 * i + 1]
        assert request.content.tool_call_id == response.content.tool_call_id == tool_call_id
    assert branch.messages[2].content.arguments == {"prefix": _TOOL_MODULE}
    # The next request answers every call, custom ones included, under the model's ids.
    answers = render_results(results, "openai")
    assert [m["tool_call_id"] for m in answers] == ids
    for answer in answers:
        TypeAdapter(ChatCompletionToolMessageParam).validate_python(answer)


def test_responses_custom_and_function_calls_answer_with_their_own_item_types(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    text = ResponseOutputMessage.model_validate(
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "running them", "annotations": []}],
        }
    )
    output = [
        text,
        responses_custom_call("call_c1", "loaded_modules_async", _TOOL_MODULE),
        responses_call("call_f1", "add", '{"a": 2, "b": 2}'),
        responses_custom_call("call_c2", "echo", "anything"),
        responses_custom_call("call_c3", "", "nameless"),
        responses_custom_call("call_c4", "loaded_modules", _TOOL_MODULE),
    ]
    calls = tool_calls_in({"output": output})
    assert calls == output[1:]  # the text item is left out, no call is

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(calls)

    branch, results = run(fleet_settings, scenario)
    ids = ["call_c1", "call_f1", "call_c2", "call_c3", "call_c4"]
    assert [r.tool_call_id for r in results] == ids
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
    ]
    assert results[0].output == results[4].output == [_TOOL_MODULE]
    assert results[1].output == 4
    assert "must take exactly one string parameter" in (results[2].error or "")
    assert "non-empty tool name" in (results[3].error or "")
    assert_linked_pairs(branch, results)
    items = render_results(results, "openai-responses")
    assert [(i["type"], i["call_id"]) for i in items] == [
        ("custom_tool_call_output", "call_c1"),
        ("function_call_output", "call_f1"),
        ("custom_tool_call_output", "call_c2"),
        ("custom_tool_call_output", "call_c3"),
        ("custom_tool_call_output", "call_c4"),
    ]
    for item in items:
        if item["type"] == "custom_tool_call_output":
            TypeAdapter(ResponseCustomToolCallOutputParam).validate_python(item)
        else:
            TypeAdapter(FunctionCallOutput).validate_python(item)
    assert json.loads(items[0]["output"]) == [_TOOL_MODULE]


# -- through real workers (any call) --------------------------------------------------------


def test_mixed_sdk_calls_keep_their_ids_everywhere(
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    redis_client: redis.Redis,
) -> None:
    calls = [
        openai_call("call_A", "add", '{"a": 1, "b": 2}'),
        anthropic_call("toolu_B", "sleep_async", {"seconds": 0.01}),
        responses_call("call_C", "with_secret", '{"query": "q", "api_key": "sk-hidden"}'),
        openai_call("call_D", "add", '{"a": 1,'),  # not JSON: this call's error alone
        {"function": "echo", "arguments": {"value": "plain"}},  # no id: a generated one
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(calls)

    branch, results = run(fleet_settings, scenario)
    assert [r.tool_call_id for r in results[:4]] == ["call_A", "toolu_B", "call_C", "call_D"]
    assert results[4].tool_call_id == results[4].call_id
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
    ]
    assert results[0].output == 3
    assert "not JSON" in (results[3].error or "")
    assert_linked_pairs(branch, results)
    for i, result in enumerate(results):
        request, response = branch.messages[2 * i], branch.messages[2 * i + 1]
        assert request.content.tool_call_id == response.content.tool_call_id == result.tool_call_id
        assert request.content.call_id == response.content.call_id == result.call_id
    assert branch.messages[4].content.arguments["api_key"] == "***"
    by_call = {e.call_id: e for e in branch.events}
    assert [by_call[r.call_id].tool_call_id for r in results] == [r.tool_call_id for r in results]
    # the worker's own record carries the id too
    keys = Keys(fleet_settings.key_prefix)
    raw = redis_client.get(keys.event(results[0].call_id))
    assert raw is not None
    assert CallResult.model_validate_json(raw).event["tool_call_id"] == "call_A"
    assert results[0].call_id == call_id_for(branch.id, "call_A")
    # the provider-shaped answers pair up by id, in input order
    blocks = render_results(results, "anthropic")
    assert [b["tool_use_id"] for b in blocks] == [r.tool_call_id for r in results]
    assert [b["is_error"] for b in blocks] == [False, False, False, True, False]


def test_replaying_a_response_does_not_rerun_finished_tools(
    fleet_settings: Settings, sync_worker: WorkerProcess, tmp_path: Path
) -> None:
    path = tmp_path / "side-effects.txt"
    arguments = json.dumps({"path": str(path), "text": "once"})
    response = [openai_call("call_once", "append_line", arguments)]

    async def scenario(fleet: Fleet) -> tuple[list[ActionResponseModel], list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        first = await branch.act(response)
        again = await branch.act(response)  # e.g. the agent loop retried its turn
        other = await Branch(fleet=fleet).act(response)  # another branch: its own call
        return first + again, other

    replayed, other = run(fleet_settings, scenario)
    assert [r.output for r in replayed] == [1, 1]
    assert replayed[0].call_id == replayed[1].call_id
    assert other[0].output == 2 and other[0].call_id != replayed[0].call_id
    assert path.read_text().splitlines() == ["once", "once"]


def test_given_action_request_is_the_one_history_keeps_and_duplicates_fail_alone(
    fleet_settings: Settings, sync_worker: WorkerProcess
) -> None:
    given = ActionRequest(content=ActionRequestContent(function="add", arguments={"a": 2, "b": 2}))

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [
                given,
                openai_call("dup", "add", '{"a": 1, "b": 1}'),
                openai_call("dup", "add", '{"a": 5, "b": 5}'),
            ]
        )
        return branch, results

    branch, results = run(fleet_settings, scenario)
    assert branch.messages[0] is given
    assert given.content.action_response_id == branch.messages[1].id
    assert results[0].tool_call_id == given.id and results[0].output == 4
    assert results[1].output == 2
    assert results[2].status is EventStatus.ABORTED
    assert "already names call 1" in (results[2].error or "")
    assert results[2].tool_call_id == "dup" and results[2].call_id != results[1].call_id


def test_cli_run_reads_provider_lines_and_ids(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    lines = [
        json.dumps({"function": "add", "arguments": {"a": 1, "b": 2}, "id": "call_1"}),
        openai_call("call_2", "add", '{"a": 2, "b": 2}').model_dump_json(),
        anthropic_call("toolu_3", "sleep_async", {"seconds": 0.01}).model_dump_json(),
        json.dumps({"function": "add", "arguments": '{"a": 1'}),  # bad JSON string: fails alone
        json.dumps({"function": "add", "arguments": {}, "id": 5}),  # malformed id
    ]
    proc = toolfleet(
        "run", "-", "--tools", "tests.support.sample_tools", "--json",
        home=tmp_path, env={"TOOLFLEET_BROKER_URL": redis_url}, stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [r["tool_call_id"] for r in records[:3]] == ["call_1", "call_2", "toolu_3"]
    assert [r["output"] for r in records[:3]] == [3, 4, 0.01]
    assert records[3]["outcome"] == "failed" and "not JSON" in records[3]["error"]
    assert (
        records[4]["outcome"] == "malformed" and '"id" must be a non-empty' in records[4]["error"]
    )


def test_flower_args_show_the_tool_call_id() -> None:
    from toolfleet.dispatcher.send.enqueue import _argsrepr
    from toolfleet.schemas.tool import Tool
    from toolfleet.schemas.wire import CallMessage

    message = CallMessage(call_id="c", tool_call_id="call_X", function="add", arguments={})
    shown = _argsrepr(message, Tool(func_callable=lambda: None, function="add"))
    assert "'tool_call_id': 'call_X'" in shown
    # Flower names the task from the first 'function' key; the id comes after it.
    assert shown.index("'function': 'add'") < shown.index("'tool_call_id'")
