"""Step 4, send: calls become Celery messages on the broker (single or bundled)."""

__all__: list[str] = []
