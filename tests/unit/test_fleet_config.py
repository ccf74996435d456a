"""The library never picks a broker by itself: without TOOLFLEET_BROKER_URL, Fleet.from_env()
is a configuration error that names the variable and the embedded alternative."""

from __future__ import annotations

import pytest

from toolfleet import ConfigurationError, Fleet, Settings


def test_from_env_without_a_broker_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFLEET_BROKER_URL", raising=False)
    with pytest.raises(ConfigurationError) as refused:
        Fleet.from_env()
    message = str(refused.value)
    assert "TOOLFLEET_BROKER_URL" in message and "Fleet.embedded(" in message
    with pytest.raises(ConfigurationError, match="TOOLFLEET_BROKER_URL"):
        Fleet(Settings())
