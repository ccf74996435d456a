"""The strict JSON contract a call's arguments keep, checked by the dispatcher and the worker.

Both sides run the same :func:`check_arguments`, so a hand-made message cannot carry what the
dispatcher would have refused. The contract: strings encodable as UTF-8 (no lone surrogates),
string keys only, integers within 64 bits, finite floats, nesting at most ``MAX_DEPTH`` deep,
and the whole at most ``max_bytes`` as JSON. A breach names the offending path
(``arguments.items[3].name: lone surrogate U+D800``) and what to do instead.

The other half of the contract is that the paths which *record* a call (history, logs,
``repr``) are total: :func:`safe_text` and :func:`safe_repr` never raise, whatever they get.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Mapping
from typing import Any

from toolfleet.schemas.errors import ArgumentValidationError, NotJSONError, OversizedArgumentsError

__all__ = [
    "MAX_DEPTH",
    "MAX_INT",
    "MIN_INT",
    "check_arguments",
    "format_path",
    "int_digits",
    "safe_repr",
    "safe_text",
]

# Matches toolfleet.schemas.serialize's recursion guard, so whatever passes can be recorded
# faithfully.
MAX_DEPTH = 100
# A signed 64-bit integer: what every JSON consumer on the way (Redis' cjson, Flower, a
# tool in another language) reads back exactly. Larger numbers travel as strings.
MIN_INT = -(2**63)
MAX_INT = 2**63 - 1

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH_CHARS = 160
_JSON_TYPES = "str, int, float, bool, None, list or dict values"

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 3


def safe_text(text: str) -> str:
    """``text`` with each lone surrogate spelled as ``\\udXXX``, so it encodes as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def safe_repr(value: Any, limit: int = 80) -> str:
    """A short ``repr`` that never raises (a raising ``__repr__``, a 5,000-digit integer)."""
    try:
        text = _repr.repr(value)
    except Exception:
        text = f"<unrepresentable {type(value).__name__}>"
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_digits(value: int) -> int:
    """The number of decimal digits of ``value``, without ``str()`` (which refuses > 4300)."""
    bits = abs(value).bit_length()
    return max(1, int(bits * 0.30103) + 1)


def check_arguments(
    function: str,
    arguments: Mapping[str, Any],
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
) -> int:
    """Check ``arguments`` against the contract; return their size in bytes as JSON.

    Raises NotJSONError (a value no JSON reader gets back as sent), ArgumentValidationError
    (nested too deep) or OversizedArgumentsError, each naming the path and the fix.
    Iterative, so no payload (however deep, or self-referencing) can exhaust the stack.
    """
    tool = safe_repr(function)
    stack: list[tuple[Any, tuple[Any, ...]]] = [(arguments, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, tool, path)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not MIN_INT <= value <= MAX_INT:
                raise _not_json(
                    tool,
                    path,
                    f"integer of {int_digits(value)} digits is outside the 64-bit range "
                    f"{MIN_INT}..{MAX_INT}",
                    "pass it as a string",
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise _not_json(
                    tool, path, f"{value!r} is not JSON", "pass a finite number or null"
                )
        elif isinstance(value, Mapping | list | tuple):
            if len(path) >= max_depth + 1:
                raise ArgumentValidationError(
                    f"argument {_argument(path)} of tool {tool} is nested more than {max_depth} "
                    f"levels deep (at {format_path(path)}); flatten it, or pass a reference "
                    "(a path or URL) instead",
                    argument=_argument_name(path),
                )
            if isinstance(value, Mapping):
                for key, child in value.items():
                    if not isinstance(key, str):
                        raise _not_json(
                            tool,
                            path,
                            f"key {safe_repr(key)} is a {type(key).__name__}, not a string",
                            "use string keys",
                        )
                    _check_text(key, tool, (*path, key), what="key")
                    stack.append((child, (*path, key)))
            else:
                stack.extend((child, (*path, i)) for i, child in enumerate(value))
        else:
            raise _not_json(
                tool, path, f"{type(value).__name__} is not JSON", f"pass {_JSON_TYPES}"
            )
    size = len(json.dumps(arguments, allow_nan=False).encode())
    if size > max_bytes:
        raise OversizedArgumentsError(
            f"arguments of tool {tool} are {size} bytes as JSON, over the {max_bytes}-byte "
            "limit (TOOLFLEET_MAX_ARGUMENT_BYTES); pass a reference (a path or URL) instead "
            "of the data"
        )
    return size


def format_path(path: tuple[Any, ...]) -> str:
    """``arguments.items[3].name``; keys that are not identifiers as ``["a b"]``."""
    text = "arguments"
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif isinstance(part, str) and _IDENTIFIER.match(part):
            text += f".{part}"
        else:
            text += f"[{json.dumps(str(part))}]"  # ASCII-escaped: safe for any key
        if len(text) > _PATH_CHARS:
            return text[:_PATH_CHARS] + "..."
    return text


def _check_text(text: str, tool: str, path: tuple[Any, ...], *, what: str = "string") -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise _not_json(
            tool,
            path,
            f"lone surrogate U+{code:04X} in a {what}",
            "pass valid Unicode text (decode bytes with errors='replace', or base64 them)",
        ) from None


def _argument(path: tuple[Any, ...]) -> str:
    return safe_repr(path[0]) if path else "<all>"


def _not_json(tool: str, path: tuple[Any, ...], problem: str, fix: str) -> NotJSONError:
    return NotJSONError(
        f"argument {_argument(path)} of tool {tool} breaks the JSON contract: "
        f"{format_path(path)}: {problem}; {fix}",
        argument=_argument_name(path),
    )


def _argument_name(path: tuple[Any, ...]) -> str | None:
    return str(path[0]) if path else None
