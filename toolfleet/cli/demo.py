"""``toolfleet demo``: the mission in under a minute, on the embedded default.

One batch, one ``Branch.act``: blocking sync tools that run in worker processes, many async
tools that share the asyncio pool, a tool that fails and says so truthfully, and a call the
session's governance gate denies before anything is enqueued. Then: where to look next.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from toolfleet.cli.batch_file import BatchLine
from toolfleet.cli.call_record import CallRecord
from toolfleet.cli.demo_tools import DENIED_TOOL
from toolfleet.cli.progress import render_summary
from toolfleet.schemas.action import ToolInvocation

__all__ = ["DEMO_TOOLS_MODULE", "demo_batch", "deny_dangerous", "run_demo"]

DEMO_TOOLS_MODULE = "toolfleet.cli.demo_tools"
_BLOCK_S = 0.4
_LATENCY_S = 0.3

Execute = Callable[..., tuple[str, list[CallRecord], float]]


def deny_dangerous(invocation: ToolInvocation) -> bool:
    """The demo's governance gate: every tool is allowed except the destructive one."""
    return invocation.function != DENIED_TOOL


def demo_batch(*, sync_calls: int, async_calls: int) -> list[BatchLine]:
    """The demo's calls, numbered as lines of a batch file would be."""
    requests: list[tuple[str, dict[str, Any]]] = []
    requests += [
        ("checksum_file", {"name": f"report-{i}.pdf", "block_s": _BLOCK_S})
        for i in range(sync_calls)
    ]
    requests += [("fetch_page", {"page": i, "latency_s": _LATENCY_S}) for i in range(async_calls)]
    requests.append(("parse_number", {"text": "forty-two"}))
    requests.append((DENIED_TOOL, {"pattern": "/home/*"}))
    return [
        BatchLine(line_no, function=function, arguments=arguments)
        for line_no, (function, arguments) in enumerate(requests, start=1)
    ]


def run_demo(*, sync_calls: int, async_calls: int, execute: Execute) -> int:
    """Run the demo batch and explain it; 0 when every part behaved as the demo claims."""
    out = Console()
    err = Console(stderr=True)
    lines = demo_batch(sync_calls=sync_calls, async_calls=async_calls)
    out.print(
        f"[bold]toolfleet demo[/bold]: {len(lines)} tool calls on a private Redis and two local "
        "Celery workers (the embedded default; nothing to install or configure)",
        soft_wrap=True,
    )
    branch_id, records, elapsed_s = execute(
        lines,
        tools=(DEMO_TOOLS_MODULE,),
        strategy="concurrent",
        max_in_flight=None,
        console=err,
        show_progress=True,
        gates=(deny_dangerous,),
        embedded_only=True,
    )
    out.print(_per_tool_table(records))
    out.print(render_summary(records, elapsed_s))
    findings, ok = _explain(records, elapsed_s=elapsed_s)
    out.print("[bold]What happened[/bold]")
    for finding in findings:
        out.print(f"  • {finding}", soft_wrap=True)
    out.print(_where_next(branch_id), soft_wrap=True)
    return 0 if ok else 1


def _per_tool_table(records: Sequence[CallRecord]) -> Table:
    table = Table(title="toolfleet demo: calls by tool", header_style="bold")
    for column in ("tool", "calls", "outcomes", "worker pids", "slowest"):
        table.add_column(column)
    by_tool: dict[str, list[CallRecord]] = {}
    for record in records:
        by_tool.setdefault(record.function or "-", []).append(record)
    for name, group in by_tool.items():
        outcomes = Counter(r.outcome for r in group)
        pids = sorted(_pids(group))
        durations = [r.duration_s for r in group if r.duration_s is not None]
        table.add_row(
            name,
            str(len(group)),
            ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
            ", ".join(map(str, pids)) or "-",
            f"{max(durations):.3f}s" if durations else "-",
        )
    return table


def _pids(records: Sequence[CallRecord]) -> set[int]:
    return {
        int(r.output["pid"])
        for r in records
        if isinstance(r.output, dict) and isinstance(r.output.get("pid"), int)
    }


def _explain(records: Sequence[CallRecord], *, elapsed_s: float) -> tuple[list[str], bool]:
    """Sentences about what the batch showed, and whether it showed all of it."""
    findings: list[str] = []
    ok = True
    me = os.getpid()
    sync = [r for r in records if r.function == "checksum_file"]
    sync_pids = _pids(sync)
    if sync and all(r.outcome == "done" for r in sync) and me not in sync_pids:
        blocked = sum(float(r.output.get("blocked_s", 0)) for r in sync)
        findings.append(
            f"{len(sync)} blocking sync calls (checksum_file, {blocked:.1f}s of blocking in "
            f"all) ran in worker process(es) {sorted(sync_pids)}, never on this process's "
            f"event loop (pid {me})."
        )
    else:
        ok = False
        findings.append(f"[red]the sync calls did not all complete in workers: {sync}[/red]")
    fetches = [r for r in records if r.function == "fetch_page"]
    if fetches and all(r.outcome == "done" for r in fetches):
        waited = sum(float(r.output.get("waited_s", 0)) for r in fetches)
        starts = [float(r.output["started_at"]) for r in fetches]
        spread = max(starts) - min(starts)
        findings.append(
            f"{len(fetches)} async calls (fetch_page, {waited:.1f}s of waiting in all) shared "
            f"the asyncio pool of worker process(es) {sorted(_pids(fetches))}; they all "
            f"started within {spread:.2f}s of each other, so the whole batch took "
            f"{elapsed_s:.1f}s."
        )
    else:
        ok = False
        findings.append("[red]the async calls did not all complete[/red]")
    failed = next((r for r in records if r.function == "parse_number"), None)
    if failed is not None and failed.outcome == "failed" and failed.error:
        findings.append(
            f"parse_number failed, and its result says so truthfully: status "
            f"{failed.status!r}, error {failed.error!r} (history holds the same error)."
        )
    else:
        ok = False
        findings.append(f"[red]parse_number did not fail as expected: {failed}[/red]")
    denied = next((r for r in records if r.function == DENIED_TOOL), None)
    if denied is not None and denied.outcome == "denied":
        findings.append(
            f"{DENIED_TOOL} was denied by the session's governance gate before anything was "
            f"enqueued; the model sees the denial as its result: {denied.output!r}."
        )
    else:
        ok = False
        findings.append(f"[red]{DENIED_TOOL} was not denied: {denied}[/red]")
    return findings, ok


def _where_next(branch_id: str) -> str:
    return f"""
[bold]Where to look next[/bold]
  toolfleet history {branch_id}
      this branch's stored history: each ActionRequest and its linked ActionResponse, in order
      (kept in the embedded Redis's data under ~/.toolfleet/embedded)
  toolfleet run calls.jsonl --tools yourmodule
      your own tools (decorate functions with toolfleet.tool) on the same kind of fleet
  export TOOLFLEET_BROKER_URL=redis://your-redis:6379/0
      use your own Redis: start `toolfleet worker --kind sync --tools yourmodule` and
      `toolfleet worker --kind async --tools yourmodule` on any machines, then watch with
      `toolfleet flower` and `toolfleet status`
"""
