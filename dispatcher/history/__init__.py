"""Step 6, history: the branch's record in Redis, written in order and exactly once, the batch
journal, and recovery of a dead dispatcher's batches."""

__all__: list[str] = []
