"""How many things ran at once: the peak of intervals given by their start and end times."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["most_at_once"]


def most_at_once(starts: Iterable[float], ends: Iterable[float]) -> int:
    """The most intervals open at one instant. At a tie an end counts before a start, so
    one run ending as the next begins (back to back) is not an overlap."""
    edges = sorted([(at, 1) for at in starts] + [(at, -1) for at in ends])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak
