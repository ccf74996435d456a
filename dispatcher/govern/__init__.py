"""Step 2, govern: the session gate, the permission policy and the lifecycle hooks."""

__all__: list[str] = []
