"""Step 1, accept: an envelope in any supported shape becomes one normalized CallContext."""

__all__: list[str] = []
