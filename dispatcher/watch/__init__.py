"""Step 5, watch: results come back, lost calls are found, the broker is watched."""

__all__: list[str] = []
