"""The emitter and extension registration as pure logic: what is isolated, what is not, and
what ``use()`` refuses (the protocol against real workers: tests/integration/test_extensions.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolfleet import Branch, ConfigurationError, Extension, HookPoint, Session
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.govern.session_signals import CallbackFailed, Signal


def test_an_exception_is_isolated_returned_and_signalled() -> None:
    signals: list[Signal] = []

    async def broken(value: int) -> int:
        raise ValueError(f"bad {value}")

    outcome = asyncio.run(Emitter(signals.append).call(broken, 3, where="on_x", call_id="c1"))
    assert outcome.failed and isinstance(outcome.error, ValueError)
    assert outcome.handler.endswith("broken")
    [signal] = signals
    assert isinstance(signal, CallbackFailed)
    assert (signal.call_id, signal.where, signal.error) == ("c1", "on_x", "ValueError: bad 3")
    assert asyncio.run(Emitter().call(lambda v: v + 1, 1, where="on_x")).value == 2


@pytest.mark.parametrize("error", [asyncio.CancelledError, KeyboardInterrupt, SystemExit])
def test_cancellation_and_other_base_exceptions_are_never_swallowed(
    error: type[BaseException],
) -> None:
    signals: list[Signal] = []

    def raising() -> None:
        raise error()

    with pytest.raises(error):
        asyncio.run(Emitter(signals.append).call(raising, where="on_x"))
    assert signals == []


def test_passthrough_exceptions_propagate_unsignalled() -> None:
    signals: list[Signal] = []

    def stop() -> None:
        raise LookupError("control flow")

    with pytest.raises(LookupError):
        asyncio.run(Emitter(signals.append).call(stop, where="x", passthrough=(LookupError,)))
    assert signals == []


class PostOnly(Extension):
    def after_call(self, payload: dict[str, Any]) -> None:
        pass


def test_use_registers_only_the_overridden_hooks_in_order_with_the_older_calls() -> None:
    branch = Branch()
    first = branch.hooks.on(HookPoint.TOOL_POST, print)
    extension = branch.use(PostOnly())
    assert branch.hooks.handlers(HookPoint.TOOL_POST) == (first, extension.after_call)
    assert branch.hooks.handlers(HookPoint.TOOL_PRE) == ()
    assert branch.hooks.handlers(HookPoint.TOOL_ERROR) == ()


def test_use_refuses_what_is_no_extension_or_serves_no_hook_of_its_owner() -> None:
    with pytest.raises(ConfigurationError, match=r"takes a toolfleet\.Extension instance"):
        Branch().use(print)  # type: ignore[type-var]
    with pytest.raises(ConfigurationError, match="PostOnly overrides none of the hooks session"):
        Session().use(PostOnly())
    with pytest.raises(ConfigurationError, match="overrides none"):
        Branch().use(Extension())


class SignalListener(Extension):
    def __init__(self) -> None:
        self.heard: list[Signal] = []

    def on_signal(self, signal: Signal) -> None:
        self.heard.append(signal)
        raise RuntimeError("listener bug")


def test_on_signal_hears_each_session_signal_and_its_failure_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = Session()
    listener = session.use(SignalListener())
    signal = CallbackFailed("c1", "tool_post", "h", "KeyError: 'x'")
    with caplog.at_level("WARNING", logger="toolfleet"):
        session.record(signal)
    assert listener.heard == [signal]
    assert session.signals == [signal]  # the listener's failure is no second signal
    assert "SignalListener.on_signal failed" in caplog.text and "listener bug" in caplog.text


class AsyncListener(Extension):
    async def on_signal(self, signal: Signal) -> None:  # type: ignore[override]
        pass


def test_a_coroutine_on_signal_is_refused_at_use() -> None:
    with pytest.raises(ConfigurationError, match="on_signal is a coroutine function"):
        Session().use(AsyncListener())
