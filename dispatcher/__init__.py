"""The caller's side of toolfleet: Branch.act, governance, hooks, enqueue, collect, history."""

__all__: list[str] = []
