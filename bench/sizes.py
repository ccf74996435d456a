"""How big each workload is: the full sizes the targets are set at, and a --quick set."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Sizes"]


@dataclass(frozen=True, slots=True)
class Sizes:
    echo_calls: int
    sync_calls: int
    sync_concurrency: tuple[int, ...]
    sleep_s: float
    async_calls: int
    # Raw Celery's threads pool sizes tried for the async workload; the best one is the baseline.
    async_thread_pools: tuple[int, ...]
    latency_calls: int
    # Batch sizes for the dispatcher-RSS workload; the last is the headline.
    rss_calls: tuple[int, ...]
    # Sequential echoes counted by the roundtrips workload (commands per call).
    roundtrip_calls: int = 200
    echo_workers: int = 2
    # Sequential calls per delay of the network workload; at the slowest delay, fewer.
    network_calls: int = 200
    network_slow_calls: int = 50


FULL = Sizes(
    echo_calls=10_000,
    sync_calls=200,
    sync_concurrency=(4, 8, 16),
    sleep_s=0.05,
    async_calls=2_000,
    async_thread_pools=(100, 500),
    latency_calls=1_000,
    rss_calls=(10_000, 100_000),
)

QUICK = Sizes(
    echo_calls=500,
    sync_calls=40,
    sync_concurrency=(4,),
    sleep_s=0.05,
    async_calls=200,
    async_thread_pools=(100,),
    latency_calls=50,
    rss_calls=(1_000, 5_000),
    roundtrip_calls=50,
    network_calls=20,
    network_slow_calls=10,
)
