"""The tool registry and the @tool decorator (pure logic: no Redis, no workers)."""

from __future__ import annotations

import pytest

from toolfleet.schemas.errors import ConfigurationError, DuplicateToolError, UnknownToolError
from toolfleet.workers.registry import Registry, tool


def test_tool_registers_and_returns_the_function() -> None:
    reg = Registry()

    @tool(registry=reg)
    def double(x: int) -> int:
        return 2 * x

    assert double(2) == 4  # still an ordinary function
    assert reg.names() == ["double"]
    assert "double" in reg
    t = reg.get("double")
    assert t.func_callable is double and t.kind == "sync" and not t.idempotent


def test_options_reach_the_tool() -> None:
    reg = Registry()

    @tool(name="search", timeout_s=2.5, secret_args=("key",), idempotent=True, registry=reg)
    async def _search(q: str, key: str) -> str:
        return q

    t = reg.get("search")
    assert (t.kind, t.timeout_s, t.secret_args, t.idempotent) == (
        "async",
        2.5,
        frozenset({"key"}),
        True,
    )


def test_a_taken_name_is_an_error_unless_update() -> None:
    reg = Registry()

    @tool(name="f", registry=reg)
    def first() -> int:
        return 1

    with pytest.raises(DuplicateToolError, match=r"'f'.*update=True"):

        @tool(name="f", registry=reg)
        def second() -> int:
            return 2

    @tool(name="f", update=True, registry=reg)
    def third() -> int:
        return 3

    assert reg.get("f").func_callable is third


def test_unknown_tool_names_the_tool_and_the_modules_loaded() -> None:
    reg = Registry()
    reg.load_modules(["json"])
    with pytest.raises(UnknownToolError, match=r"'nope'.*\['json'\]"):
        reg.get("nope")
    assert reg.loaded_modules == ("json",)


def test_a_bad_tool_module_is_a_configuration_error_naming_toolfleet_tools() -> None:
    with pytest.raises(ConfigurationError, match=r"'no_such_module_xyz'.*TOOLFLEET_TOOLS"):
        Registry().load_modules(["no_such_module_xyz"])
