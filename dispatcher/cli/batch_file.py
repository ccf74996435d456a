"""A batch file: JSONL, one ``{"function": ..., "arguments": {...}}`` call per line.

A malformed line is kept as a :class:`BatchLine` carrying its error, so the batch still runs
and the line still gets a result in its place. Blank lines and lines starting with ``#`` are
skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchLine", "parse_batch", "parse_line"]


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One call of the batch, or the reason its line could not be read."""

    line_no: int
    function: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def request(self) -> dict[str, Any]:
        return {"function": self.function, "arguments": self.arguments}


def parse_line(line_no: int, text: str) -> BatchLine:
    """Read one line; a problem becomes ``error`` naming the line and what to write instead."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return BatchLine(
            line_no, error=f"line {line_no}: not JSON ({exc.msg} at column {exc.colno})"
        )
    if not isinstance(value, dict):
        return BatchLine(
            line_no,
            error=f'line {line_no}: expected a JSON object with "function" and "arguments", '
            f"got {type(value).__name__}",
        )
    function = value.get("function")
    if not isinstance(function, str) or not function:
        return BatchLine(
            line_no,
            error=f'line {line_no}: "function" must be a non-empty string, got {function!r}',
        )
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return BatchLine(
            line_no,
            function=function,
            error=f'line {line_no}: "arguments" must be a JSON object, got '
            f"{type(arguments).__name__}",
        )
    extra = sorted(set(value) - {"function", "arguments"})
    if extra:
        return BatchLine(
            line_no,
            function=function,
            arguments=arguments,
            error=f'line {line_no}: unexpected keys {extra}; a line has only "function" and '
            '"arguments"',
        )
    return BatchLine(line_no, function=function, arguments=arguments)


def parse_batch(lines: Iterable[str]) -> list[BatchLine]:
    """Every non-blank, non-comment line, in input order."""
    batch: list[BatchLine] = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        batch.append(parse_line(line_no, text))
    return batch
