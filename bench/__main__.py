"""``python -m bench``: every workload in every mode, one JSON line per result.

Starts its own workers on a private Redis database (the first empty one of 6..1 unless --db
is given; the tests use 8..15) held by a lock key, and flushes it afterwards.
"""

from __future__ import annotations

import argparse
import platform
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

import redis

from bench.measure import Result, target_lines
from bench.sizes import FULL, QUICK
from bench.workloads import DEFAULT_WORKLOADS, MODES, WORKLOADS, Context

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure in-process vs raw Celery vs toolfleet on the same tools, one run.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a measured target is missed or a workload failed",
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(WORKLOADS), metavar="WORKLOAD",
        help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}; all but "
        f"{', '.join(sorted(set(WORKLOADS) - set(DEFAULT_WORKLOADS)))} run by default",
    )  # fmt: skip
    parser.add_argument(
        "--mode", action="append", choices=MODES, metavar="MODE",
        help=f"run only this mode (repeatable): {', '.join(MODES)}",
    )  # fmt: skip
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument(
        "--db",
        type=int,
        default=None,
        help="Redis database to use; must be empty, flushed after (default: first empty of 6..1)",
    )
    return parser


_LOCK_KEY = "toolfleet-bench-lock"
_AUTO_DBS = (6, 5, 4, 3, 2, 1)


def claim_db(host: str, port: int, db: int | None) -> redis.Redis | None:
    """A client on an empty database this run now holds (lock key set), or None."""
    for candidate in (db,) if db is not None else _AUTO_DBS:
        client = redis.Redis(host=host, port=port, db=candidate)
        # Empty, then locked: a second bench run (or anyone checking emptiness) moves on.
        if client.dbsize() == 0 and client.set(_LOCK_KEY, "1", nx=True, ex=6 * 3600):
            if client.dbsize() == 1:
                return client
            client.delete(_LOCK_KEY)
        client.close()
    return None


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the with-blocks: workers stopped by PID, the database flushed.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    client = claim_db(args.redis_host, args.redis_port, args.db)
    if client is None:
        tried = args.db if args.db is not None else list(_AUTO_DBS)
        print(
            f"bench: no empty Redis database among {tried} at {args.redis_host}:"
            f"{args.redis_port}; pass a free one with --db N (it is flushed after the run)",
            file=sys.stderr,
        )
        return 2
    db = client.connection_pool.connection_kwargs["db"]
    broker_url = f"redis://{args.redis_host}:{args.redis_port}/{db}"
    missed: list[str] = []

    def emit(result: Result) -> None:
        print(result.to_json(), flush=True)
        for line in target_lines(result):
            print(line, flush=True)
        missed.extend(f"{t['name']} ({t['value']})" for t in result.targets if not t["met"])
        if result.error is not None:
            missed.append(f"{result.workload}/{result.mode} failed: {result.error[:200]}")

    ctx = Context(
        broker_url=broker_url,
        sizes=QUICK if args.quick else FULL,
        modes=frozenset(args.mode or MODES),
        emit=emit,
    )
    print(
        f"bench: {'quick' if args.quick else 'full'} run on {platform.node()} "
        f"({platform.python_version()}), broker {broker_url}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        file=sys.stderr,
    )
    try:
        for name in args.only or list(DEFAULT_WORKLOADS):
            try:
                for result in WORKLOADS[name](ctx):
                    ctx.emit(result)
            except Exception as exc:  # one broken workload must not lose the others' lines
                ctx.emit(Result(name, "*", 0, 0.0, error=f"{type(exc).__name__}: {exc}"))
    finally:
        client.flushdb()
        client.close()
    if args.check and missed:
        print(f"bench --check: {len(missed)} missed:", file=sys.stderr)
        for item in missed:
            print(f"  {item}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
