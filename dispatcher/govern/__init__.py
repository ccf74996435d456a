"""Layer govern: the permission policy, approvals, the lifecycle hooks, user callbacks and
signals (docs/layout.md: the layers)."""

__all__: list[str] = []
