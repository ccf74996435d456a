"""Every error toolfleet raises is under ToolfleetError, in its families, and the old names
and the builtins they replaced still catch them (the promise of toolfleet.schemas.errors)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import toolfleet
import toolfleet.schemas
from toolfleet.schemas import errors
from toolfleet.schemas.model import ToolfleetModel

ROOT = Path(__file__).resolve().parents[2]
# The package's folders and the module name each stands for.
FOLDERS = {
    "toolfleet.schemas": ROOT / "schemas",
    "toolfleet.broker": ROOT / "toolfleet" / "broker",
    "toolfleet.dispatcher": ROOT / "dispatcher",
    "toolfleet.workers": ROOT / "workers",
    "toolfleet.cli": ROOT / "toolfleet" / "cli",
    "toolfleet.adapters": ROOT / "toolfleet" / "adapters",
    "toolfleet.embedded": ROOT / "toolfleet" / "embedded",
}
# What toolfleet raises on purpose that is not its own, and why.
NOT_OURS = {
    "builtins.SystemExit": "a command's exit status",
    "builtins.NotImplementedError": "an abstract method a subclass must provide",
    "builtins.IndexError": "the sequence protocol: a compact history's index out of range",
    "builtins.AttributeError": "the module __getattr__ protocol: no such name",
    "builtins.StopAsyncIteration": "the async iterator protocol: stdin has ended",
    "pydantic_ai.exceptions.ModelRetry": "Pydantic AI's own signal, which its agent loop acts on",
    "pydantic_ai.exceptions.ToolFailed": "Pydantic AI's own signal, which its agent loop acts on",
    "langchain_core.tools.base.ToolException": "LangChain's tool failure, rendered by ToolNode",
    "billiard.exceptions.SoftTimeLimitExceeded": "Celery's, raised into a sync tool as it does",
    "celery.exceptions.Ignore": "Celery's, telling it the task's state is already recorded",
    "redis.exceptions.TimeoutError": "redis-py's, so its retry logic applies",
    "redis.exceptions.ConnectionError": "redis-py's, so Celery reconnects as for any broker loss",
    "asyncio.exceptions.CancelledError": "asyncio's cancellation, passed on as asyncio requires",
    "argparse.ArgumentTypeError": "argparse's, which it turns into a usage message",
    "toolfleet.schemas.serialize._Unserializable": "caught where raised; never leaves to_jsonable",
    "mcp.shared.exceptions.MCPError": "the MCP SDK's JSON-RPC error, sent as the error response",
    "agents.exceptions.ModelBehaviorError": "the Agents SDK's, for bad model output, as it raises",
    "pydantic_ai.exceptions.UserError": "Pydantic AI's, for a misused RunContext, as it raises",
}
# Tool bodies, whose errors are their tools' own (the demo's tools fail on purpose).
TOOL_MODULES = {"toolfleet.cli.demo_tools"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _raised_classes() -> list[tuple[str, int, str, type]]:
    """(module, line, the name as written, the class) of every ``raise X(...)``/``raise X``
    whose X is a class named at module level (a local variable or a factory is skipped)."""
    raised = []
    for name, path in _modules().items():
        if name in TOOL_MODULES or name.endswith(".__main__"):  # __main__ runs a command
            continue
        module = importlib.import_module(name)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            written = ast.unparse(target)
            value: object = module
            for i, part in enumerate(written.split(".")):
                if i:
                    value = getattr(value, part, None)
                else:  # a name of the module's, else a builtin's (ValueError, ...)
                    value = vars(module).get(part, getattr(builtins, part, None))
                if value is None:
                    break
            if inspect.isclass(value) and issubclass(value, BaseException):
                raised.append((name, node.lineno, written, value))
    return raised


def test_every_class_toolfleet_raises_is_a_toolfleet_error() -> None:
    raised = _raised_classes()
    assert len(raised) > 100  # the walk sees the package
    strays = [
        f"{module}:{line} raises {written}"
        for module, line, written, cls in raised
        if not issubclass(cls, errors.ToolfleetError)
        and f"{cls.__module__}.{cls.__qualname__}" not in NOT_OURS
    ]
    assert strays == []


def test_every_exported_error_is_a_toolfleet_error_in_one_family() -> None:
    families = (
        errors.RequestError,
        errors.CallError,
        errors.ApprovalError,
        errors.SetupError,
        errors.ControlSignal,
        errors.InternalError,
    )
    exported = {
        getattr(module, name)
        for module in (toolfleet, toolfleet.schemas, errors)
        for name in module.__all__
    }
    classes = [c for c in exported if inspect.isclass(c) and issubclass(c, BaseException)]
    assert len(classes) >= 30
    for cls in classes:
        assert issubclass(cls, errors.ToolfleetError), cls
        if cls not in families and cls is not errors.ToolfleetError:
            assert issubclass(cls, families), cls
        if cls is not errors.ToolfleetError:
            assert (cls.__doc__ or "").startswith("Raised "), cls  # "Raised when..."


def test_the_old_names_and_the_builtins_still_catch() -> None:
    from toolfleet.adapters.openai_agents import FleetToolError

    assert issubclass(toolfleet.StopHook, errors.ControlSignal)
    assert issubclass(FleetToolError, errors.CallError)
    assert issubclass(errors.ApprovalNotWaitingError, errors.ApprovalError | LookupError)
    assert issubclass(errors.ApprovalNotWaitingError, LookupError)
    assert issubclass(errors.ApprovalRequired, errors.ControlSignal)
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.UsageError, RuntimeError) and issubclass(
        errors.InternalError, RuntimeError
    )
    assert issubclass(errors.NoCurrentCallError, RuntimeError)
    assert issubclass(errors.ModelValidationError, ValidationError)
    # By the builtin's very name: the text a model reads does not change.
    for ours, builtin in (
        (errors.PolicyDeniedError, PermissionError),
        (errors.WrongTypeError, TypeError),
    ):
        assert issubclass(ours, builtin) and ours.__name__ == builtin.__name__
        assert ours.__module__ == "toolfleet.schemas.errors"
    with pytest.raises(PermissionError):
        raise errors.PolicyDeniedError("permission denied: no")


def _models() -> list[type[BaseModel]]:
    found = []
    for name in _modules():
        if not name.startswith("toolfleet.schemas"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseModel)
                and value.__module__ == name
                and value is not ToolfleetModel
            ):
                found.append(value)
    return found


def test_every_schemas_model_raises_a_toolfleet_validation_error() -> None:
    models = _models()
    assert len(models) >= 10
    assert [m.__name__ for m in models if not issubclass(m, ToolfleetModel)] == []
    from toolfleet import CallParams, Settings

    for build in (
        lambda: CallParams(timeout_s=-1),
        lambda: CallParams.model_validate({"retry_attempts": "many"}),
        lambda: Settings.model_validate_json('{"outage_limit_s": "soon"}'),
    ):
        with pytest.raises(ValidationError) as caught:
            build()
        assert isinstance(caught.value, errors.ModelValidationError)
        assert isinstance(caught.value, errors.SetupError)
    # The same text and errors() as pydantic's own.
    with pytest.raises(ValidationError) as ours:
        CallParams(timeout_s=-1)
    assert "must be a positive number of seconds or None, got -1" in str(ours.value)
    assert ours.value.errors()[0]["loc"] == ("timeout_s",)
