"""``python -m bench``: every workload in every mode, one JSON line per result.

Starts its own workers on a private Redis database (default 7, never used by the tests) and
flushes it afterwards.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence

import redis

from bench.sizes import FULL, QUICK
from bench.workloads import MODES, WORKLOADS, Context

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure in-process vs raw Celery vs toolfleet on the same tools, one run.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--only", action="append", choices=sorted(WORKLOADS), metavar="WORKLOAD",
        help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}",
    )  # fmt: skip
    parser.add_argument(
        "--mode", action="append", choices=MODES, metavar="MODE",
        help=f"run only this mode (repeatable): {', '.join(MODES)}",
    )  # fmt: skip
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument(
        "--db", type=int, default=7, help="private Redis database, flushed after (default 7)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    broker_url = f"redis://{args.redis_host}:{args.redis_port}/{args.db}"
    client = redis.Redis(host=args.redis_host, port=args.redis_port, db=args.db)
    if client.dbsize():
        print(
            f"bench: Redis database {args.db} at {args.redis_host}:{args.redis_port} is not "
            f"empty; pick a free one with --db N (it is flushed after the run)",
            file=sys.stderr,
        )
        return 2
    ctx = Context(
        broker_url=broker_url,
        sizes=QUICK if args.quick else FULL,
        modes=frozenset(args.mode or MODES),
    )
    print(
        f"bench: {'quick' if args.quick else 'full'} run on {platform.node()} "
        f"({platform.python_version()}), broker {broker_url}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        file=sys.stderr,
    )
    try:
        for name in args.only or list(WORKLOADS):
            for result in WORKLOADS[name](ctx):
                ctx.emit(result)
    finally:
        client.flushdb()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
