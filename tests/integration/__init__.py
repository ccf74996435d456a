"""Against real Redis, real worker processes, Flower and CLI subprocesses."""
