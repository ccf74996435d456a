"""Layer accept: an envelope in any supported shape becomes one normalized CallContext, or a
refusal (docs/layout.md: the layers)."""

__all__: list[str] = []
