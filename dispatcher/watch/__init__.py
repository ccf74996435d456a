"""Layer watch: results come back, lost calls are found, the broker is watched (docs/layout.md:
the layers)."""

__all__: list[str] = []
