"""The five workloads, each measured in every mode in one run, with ratios and targets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bench import (
    agent_loops,
    fleet,
    inprocess,
    lionagi_mode,
    network,
    progress,
    roundtrips,
    tools,
)
from bench.agent_openai_agents import run as agent_openai_agents
from bench.celery_app import ECHO, SLEEP_ASYNC, SLEEP_SYNC
from bench.measure import Result, percentile
from bench.procs import repo_root
from bench.raw_celery import RawCelery
from bench.raw_celery import worker as raw_worker
from bench.sizes import Sizes

__all__ = ["DEFAULT_WORKLOADS", "MODES", "WORKLOADS", "Context"]

MODES = ("inprocess", "celery", "toolfleet", "toolfleet-batched", "toolfleet-auto", "lionagi")
# A batch that has not finished by then is reported as an error line, and the run goes on.
BATCH_TIMEOUT_S = 300.0
# The variant of raw Celery with toolfleet's reliability and Flower settings (acks_late,
# prefetch 1, task events, track_started): what those settings cost Celery itself.
SAME_SETTINGS = "toolfleet-settings"
# The toolfleet variant with task events on, as while Flower watches (TOOLFLEET_TASK_EVENTS=
# always costs what a monitor's lease turns on: the same PUBLISHes, received or not).
MONITORED = "monitored"
# Raw Celery with only the redelivery settings toolfleet keeps unwatched (acks_late,
# reject_on_worker_lost, prefetch 1; no events, no started state): the floor of a per-call
# message that is redelivered after a lost worker, which default Celery does not pay.
RELIABLE = "acks-late-prefetch-1"


@dataclass
class Context:
    broker_url: str
    sizes: Sizes
    modes: frozenset[str] = frozenset(MODES)
    emit: Callable[[Result], None] = field(default=lambda r: print(r.to_json(), flush=True))

    def wants(self, mode: str) -> bool:
        return mode in self.modes

    def fleet_skip(self, mode: str) -> str | None:
        """Why a toolfleet mode cannot run here, or None."""
        return fleet.unavailable(batched=mode in ("toolfleet-batched", "toolfleet-auto"))


def _args_echo(n: int) -> list[dict[str, object]]:
    return [{"value": i} for i in range(n)]


def _args_sleep(n: int, seconds: float) -> list[dict[str, object]]:
    return [{"seconds": seconds} for _ in range(n)]


def warm_count(calls: int, concurrency: int) -> int:
    """Calls sent to a fresh worker before timing, the same in every mode.

    Twice the concurrency (capped), so each prefork child or pool thread has run a call and
    opened its connections: the bench measures a warm fleet, not process start-up (a prefork
    child's first call pays for its Redis connection and its lazy imports).
    """
    return min(calls, max(20, min(2 * concurrency, 200)))


def _skipped(workload: str, mode: str, reason: str, variant: str = "") -> Result:
    return Result(workload, mode, 0, 0.0, variant=variant, skipped=reason)


def _celery_batch(
    ctx: Context,
    workload: str,
    task: str,
    args: list[dict[str, object]],
    pool: str,
    concurrency: int,
    variant: str = "",
    extra: dict[str, object] | None = None,
    profile: str | None = None,
) -> Result:
    """One raw-Celery batch on a fresh worker; a failure is a result line, not a crash."""
    extra = {"concurrency": concurrency, **(extra or {})}
    name = f"bench-raw-{workload}-{pool}{concurrency}"
    try:
        with raw_worker(ctx.broker_url, pool, concurrency, name, profile):
            client = RawCelery(ctx.broker_url, profile)
            try:
                client.run_batch(task, args[: warm_count(len(args), concurrency)], BATCH_TIMEOUT_S)
                wall_s = client.run_batch(task, args, BATCH_TIMEOUT_S)
            finally:
                client.close()
    except Exception as exc:
        return Result(workload, "celery", len(args), 0.0, variant, extra, error=_text(exc))
    return Result(workload, "celery", len(args), wall_s, variant, extra)


def _fleet_batch(
    ctx: Context,
    workload: str,
    mode: str,
    function: str,
    args: list[dict[str, object]],
    kind: str,
    concurrency: int,
    variant: str = "",
    extra: dict[str, object] | None = None,
    events: bool = False,
) -> Result:
    """One Branch.act batch on a fresh toolfleet worker; skipped or failed is a result line.

    ``events``: task events on in the worker and the dispatcher, as while a monitor watches.
    """
    extra = {"concurrency": concurrency, **(extra or {})}
    reason = ctx.fleet_skip(mode)
    if reason:
        return _skipped(workload, mode, reason, variant)
    name = f"bench-fleet-{workload}-{mode}-{concurrency}"
    try:
        with fleet.worker(ctx.broker_url, kind, concurrency, name, events=events):
            batched, auto = mode == "toolfleet-batched", mode == "toolfleet-auto"
            with fleet.FleetClient(
                ctx.broker_url, batched=batched, events=events, auto=auto
            ) as client:
                warm = args[: warm_count(len(args), concurrency)]
                client.run_batch(function, warm, BATCH_TIMEOUT_S)
                wall_s = client.run_batch(function, args, BATCH_TIMEOUT_S)
    except Exception as exc:
        return Result(workload, mode, len(args), 0.0, variant, extra, error=_text(exc))
    return Result(workload, mode, len(args), wall_s, variant, extra)


def _lionagi(workload: str, func: Callable[..., object], args: list[dict[str, object]]) -> Result:
    """The optional lionagi comparison, or the reason it is skipped."""
    reason = lionagi_mode.unavailable()
    if reason:
        return _skipped(workload, "lionagi", reason)
    try:
        return Result(workload, "lionagi", len(args), lionagi_mode.run_batch(func, args))
    except Exception as exc:
        return Result(workload, "lionagi", len(args), 0.0, error=_text(exc))


def _key(result: Result) -> str:
    """A mode, plus ``/toolfleet-settings`` for the raw-Celery line that uses them."""
    for variant in (SAME_SETTINGS, MONITORED, RELIABLE):
        if variant in result.variant:
            return f"{result.mode}/{variant}"
    return result.mode


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


# --- echo: per-call overhead -------------------------------------------------------------


def echo(ctx: Context) -> list[Result]:
    n, c = ctx.sizes.echo_calls, ctx.sizes.echo_workers
    args = _args_echo(n)
    results = []
    if ctx.wants("inprocess"):
        results.append(Result("echo", "inprocess", n, inprocess.run_batch(tools.echo, args)))
    if ctx.wants("lionagi"):
        results.append(_lionagi("echo", tools.echo, args))
    if ctx.wants("celery"):
        results.append(_celery_batch(ctx, "echo", ECHO, args, "prefork", c))
        results.append(
            _celery_batch(ctx, "echo", ECHO, args, "prefork", c, SAME_SETTINGS, profile="toolfleet")
        )
        results.append(
            _celery_batch(ctx, "echo", ECHO, args, "prefork", c, RELIABLE, profile="reliable")
        )
    for mode in ("toolfleet", "toolfleet-batched", "toolfleet-auto"):
        if ctx.wants(mode):
            results.append(_fleet_batch(ctx, "echo", mode, "echo", args, "sync", c))
    if ctx.wants("toolfleet"):
        results.append(
            _fleet_batch(ctx, "echo", "toolfleet", "echo", args, "sync", c, MONITORED, events=True)
        )
    by_key = {_key(r): r for r in results if r.ok}
    for r in by_key.values():
        for key, other in by_key.items():
            if other is not r:
                r.ratios[f"per_call_vs_{key}"] = r.per_call_ms / other.per_call_ms
    celery = by_key.get("celery")
    if celery is not None:
        if "toolfleet" in by_key:
            ratio = by_key["toolfleet"].per_call_ms / celery.per_call_ms
            by_key["toolfleet"].targets.append(
                _target("echo per_call <= 1.0 x celery (no monitor)", ratio, ratio <= 1.0)
            )
        if "toolfleet-batched" in by_key:
            ratio = by_key["toolfleet-batched"].calls_per_s / celery.calls_per_s
            by_key["toolfleet-batched"].targets.append(
                _target("batched calls_per_s >= 10 x celery", ratio, ratio >= 10.0)
            )
    same = by_key.get(f"celery/{SAME_SETTINGS}")
    watched = by_key.get(f"toolfleet/{MONITORED}")
    if same is not None and watched is not None:
        ratio = watched.per_call_ms / same.per_call_ms
        watched.targets.append(
            _target("echo per_call <= 1.0 x celery same settings (monitor)", ratio, ratio <= 1.0)
        )
    return results


# --- sync: blocking calls spread over worker processes -----------------------------------


def sync(ctx: Context) -> list[Result]:
    n, sleep_s = ctx.sizes.sync_calls, ctx.sizes.sleep_s
    args = _args_sleep(n, sleep_s)
    results: list[Result] = []
    base: Result | None = None
    if ctx.wants("inprocess"):
        base = Result("sync", "inprocess", n, inprocess.run_batch(tools.sleep_sync, args))
        results.append(base)
    if ctx.wants("lionagi"):
        results.append(_lionagi("sync", tools.sleep_sync, args))
    for c in ctx.sizes.sync_concurrency:
        variant = f"concurrency={c}"
        row: list[Result] = []
        if ctx.wants("celery"):
            row.append(_celery_batch(ctx, "sync", SLEEP_SYNC, args, "prefork", c, variant))
            row.append(
                _celery_batch(ctx, "sync", SLEEP_SYNC, args, "prefork", c,
                              f"{variant},{SAME_SETTINGS}", profile="toolfleet")
            )  # fmt: skip
            row.append(
                _celery_batch(ctx, "sync", SLEEP_SYNC, args, "prefork", c,
                              f"{variant},{RELIABLE}", profile="reliable")
            )  # fmt: skip
        if ctx.wants("toolfleet"):
            row.append(
                _fleet_batch(ctx, "sync", "toolfleet", "sleep_sync", args, "sync", c, variant)
            )
        results.extend(row)
        row = [r for r in row if r.ok]
        for r in row:
            if base is not None:
                speedup = base.wall_s / r.wall_s
                r.ratios["speedup_vs_inprocess"] = speedup
                r.ratios["speedup_per_worker"] = speedup / c
            for other in row:
                if other is not r:
                    r.ratios[f"wall_vs_{_key(other)}"] = r.wall_s / other.wall_s
        by_key = {_key(r): r for r in row}
        if "toolfleet" in by_key and "celery" in by_key:
            # Speedups share the in-process base, so their ratio is celery's wall / ours.
            ratio = by_key["celery"].wall_s / by_key["toolfleet"].wall_s
            by_key["toolfleet"].targets.append(
                _target(f"sync speedup >= celery's at concurrency {c}", ratio, ratio >= 1.0)
            )
    return results


# --- async: thousands of awaits on one worker --------------------------------------------


def async_(ctx: Context) -> list[Result]:
    n, sleep_s = ctx.sizes.async_calls, ctx.sizes.sleep_s
    args = _args_sleep(n, sleep_s)
    results: list[Result] = []
    if ctx.wants("inprocess"):
        wall_s = inprocess.run_batch(tools.sleep_async, args)
        results.append(Result("async", "inprocess", n, wall_s))
    if ctx.wants("lionagi"):
        results.append(_lionagi("async", tools.sleep_async, args))
    celery_runs: list[Result] = []
    if ctx.wants("celery"):
        for threads in ctx.sizes.async_thread_pools:
            celery_runs.append(
                _celery_batch(ctx, "async", SLEEP_ASYNC, args, "threads", threads,
                              f"threads={threads}", {"pool": "threads"})
            )  # fmt: skip
        results.extend(celery_runs)
    measured = [r for r in celery_runs if r.ok]
    best = min(measured, key=lambda r: r.wall_s) if measured else None
    if best is not None:
        best.extra["best_celery_pool"] = True
    concurrency = max(ctx.sizes.async_thread_pools)
    for mode in ("toolfleet", "toolfleet-batched"):
        if not ctx.wants(mode):
            continue
        r = _fleet_batch(ctx, "async", mode, "sleep_async", args, "async", concurrency,
                         extra={"pool": "asyncio"})  # fmt: skip
        results.append(r)
        if not r.ok:
            continue
        if best is not None:
            ratio = r.wall_s / best.wall_s
            r.ratios["wall_vs_best_celery"] = ratio
            if mode == "toolfleet":
                r.targets.append(
                    _target("async wall <= 1.0 x best celery pool", ratio, ratio <= 1.0)
                )
    inproc = next((r for r in results if r.mode == "inprocess"), None)
    for r in results:
        if inproc is not None and r is not inproc and r.ok:
            r.ratios["wall_vs_inprocess"] = r.wall_s / inproc.wall_s
    return results


# --- latency: one call at a time ---------------------------------------------------------


def latency(ctx: Context) -> list[Result]:
    n, c = ctx.sizes.latency_calls, ctx.sizes.echo_workers
    args = _args_echo(n)
    runs: dict[str, list[float]] = {}
    results: list[Result] = []
    if ctx.wants("inprocess"):
        runs["inprocess"] = inprocess.run_sequential(tools.echo, args)
    if ctx.wants("celery"):
        with raw_worker(ctx.broker_url, "prefork", c, "bench-raw-latency"):
            raw = RawCelery(ctx.broker_url)
            raw.run_sequential(ECHO, args[:5], BATCH_TIMEOUT_S)  # warm the connections
            runs["celery"] = raw.run_sequential(ECHO, args, BATCH_TIMEOUT_S)
            raw.close()
    for mode in ("toolfleet", "toolfleet-auto"):
        if not ctx.wants(mode):
            continue
        reason = ctx.fleet_skip(mode)
        if reason:
            results.append(_skipped("latency", mode, reason))
            continue
        try:
            with fleet.worker(ctx.broker_url, "sync", c, "bench-fleet-latency"):
                with fleet.FleetClient(ctx.broker_url, auto=mode == "toolfleet-auto") as client:
                    client.run_sequential("echo", args[:5], BATCH_TIMEOUT_S)
                    runs[mode] = client.run_sequential("echo", args, BATCH_TIMEOUT_S)
        except Exception as exc:
            results.append(Result("latency", mode, n, 0.0, error=_text(exc)))
    for mode, lat in runs.items():
        extra = {"p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99)}
        results.append(Result("latency", mode, n, sum(lat), extra=extra))
    measured = {r.mode: r for r in results if r.ok}
    for r in measured.values():
        for other in measured.values():
            if other is not r:
                r.ratios[f"p50_vs_{other.mode}"] = r.extra["p50_ms"] / other.extra["p50_ms"]
    if "toolfleet" in measured and "celery" in measured:
        ours, theirs = measured["toolfleet"], measured["celery"]
        for pct, limit in ((50, 1.0), (99, 1.2)):
            ratio = ours.extra[f"p{pct}_ms"] / theirs.extra[f"p{pct}_ms"]
            ours.ratios[f"p{pct}_vs_celery"] = ratio
            ours.targets.append(
                _target(f"latency p{pct} <= {limit:g} x celery", ratio, ratio <= limit)
            )
    return results


# --- rss: the dispatcher's peak memory for a big batch -----------------------------------


RSS_LIMIT_MB = 250.0
RETAINED_LIMIT_BYTES = 2048.0


def rss(ctx: Context) -> list[Result]:
    """Dispatcher peak RSS for big batches, each in a fresh probe process.

    The dispatcher's memory does not depend on how calls are published, so the probe uses the
    batched publisher when available (100,000 echoes in about a minute instead of ten) with
    the fleet's default in-flight window, which is what bounds the dispatcher (C8).
    """
    if not ctx.wants("toolfleet"):
        return []
    reason = ctx.fleet_skip("toolfleet")
    if reason:
        return [_skipped("rss", "toolfleet", reason)]
    from toolfleet.schemas.settings import Settings

    window = Settings().max_in_flight
    batched = ctx.fleet_skip("toolfleet-batched") is None
    results: list[Result] = []
    with fleet.worker(ctx.broker_url, "sync", ctx.sizes.echo_workers, "bench-fleet-rss"):
        for n in ctx.sizes.rss_calls:
            probe = _rss_probe(ctx.broker_url, n, window, batched)
            extra = {
                "peak_rss_mb": probe["peak_rss_kb"] / 1024,
                "baseline_rss_mb": probe["baseline_rss_kb"] / 1024,
                "window": window,
                "publish": "batched" if batched else "per-call",
            }
            results.append(Result("rss", "toolfleet", n, probe["wall_s"], f"calls={n}", extra))
    small, big = results[0], results[-1]
    growth_mb = big.extra["peak_rss_mb"] - small.extra["peak_rss_mb"]
    extra_calls = big.calls - small.calls
    if extra_calls > 0:
        big.extra["growth_bytes_per_call"] = growth_mb * 1024 * 1024 / extra_calls
    big.ratios["peak_vs_smaller_batch"] = big.extra["peak_rss_mb"] / small.extra["peak_rss_mb"]
    peak = big.extra["peak_rss_mb"]
    big.targets.append(_target(f"rss peak < {RSS_LIMIT_MB:g} MB", peak, peak < RSS_LIMIT_MB))
    if "growth_bytes_per_call" in big.extra:
        # Peak growth between the two sizes bounds what each extra call leaves behind.
        per_call = big.extra["growth_bytes_per_call"]
        met = per_call <= RETAINED_LIMIT_BYTES
        big.targets.append(_target("rss growth <= 2 KB per call", per_call, met))
    return results


def _rss_probe(broker_url: str, calls: int, window: int, batched: bool) -> dict[str, float]:
    # A fresh process, so VmHWM is this batch's peak and nothing else's.
    argv = [sys.executable, "-m", "bench.rss_probe", "--broker", broker_url]
    argv += ["--calls", str(calls), "--window", str(window)]
    if batched:
        argv.append("--batched")
    out = subprocess.run(
        argv, cwd=str(repo_root()), capture_output=True, text=True, timeout=BATCH_TIMEOUT_S
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench.rss_probe --calls {calls} failed:\n{out.stderr[-3000:]}")
    probe: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return probe


# --- roundtrips: Redis commands per call ------------------------------------------------


def roundtrips_(ctx: Context) -> list[Result]:
    """Commands the server sees per sequential echo, each mode on its own redis-server."""
    n, c = ctx.sizes.roundtrip_calls, ctx.sizes.echo_workers
    results: list[Result] = []
    runs: list[tuple[str, Callable[[], Result]]] = []
    if ctx.wants("celery"):
        runs.append(("celery", lambda: roundtrips.celery_line(n, c)))
        runs.append(("celery", lambda: roundtrips.celery_line(n, c, profile="toolfleet")))
    if ctx.wants("toolfleet"):
        reason = ctx.fleet_skip("toolfleet")
        if reason:
            results.append(_skipped("roundtrips", "toolfleet", reason))
        else:
            runs.append(("toolfleet", lambda: roundtrips.fleet_line(n, c)))
            runs.append(("toolfleet", lambda: roundtrips.fleet_line(n, c, events=True)))
    for mode, run in runs:
        try:
            results.append(run())
        except Exception as exc:
            results.append(Result("roundtrips", mode, n, 0.0, error=_text(exc)))
    by_key = {_key(r): r for r in results if r.ok}
    for r in by_key.values():
        for key, other in by_key.items():
            if other is not r:
                mine, theirs = r.extra["commands_per_call"], other.extra["commands_per_call"]
                r.ratios[f"commands_vs_{key}"] = mine / theirs
    if "toolfleet" in by_key and "celery" in by_key:
        ratio = by_key["toolfleet"].ratios["commands_vs_celery"]
        target = _target("roundtrips commands_per_call <= 1.0 x celery", ratio, ratio <= 1.0)
        by_key["toolfleet"].targets.append(target)
    return results


def _target(name: str, value: float, met: bool) -> dict[str, object]:
    return {"name": name, "value": round(value, 3), "met": bool(met)}


WORKLOADS: dict[str, Callable[[Context], Iterable[Result]]] = {
    "echo": echo,
    "sync": sync,
    "async": async_,
    "latency": latency,
    "rss": rss,
    "roundtrips": roundtrips_,
    # A tool's progress report to the dispatcher's callback, and its commands (bench/progress.py).
    "progress": progress.run,
    # The OpenAI Agents SDK's own tool execution vs on_fleet (bench/agent_openai_agents.py).
    "agent-openai-agents": agent_openai_agents,
    # A framework's own tool execution vs its adapter on the fleet (bench/agent_loops.py).
    "agent-langgraph": agent_loops.workload("langgraph"),
    "agent-pydantic-ai": agent_loops.workload("pydantic-ai"),
    # One call at a time through a delaying proxy, in round trips (bench/network.py).
    "network": network.run,
}

# What a bare `python -m bench` runs: all but the network workload, which starts six more
# workers and runs about 3 minutes at full size; it is asked for with --only network.
DEFAULT_WORKLOADS = tuple(name for name in WORKLOADS if name != "network")
