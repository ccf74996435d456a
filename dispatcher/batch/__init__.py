"""Step 3, batch: one act() and its calls: the one-call transaction, the window, the writer."""

__all__: list[str] = []
