"""Layer history: the branch's record in Redis, written in order and exactly once, the batch
journal, and recovery of a dead dispatcher's batches (docs/layout.md: the layers)."""

__all__: list[str] = []
