"""A parameter an agent framework injects (LangChain's ``InjectedToolArg`` and its subclasses,
LangGraph's ``InjectedState`` / ``InjectedStore``, ``InjectedToolCallId``, ``ToolRuntime``)
is not in a toolfleet tool's spec, not required of the model, not validated as a model
argument, and hidden in records like a secret argument."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from langchain_core.tools import InjectedToolArg, InjectedToolCallId
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime

from toolfleet.schemas.function_calling import normalize_arguments, redact
from toolfleet.schemas.injected import marks_injection
from toolfleet.schemas.tool import Tool
from toolfleet.workers.specs import parameters_schema


class TenantTag(InjectedToolArg):
    """An application's own marker."""


def everything(
    query: str,
    auth: Annotated[str, InjectedState("auth")],
    state: Annotated[dict[str, Any], InjectedState],
    store: Annotated[Any, InjectedStore()],
    call_id: Annotated[str, InjectedToolCallId],
    tenant: Annotated[str, TenantTag()],
    runtime: ToolRuntime,
    maybe: Optional[Annotated[str, InjectedToolArg]] = None,  # noqa: UP045
    limit: Annotated[int, "a plain note, not an injection"] = 10,
) -> str:
    return query


def test_injected_parameters_are_left_out_of_the_spec_and_the_model_arguments() -> None:
    tool = Tool(func_callable=everything)
    hidden = {"auth", "state", "store", "call_id", "tenant", "runtime", "maybe"}
    assert tool.injected_args == hidden
    assert parameters_schema(tool) == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"default": 10, "type": "integer"},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert tool.minimum_acceptable_fields == {"query"}
    # The framework's values, sent by an adapter, pass; they are hidden like secrets.
    sent = {"query": "q", "auth": "token", "call_id": "c1", "state": {"n": 1}}
    assert normalize_arguments(tool, sent) == sent
    assert hidden <= tool.secret_args
    assert redact(sent, tool.secret_args) == {
        "query": "q",
        "auth": "***",
        "call_id": "***",
        "state": "***",
    }


def test_what_counts_as_an_injection_marker() -> None:
    assert marks_injection(Annotated[str, InjectedState("x")])
    assert marks_injection(Annotated[str, InjectedToolArg])  # the class, not an instance
    assert marks_injection(ToolRuntime) and marks_injection(ToolRuntime[None, dict])
    assert marks_injection(Annotated[str, TenantTag()] | None)
    assert not marks_injection(Annotated[str, "note"]) and not marks_injection(int)
