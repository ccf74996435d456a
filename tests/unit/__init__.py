"""Pure logic: no Redis, no processes."""
