"""Benchmarks: the same tool workloads in-process, on raw Celery and on toolfleet, side by side.

Run ``python -m bench --help``. Nothing here is part of the default test run.
"""
