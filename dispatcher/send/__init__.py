"""Layer send: calls become Celery messages on the broker (single or bundled), and are
cancelled (docs/layout.md: the layers)."""

__all__: list[str] = []
