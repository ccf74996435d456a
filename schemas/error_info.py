"""A call's error as data: :class:`ErrorInfo` (type, module, message, fields), how a worker
stores it in a record and reads it back, and :func:`rebuild_error` for the caller's side.

Beside the text ``ActionResponseModel.error`` ("Type: message", unchanged), a result carries
``error_info``, so no reader parses the text: an adapter reads ``fields["retry_after_s"]`` of a
rate-limited call, not a number out of its message. A record's ``execution.error`` keeps the
ADR-0012 D1 shape ``{"error": <type name>, "message": <text>}`` and adds ``module`` (always),
``fields`` (when there are any) and ``qualname`` (for a nested class only); a record written
before these keys existed still reads back (:meth:`ErrorInfo.from_record`).
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field

import toolfleet.schemas.errors as toolfleet_errors
from toolfleet.schemas.errors import RemoteToolError, ToolfleetError
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.serialize import describe_exception, to_jsonable

__all__ = ["ErrorInfo", "error_record", "rebuild_error"]


class ErrorInfo(ToolfleetModel):
    """One call's error as structure: what :attr:`ActionResponseModel.error` says as text."""

    model_config = ConfigDict(frozen=True)

    # The exception class's __qualname__ ("ValueError", "ToolTimeoutError").
    type: str
    # The class's __module__ ("builtins", "toolfleet.schemas.errors", "myapp.errors").
    module: str
    # The exception's text (what follows "Type: " in the error text).
    message: str
    # The attributes a caller acts on, JSON only: retry_after_s (RateLimitedError), argument
    # (ArgumentValidationError), timeout_s (ToolTimeoutError); {} when none.
    fields: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> ErrorInfo:
        """The structure of ``exc``, as a result carries it."""
        return cls.from_record(error_record(exc)) or cls(type="", module="", message="")

    @classmethod
    def from_record(cls, error: Any) -> ErrorInfo | None:
        """The structure of a record's ``execution.error`` (None when it holds none). A record
        written before ``module`` was stored names a toolfleet or builtin class by name only:
        its module is found from the name, or left empty."""
        if error is None:
            return None
        if not isinstance(error, Mapping) or "error" not in error:
            return cls(type="Exception", module="builtins", message=str(error))
        name = str(error.get("qualname") or error["error"])
        module = error.get("module")
        if not isinstance(module, str):
            module = _module_by_name(name)
        fields = error.get("fields")
        return cls(
            type=name,
            module=module,
            message=str(error.get("message") or ""),
            fields=dict(fields) if isinstance(fields, Mapping) else {},
        )

    @property
    def text(self) -> str:
        """``"<Type>: <message>"``, the form of ``ActionResponseModel.error``."""
        return f"{self.type.rpartition('.')[2]}: {self.message}"


def error_record(exc: BaseException) -> dict[str, Any]:
    """``exc`` as a record's ``execution.error`` stores it: the D1 ``error``/``message`` pair
    (:func:`toolfleet.schemas.serialize.describe_exception`) with ``module``, and ``fields``
    and ``qualname`` when they say something."""
    record: dict[str, Any] = describe_exception(exc)
    cls = type(exc)
    record["module"] = str(cls.__module__)
    if cls.__qualname__ != cls.__name__:
        record["qualname"] = cls.__qualname__
    fields = _fields(exc)
    if fields:
        record["fields"] = fields
    return record


def _fields(exc: BaseException) -> dict[str, Any]:
    names = getattr(type(exc), "info_fields", ())
    if not isinstance(names, tuple):
        return {}
    fields: dict[str, Any] = {}
    for name in names:
        value = getattr(exc, name, None) if isinstance(name, str) else None
        if value is not None:
            fields[name] = to_jsonable(value)
    return fields


def _module_by_name(name: str) -> str:
    if isinstance(getattr(toolfleet_errors, name, None), type):
        return toolfleet_errors.__name__
    if isinstance(getattr(builtins, name, None), type):
        return "builtins"
    return ""


def rebuild_error(info: ErrorInfo) -> BaseException:
    """An exception on the caller's side for a call's recorded error.

    When ``info.module`` is already imported in this process (a module is never imported
    for a record: that would run code a record names) and holds an ``Exception`` subclass
    ``info.type`` whose constructor takes the message, an instance of it (a toolfleet error
    gets its ``fields`` back as attributes); otherwise a
    :class:`~toolfleet.schemas.errors.RemoteToolError` naming the type, module and fields.
    """
    cls = _class_of(info)
    if cls is not None:
        try:
            exc = cls(info.message)
        except Exception:  # e.g. ExceptionGroup needs two arguments
            exc = None
        if exc is not None:
            if isinstance(exc, ToolfleetError):
                for name, value in info.fields.items():
                    try:
                        setattr(exc, name, value)
                    except (AttributeError, TypeError):
                        pass  # a read-only attribute keeps the class's own value
            return exc
    return RemoteToolError(
        info.message, type_name=info.type, module=info.module, fields=info.fields
    )


def _class_of(info: ErrorInfo) -> type[Exception] | None:
    module = sys.modules.get(info.module or _module_by_name(info.type))
    if module is None or not info.type:
        return None
    found: Any = module
    for part in info.type.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return None
