"""Integrations that sit above the dispatcher: each adapts an agent framework or protocol.

Import the one you need (``toolfleet.adapters.lionagi``, ``toolfleet.adapters.mcp``); each
imports its framework, an optional extra, only when imported itself.
"""

__all__: list[str] = []
