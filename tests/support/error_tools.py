"""Tools for the tests of a call's structured error (``ActionResponseModel.error_info``);
workers load this module with --tools."""

from __future__ import annotations

import asyncio
import time

from toolfleet.workers.registry import tool

__all__ = ["InventoryError", "out_of_stock", "overruns_async", "overruns_sync"]


class InventoryError(Exception):
    """A tool module's own exception class, which the caller's side can rebuild by name."""


@tool
def out_of_stock(item: str) -> None:
    raise InventoryError(f"{item} is out of stock")


@tool(timeout_s=0.5)
async def overruns_async(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@tool(timeout_s=0.5)
def overruns_sync(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
