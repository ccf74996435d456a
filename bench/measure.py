"""One measured result, the statistics it needs, and its JSON line."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Result", "Stopwatch", "percentile", "target_lines"]


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of an empty sequence; measure at least one call")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.elapsed_s``."""

    def __init__(self) -> None:
        self.start_s = 0.0
        self.elapsed_s = 0.0

    def __enter__(self) -> Stopwatch:
        self.start_s = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed_s = time.perf_counter() - self.start_s


@dataclass
class Result:
    """One (workload, mode) measurement. ``ratios`` and ``targets`` are filled by the report."""

    workload: str
    mode: str
    calls: int
    wall_s: float
    variant: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    # The performance targets this line carries: {"name", "value" (the ratio or figure), "met"}.
    targets: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Measured (not skipped, not failed), so it takes part in ratios."""
        return self.skipped is None and self.error is None

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_call_ms(self) -> float:
        return 1000 * self.wall_s / self.calls if self.calls else 0.0

    def to_json(self) -> str:
        line: dict[str, Any] = {"workload": self.workload, "mode": self.mode}
        if self.variant:
            line["variant"] = self.variant
        if self.skipped is not None:
            line["skipped"] = self.skipped
        if self.error is not None:
            line["error"] = self.error
        if self.skipped is not None or self.error is not None:
            return json.dumps(line)
        line.update(
            calls=self.calls,
            wall_s=round(self.wall_s, 4),
            calls_per_s=round(self.calls_per_s, 1),
            per_call_ms=round(self.per_call_ms, 4),
        )
        line.update({k: _round(v) for k, v in self.extra.items()})
        line["ratios"] = {k: round(v, 3) for k, v in self.ratios.items()}
        if self.targets:
            line["targets"] = self.targets
            line["target_met"] = all(t["met"] for t in self.targets)
        return json.dumps(line)


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def target_lines(result: Result) -> list[str]:
    """One JSON line per target a result carries: what ``--check`` and the README read."""
    lines = []
    for t in result.targets:
        line: dict[str, Any] = {"target": t["name"], "workload": result.workload}
        line["mode"] = result.mode
        if result.variant:
            line["variant"] = result.variant
        line.update(ratio=t["value"], target_met=t["met"])
        lines.append(json.dumps(line))
    return lines
