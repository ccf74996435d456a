"""Step 5, watch: results come back, lost calls are found, the broker is watched, calls are
cancelled."""

__all__: list[str] = []
