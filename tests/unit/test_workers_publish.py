"""publish_calls against a broker that is not there (no workers needed)."""

from __future__ import annotations

import time

import pytest

from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.app import create_app
from toolfleet.workers.registry import Registry, tool


def test_publish_to_an_unreachable_broker_is_a_broker_error_with_the_password_masked() -> None:
    reg = Registry()

    @tool(registry=reg)
    def noop() -> None:
        return None

    # Port 1 on localhost: nothing listens there, so the connection is refused at once.
    app = create_app(Settings(broker_url="redis://:hunter2@127.0.0.1:1/0"), registry=reg)
    started = time.monotonic()
    with pytest.raises(BrokerError) as info:
        publish_calls(app, [(CallMessage(call_id="c1", function="noop"), reg.get("noop"))])
    assert time.monotonic() - started < 30
    assert "127.0.0.1:1" in str(info.value) and "hunter2" not in str(info.value)
    app.close()
