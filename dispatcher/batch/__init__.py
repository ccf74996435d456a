"""Layer batch: one act() and its calls: the one-call transaction, the window, the writer; the
only step that drives the others (docs/layout.md: the layers)."""

__all__: list[str] = []
