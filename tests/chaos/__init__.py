"""Fault injection with real processes (marked chaos; run with python -m pytest -q -m chaos)."""
