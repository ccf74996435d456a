"""ErrorInfo: an exception as structure, its record form, old records, and rebuild_error."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

import toolfleet.schemas.errors as errors_module
from toolfleet import (
    ActionResponseModel,
    ArgumentValidationError,
    ErrorInfo,
    RateLimitedError,
    RemoteToolError,
    ToolTimeoutError,
    UnknownToolError,
    rebuild_error,
)
from toolfleet.schemas.error_info import error_record
from toolfleet.schemas.execution import Execution
from toolfleet.schemas.status import EventStatus


class Outer:
    class Nested(Exception):
        """A class whose __qualname__ is not its __name__."""


class NeedsTwo(Exception):
    def __init__(self, first: str, second: str) -> None:
        super().__init__(first, second)


def test_a_builtin_error() -> None:
    info = ErrorInfo.of(ValueError("bad value 7"))
    assert info == ErrorInfo(type="ValueError", module="builtins", message="bad value 7")
    assert info.fields == {} and info.text == "ValueError: bad value 7"


def test_toolfleet_errors_carry_their_fields_and_leave_out_unknown_ones() -> None:
    limited = ErrorInfo.of(RateLimitedError("over", retry_after_s=0.4))
    assert limited.fields == {"retry_after_s": 0.4}
    assert limited.module == "toolfleet.schemas.errors"
    timeout = ErrorInfo.of(ToolTimeoutError("late", timeout_s=2.0))
    assert timeout.fields == {"timeout_s": 2.0}
    argument = ErrorInfo.of(ArgumentValidationError("no", argument="path"))
    assert argument.fields == {"argument": "path"}
    assert ErrorInfo.of(ToolTimeoutError("late")).fields == {}  # None is left out


def test_a_nested_class_is_named_by_its_qualname_and_its_text_by_its_name() -> None:
    info = ErrorInfo.of(Outer.Nested("deep"))
    assert (info.type, info.module) == ("Outer.Nested", __name__)
    assert info.text == "Nested: deep"  # format_error's text, unchanged
    assert type(rebuild_error(info)) is Outer.Nested


def test_the_record_keeps_the_d1_pair_and_adds_module_and_fields() -> None:
    record = error_record(RateLimitedError("over", retry_after_s=1.0))
    assert record == {
        "error": "RateLimitedError",
        "message": "over",
        "module": "toolfleet.schemas.errors",
        "fields": {"retry_after_s": 1.0},
    }
    assert ErrorInfo.from_record(record) == ErrorInfo.of(RateLimitedError("over", retry_after_s=1))
    stored = Execution(status=EventStatus.FAILED, error=ValueError("v")).to_dict()["error"]
    assert stored == {"error": "ValueError", "message": "v", "module": "builtins"}


def test_a_record_written_before_the_structure_still_reads() -> None:
    old = ErrorInfo.from_record({"error": "UnknownToolError", "message": "no such tool"})
    assert old == ErrorInfo(
        type="UnknownToolError", module="toolfleet.schemas.errors", message="no such tool"
    )
    assert isinstance(rebuild_error(old), UnknownToolError)
    builtin = ErrorInfo.from_record({"error": "KeyError", "message": "'k'"})
    assert builtin is not None and builtin.module == "builtins"
    mystery = ErrorInfo.from_record({"error": "_Boom", "message": "x"})
    assert mystery is not None and mystery.module == ""
    assert ErrorInfo.from_record(None) is None


def test_rebuild_gives_the_class_back_with_its_fields() -> None:
    info = ErrorInfo(
        type="RateLimitedError",
        module="toolfleet.schemas.errors",
        message="call not run",
        fields={"retry_after_s": 12.5},
    )
    rebuilt = rebuild_error(info)
    assert type(rebuilt) is RateLimitedError
    assert str(rebuilt) == "call not run" and rebuilt.retry_after_s == 12.5


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (ErrorInfo(type="Gone", module="never.imported.here", message="m"), "module absent"),
        (ErrorInfo(type="Missing", module="builtins", message="m"), "no such class"),
        (ErrorInfo(type="len", module="builtins", message="m"), "not a class"),
        (ErrorInfo(type="KeyboardInterrupt", module="builtins", message="m"), "not Exception"),
        (ErrorInfo(type="NeedsTwo", module=__name__, message="m"), "constructor refuses"),
    ],
)
def test_rebuild_falls_back_to_remote_tool_error(info: ErrorInfo, why: str) -> None:
    info = info.model_copy(update={"fields": {"code": 7}})
    rebuilt = rebuild_error(info)
    assert type(rebuilt) is RemoteToolError, why
    assert (rebuilt.type_name, rebuilt.module, rebuilt.fields) == (
        info.type,
        info.module,
        {"code": 7},
    )
    assert str(rebuilt) == "m"


def test_rebuild_never_imports_a_module_a_record_names() -> None:
    name = "toolfleet_test_not_imported_module"
    assert name not in sys.modules
    rebuilt = rebuild_error(ErrorInfo(type="ValueError", module=name, message="m"))
    assert type(rebuilt) is RemoteToolError and name not in sys.modules
    module = types.ModuleType(name)
    module.Custom = type("Custom", (Exception,), {})  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        again = rebuild_error(ErrorInfo(type="Custom", module=name, message="m"))
        assert type(again) is module.Custom  # type: ignore[attr-defined]
    finally:
        del sys.modules[name]


def test_a_result_with_error_info_still_shares_its_field_names() -> None:
    def result(i: int, info: ErrorInfo | None) -> ActionResponseModel:
        return ActionResponseModel(
            function="f",
            arguments={},
            output=None,
            status=EventStatus.FAILED,
            error="ValueError: v",
            call_id=f"c{i}",
            tool_call_id=f"c{i}",
            error_info=info,
        )

    info = ErrorInfo.of(ValueError("v"))
    first, second = result(1, info), result(2, None)
    assert first.model_fields_set is second.model_fields_set
    assert first.error_info == info and second.error_info is None
    assert ActionResponseModel(function="f").model_fields_set == {"function"}


def _package_sources() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    folders = [root / "schemas", root / "dispatcher", root / "workers", root / "toolfleet"]
    return [
        path
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        if not path.is_symlink() and not any(p.is_symlink() for p in path.parents)
    ]


def test_no_code_splits_an_error_text_back_into_type_and_message() -> None:
    """Readers use ErrorInfo: nothing in the package splits "Type: message" text, and no
    error class reads a field back out of its message."""
    offenders = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"split", "rsplit", "partition", "rpartition", "index"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == ": "
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
    assert "re.compile" not in (Path(errors_module.__file__ or "").read_text())
