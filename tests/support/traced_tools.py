"""A tool for the tracing tests: it fails with its secret argument in the error's text."""

from __future__ import annotations

from toolfleet.workers.registry import tool

__all__ = ["fail_quoting_secret"]


@tool(secret_args=("api_key",))
def fail_quoting_secret(api_key: str) -> None:
    raise PermissionError(f"the key {api_key} was refused")
