"""``toolfleet run`` reads its file as bytes, line by line: a line that is not
UTF-8, too deep, too large or holds an unreadable number is a malformed result on its own line
number, the rest of the batch runs; a UTF-16 file is named as such (exit 2, the file is
unusable); exit 2 is only for usage and configuration errors.
"""

from __future__ import annotations

import codecs
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli_support import REPO_ROOT, cli_env, read_jsonl, toolfleet, toolfleet_argv
from tests.support.fleet import WorkerProcess
from toolfleet.cli.batch_file import UTF8_BOM_NOTE, parse_batch_bytes
from toolfleet.schemas.errors import ConfigurationError

TOOLS = "tests.support.sample_tools"
ADD = b'{"function": "add", "arguments": {"a": 1, "b": 2}}'


def parse(data: bytes, max_line_bytes: int = 10_000) -> list[tuple[int, str | None]]:
    lines = parse_batch_bytes(io.BytesIO(data), max_line_bytes=max_line_bytes)
    return [(line.line_no, line.error) for line in lines]


def test_each_bad_line_is_malformed_on_its_own_number() -> None:
    deep = b'{"function": "add", "arguments": {"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}"
    huge = b'{"function": "add", "arguments": {"a": ' + b"9" * 5000 + b"}}"
    data = b"\n".join(
        [ADD, b'{"function": "add\xff"}', deep, huge, b"x" * 50_000, b"", b"# comment", ADD]
    )
    got = dict(parse(data, max_line_bytes=30_000))
    assert list(got) == [1, 2, 3, 4, 5, 8]
    assert got[1] is None and got[8] is None
    assert got[2] is not None and got[2].startswith("line 2: not UTF-8 (byte 0xff at byte 18)")
    assert got[3] is not None and "line 3: nested too deeply" in got[3]
    assert got[4] is not None and "line 4: holds a number that cannot be read" in got[4]
    assert got[5] is not None and "line 5: 50001 bytes, over the 30000-byte" in got[5]


@pytest.mark.parametrize(
    ("bom", "name"),
    [
        (codecs.BOM_UTF16_LE, "UTF-16 (little-endian"),
        (codecs.BOM_UTF16_BE, "UTF-16 (big-endian"),
        (codecs.BOM_UTF32_LE, "UTF-32 (little-endian"),
    ],
)
def test_a_utf16_or_utf32_file_is_named(bom: bytes, name: str) -> None:
    encoding = {"UTF-16 (little": "utf-16-le", "UTF-16 (big-en": "utf-16-be"}.get(
        name[:14], "utf-32-le"
    )
    with pytest.raises(ConfigurationError, match=name.replace("(", r"\(")):
        parse(bom + ADD.decode().encode(encoding))
    if bom == codecs.BOM_UTF16_LE:
        with pytest.raises(ConfigurationError, match="looks like UTF-16"):
            parse(ADD.decode().encode("utf-16-le"))


def test_a_utf8_bom_is_skipped_and_noted() -> None:
    notes: list[str] = []
    lines = parse_batch_bytes(io.BytesIO(codecs.BOM_UTF8 + ADD), max_line_bytes=1000, notes=notes)
    assert [line.error for line in lines] == [None]
    assert notes == [UTF8_BOM_NOTE]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=60), max_size=12))
def test_any_bytes_give_one_result_per_non_blank_line_and_never_raise(
    raw_lines: list[bytes],
) -> None:
    lines = [raw.replace(b"\n", b" ") for raw in raw_lines]
    try:
        got = parse(b"\n".join(lines), max_line_bytes=40)
    except ConfigurationError as exc:
        assert "UTF-16" in str(exc) or "UTF-32" in str(exc)  # only a wide file is refused whole
        return
    numbers = [n for n, _ in got]
    assert numbers == sorted(set(numbers))
    for number, error in got:
        assert error is None or error.startswith(f"line {number}: ")


def test_run_keeps_going_past_bad_lines_and_exits_1(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    batch = tmp_path / "calls.jsonl"
    batch.write_bytes(
        b"\n".join(
            [
                ADD,
                b'{"function": "echo", "arguments": {"value": "caf\xe9"}}',  # Latin-1
                b'{"function": "echo", "arguments": {"value": ' + b"[" * 3000 + b"]" * 3000 + b"}}",
                b'{"function": "echo", "arguments": {"value": ' + b"7" * 5000 + b"}}",
                b'{"function": "echo", "arguments": {"value": "' + b"x" * 9000 + b'"}}',
                b'{"function": "echo", "arguments": {"value": "\\ud800"}}',  # JSON escape
                b'{"function": "sleep_async", "arguments": {"seconds": 0.01}}',
            ]
        )
        + b"\n"
    )
    env = {"TOOLFLEET_BROKER_URL": redis_url, "TOOLFLEET_MAX_ARGUMENT_BYTES": "2000"}
    proc = toolfleet("run", str(batch), "--tools", TOOLS, "--json", home=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    records = {r["line"]: r for r in read_jsonl(proc.stdout)}
    assert list(records) == [1, 2, 3, 4, 5, 6, 7]
    assert records[1]["output"] == 3 and records[7]["outcome"] == "done"
    for line, says in [
        (2, "not UTF-8"),
        (3, "nested too deeply"),
        (4, "holds a number"),
        (5, "line limit"),
    ]:
        assert records[line]["outcome"] == "malformed", records[line]
        assert f"line {line}: {says}" in records[line]["error"] or says in records[line]["error"]
    assert records[6]["status"] == "aborted"
    assert "arguments.value: lone surrogate U+D800" in records[6]["error"]
    json.dumps(records)


def test_a_utf16_file_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    batch = tmp_path / "calls.jsonl"
    batch.write_bytes(codecs.BOM_UTF16_LE + ADD.decode().encode("utf-16-le"))
    proc = toolfleet("run", str(batch), "--tools", TOOLS, home=tmp_path, timeout_s=60)
    assert proc.returncode == 2
    assert "UTF-16" in proc.stderr and "iconv" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from toolfleet.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("toolfleet 0.")


@pytest.mark.slow
def test_a_50_mb_line_is_refused_without_reading_it_whole(tmp_path: Path, redis_url: str) -> None:
    """The line is refused as it streams past (peak RSS was 1.17 GB)."""
    batch = tmp_path / "big.jsonl"
    with batch.open("w") as handle:
        handle.write('{"function": "add", "arguments": {"a": "' + "x" * 50_000_000 + '"}}\n')
    # A wrapper process, so RUSAGE_CHILDREN measures toolfleet alone.
    measure = (
        "import resource, subprocess, sys; "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(p.stderr); "
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    argv = toolfleet_argv("run", str(batch), "--tools", "tests.support.sample_tools", "--json")
    proc = subprocess.run(
        [sys.executable, "-c", measure, *argv],
        cwd=REPO_ROOT,
        env=cli_env(tmp_path, {"TOOLFLEET_BROKER_URL": redis_url}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    returncode, peak_kib = (int(v) for v in proc.stdout.split())
    assert returncode == 1, proc.stderr
    assert "malformed line 1: 50000044 bytes, over the" in proc.stderr
    assert peak_kib < 400_000, f"peak RSS {peak_kib} KiB"
