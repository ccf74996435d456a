"""A batch file: JSONL, one ``{"function": ..., "arguments": {...}}`` call per line.

A line may name the model's id of the call (``"id"`` or ``"tool_call_id"``), give the
arguments as a JSON string, or be a provider's own tool call (an OpenAI ``tool_calls`` entry, a
Responses ``function_call`` item, an Anthropic ``tool_use`` block), as ``Branch.act`` accepts.

A malformed line is kept as a :class:`BatchLine` carrying its error, so the batch still runs
and the line still gets a result in its place. Blank lines and lines starting with ``#`` are
skipped.

The file is read as bytes, one line at a time: a line that is not UTF-8, nested too
deep, holds a number Python refuses to convert, or is longer than the line limit (refused
before it is read whole) is a malformed line on its own line number. A file in UTF-16 or
UTF-32 is refused as a whole, naming its encoding; a UTF-8 byte order mark is skipped.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from toolfleet.dispatcher.accept.envelope import normalize, provider_kind
from toolfleet.schemas.contract import safe_repr
from toolfleet.schemas.errors import ConfigurationError, MalformedRequestError

__all__ = [
    "UTF8_BOM_NOTE",
    "BatchLine",
    "parse_batch",
    "parse_batch_bytes",
    "parse_line",
]

UTF8_BOM_NOTE = "the file starts with a UTF-8 byte order mark; it was skipped"
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32 (little-endian, with a byte order mark)"),
    (codecs.BOM_UTF32_BE, "UTF-32 (big-endian, with a byte order mark)"),
    (codecs.BOM_UTF16_LE, "UTF-16 (little-endian, with a byte order mark)"),
    (codecs.BOM_UTF16_BE, "UTF-16 (big-endian, with a byte order mark)"),
)
_SKIP_CHUNK_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One call of the batch, or the reason its line could not be read."""

    line_no: int
    function: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    tool_call_id: str | None = None
    # The line as read, for a provider-shaped call (act() normalizes it); else None.
    raw: dict[str, Any] | None = None

    @property
    def request(self) -> dict[str, Any]:
        if self.raw is not None:
            return self.raw
        request: dict[str, Any] = {"function": self.function, "arguments": self.arguments}
        if self.tool_call_id is not None:
            request["tool_call_id"] = self.tool_call_id
        return request


def parse_line(line_no: int, text: str) -> BatchLine:
    """Read one line; a problem becomes ``error`` naming the line and what to write instead."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return BatchLine(
            line_no, error=f"line {line_no}: not JSON ({exc.msg} at column {exc.colno})"
        )
    except RecursionError:
        return BatchLine(
            line_no,
            error=f"line {line_no}: nested too deeply to read; flatten the arguments, or pass "
            "a reference (a path or URL) instead",
        )
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
        return BatchLine(
            line_no,
            error=f"line {line_no}: holds a number that cannot be read ({exc}); pass a "
            "number that large as a string",
        )
    if not isinstance(value, dict):
        return BatchLine(
            line_no,
            error=f'line {line_no}: expected a JSON object with "function" and "arguments", '
            f"got {type(value).__name__}",
        )
    if provider_kind(value) is not None:
        try:
            envelope = normalize(value)
        except MalformedRequestError as exc:
            return BatchLine(line_no, error=f"line {line_no}: {exc}")
        shown = envelope.arguments if isinstance(envelope.arguments, dict) else {}
        return BatchLine(
            line_no,
            function=envelope.function,
            arguments=shown,
            tool_call_id=envelope.tool_call_id,
            raw=value,
        )
    function = value.get("function")
    if not isinstance(function, str) or not function:
        return BatchLine(
            line_no,
            error=f'line {line_no}: "function" must be a non-empty string, got '
            f"{safe_repr(function)}",
        )
    arguments = value.get("arguments", {})
    tool_call_id = value.get("tool_call_id", value.get("id"))
    if tool_call_id is not None and (not isinstance(tool_call_id, str) or not tool_call_id):
        return BatchLine(
            line_no,
            function=function,
            error=f'line {line_no}: "id" must be a non-empty string (the model\'s tool call '
            f"id), got {safe_repr(tool_call_id)}",
        )
    if isinstance(arguments, str):
        # JSON-string arguments, as OpenAI sends them: act() decodes them, and a string
        # that is not a JSON object is this call's own error.
        return BatchLine(line_no, function=function, tool_call_id=tool_call_id, raw=value)
    if not isinstance(arguments, dict):
        return BatchLine(
            line_no,
            function=function,
            error=f'line {line_no}: "arguments" must be a JSON object, got '
            f"{type(arguments).__name__}",
        )
    extra = sorted(set(value) - {"function", "arguments", "id", "tool_call_id"})
    if extra:
        return BatchLine(
            line_no,
            function=function,
            arguments=arguments,
            error=f'line {line_no}: unexpected keys {extra}; a line has only "function", '
            '"arguments" and optionally "id"',
        )
    return BatchLine(line_no, function=function, arguments=arguments, tool_call_id=tool_call_id)


def parse_batch(lines: Iterable[str]) -> list[BatchLine]:
    """Every non-blank, non-comment line, in input order."""
    batch: list[BatchLine] = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        batch.append(parse_line(line_no, text))
    return batch


def parse_batch_bytes(
    handle: BinaryIO, *, max_line_bytes: int, notes: list[str] | None = None
) -> list[BatchLine]:
    """Every non-blank, non-comment line of a binary file, in input order.

    Raises ConfigurationError for a UTF-16/UTF-32 file; appends to ``notes`` what a reader
    should know (a skipped UTF-8 byte order mark).
    """
    batch: list[BatchLine] = []
    for line_no, raw, too_long in _lines(handle, max_line_bytes):
        if line_no == 1:
            raw = _strip_bom(raw, notes)
        if too_long is not None:
            batch.append(
                BatchLine(
                    line_no,
                    error=f"line {line_no}: {too_long} bytes, over the {max_line_bytes}"
                    "-byte line limit (twice TOOLFLEET_MAX_ARGUMENT_BYTES); pass a reference "
                    "(a path or URL) instead of the data",
                )
            )
            continue
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            batch.append(
                BatchLine(
                    line_no,
                    error=f"line {line_no}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte "
                    f"{exc.start + 1}); save the file as UTF-8",
                )
            )
            continue
        if not text or text.startswith("#"):
            continue
        batch.append(parse_line(line_no, text))
    return batch


def _lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes, int | None]]:
    """``(line number, bytes, None)``, or ``(n, b"", size read)`` for a line over the limit,
    whose rest is skipped without being held in memory."""
    line_no = 0
    while True:
        raw = handle.readline(max_line_bytes + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            size = len(raw)
            while True:
                chunk = handle.readline(_SKIP_CHUNK_BYTES)
                size += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield line_no, b"", size
            continue
        yield line_no, raw, None


def _strip_bom(raw: bytes, notes: list[str] | None) -> bytes:
    for bom, name in _WIDE_BOMS:
        if raw.startswith(bom):
            raise ConfigurationError(
                f"the BATCH file is {name}, not UTF-8; convert it first, e.g. "
                "`iconv -f UTF-16 -t UTF-8 calls.jsonl > calls-utf8.jsonl`"
            )
    if len(raw) >= 2 and (raw[1:2] == b"\0" or raw[0:1] == b"\0"):
        # '{' followed by NUL: UTF-16 without a byte order mark.
        order = "little" if raw[1:2] == b"\0" else "big"
        raise ConfigurationError(
            f"the BATCH file looks like UTF-16 ({order}-endian, no byte order mark), not "
            "UTF-8; convert it first, e.g. `iconv -f UTF-16 -t UTF-8 calls.jsonl > "
            "calls-utf8.jsonl`"
        )
    if raw.startswith(codecs.BOM_UTF8):
        if notes is not None:
            notes.append(UTF8_BOM_NOTE)
        return raw[len(codecs.BOM_UTF8) :]
    return raw
