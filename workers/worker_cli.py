"""Placeholder: the owning issue replaces this module with its subcommands."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add this module's subcommands to the ``toolfleet`` parser."""
