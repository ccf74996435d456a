"""Calling a user's callback: a gate, a hook handler, an event observer, a message callback,
an escalation approver.

Each may be a plain function or a coroutine function (or return an awaitable); when one raises,
what is logged, recorded (``CallbackFailed``, ``GateDenied``) or returned names it by its
qualified name and the error by its type and message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["call_user", "callback_name", "error_text"]


async def call_user(callback: Callable[..., Any], *args: Any) -> Any:
    """``callback(*args)``, awaited when it returns an awaitable; its error propagates."""
    result = callback(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def callback_name(callback: Any) -> str:
    """How a failure names ``callback``: its qualified name, else its repr."""
    return str(getattr(callback, "__qualname__", None) or repr(callback))


def error_text(error: BaseException) -> str:
    """How a failure shows the error a callback raised: ``Type: message``."""
    return f"{type(error).__name__}: {error}"
