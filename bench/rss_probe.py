"""``python -m bench.rss_probe``: one ``Branch.act`` of N echo calls, then this process's peak RSS.

Run in a fresh process by the rss workload, so VmHWM is this batch's peak and nothing else's.
Needs a sync worker serving ``bench.fleet_tools`` on the broker. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from bench.fleet import FleetClient

__all__ = ["main", "vm_kb"]


def vm_kb(field: str = "VmHWM") -> int:
    """A ``/proc/self/status`` memory field in KiB (VmHWM = peak resident set)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line; this probe needs Linux")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rss_probe")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument(
        "--window", type=int, default=None, help="CallParams.max_in_flight (default: the fleet's)"
    )
    args = parser.parse_args(argv)
    with FleetClient(args.broker, batched=args.batched) as client:
        # Warm up: imports, connections, the collector; what a dispatcher costs at rest.
        client.run_batch("echo", [{"value": 0}] * 10, timeout_s=60)
        baseline_kb = vm_kb("VmRSS")
        # The window bounds what is in flight (C8); without it the batched client would put
        # the whole batch in flight at once and measure that instead of the history.
        calls = [{"value": i} for i in range(args.calls)]
        wall_s = client.run_batch("echo", calls, timeout_s=3600, max_in_flight=args.window)
    line = {
        "calls": args.calls,
        "wall_s": wall_s,
        "peak_rss_kb": vm_kb(),
        "baseline_rss_kb": baseline_kb,
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
