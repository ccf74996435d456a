"""Settings.from_env: TOOLFLEET_* parsing and the ConfigurationError naming the variable."""

from __future__ import annotations

import warnings

import pytest

from toolfleet.schemas import ConfigurationError
from toolfleet.schemas.settings import Settings


def test_defaults_with_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.broker_url is None  # embedded default
    assert settings.tools == ()
    assert settings.sync_prefetch == 1


def test_from_env_parses_typed_values() -> None:
    settings = Settings.from_env(
        {
            "TOOLFLEET_BROKER_URL": "redis://127.0.0.1:6379/3",
            "TOOLFLEET_TOOLS": " tools.web , tools.math,, ",
            "TOOLFLEET_SYNC_PREFETCH": "2",
            "TOOLFLEET_VISIBILITY_TIMEOUT_S": "7200.5",
            "TOOLFLEET_KEY_PREFIX": "fleet-a",
            "TOOLFLEET_RUN_DIR": "",  # empty means unset
            "OTHER_BROKER_URL": "redis://ignored",
        }
    )
    assert settings.broker_url == "redis://127.0.0.1:6379/3"
    assert settings.tools == ("tools.web", "tools.math")
    assert settings.sync_prefetch == 2
    assert settings.visibility_timeout_s == 7200.5
    assert settings.run_dir is None
    assert settings.key("call", "abc") == "fleet-a:call:abc"


def test_overrides_win_over_environment_and_none_overrides_are_ignored() -> None:
    env = {"TOOLFLEET_BROKER_URL": "redis://env", "TOOLFLEET_ASYNC_PREFETCH": "8"}
    settings = Settings.from_env(env, broker_url="redis://override", async_prefetch=None)
    assert settings.broker_url == "redis://override"
    assert settings.async_prefetch == 8


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("TOOLFLEET_SYNC_PREFETCH", "zero"),
        ("TOOLFLEET_SYNC_PREFETCH", "0"),
        ("TOOLFLEET_VISIBILITY_TIMEOUT_S", "-5"),
        ("TOOLFLEET_MAX_IN_FLIGHT", "1.5"),
    ],
)
def test_invalid_variable_raises_configuration_error_naming_it(variable: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({variable: raw})
    message = str(info.value)
    assert message.startswith(f"{variable}={raw!r} is invalid")
    assert f"fix or unset {variable}" in message
    assert isinstance(info.value, ValueError)


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(ValueError):
        settings.key_prefix = "other"  # type: ignore[misc]


def test_a_misspelled_variable_is_named_with_the_setting_it_resembles() -> None:
    with pytest.warns(UserWarning, match="TOOLFLEET_MAX_INFLIGHT .*TOOLFLEET_MAX_IN_FLIGHT"):
        settings = Settings.from_env({"TOOLFLEET_MAX_INFLIGHT": "3"})
    assert settings.max_in_flight == Settings().max_in_flight  # ignored, as the warning says


def test_known_and_non_setting_variables_raise_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Settings.from_env(
            {
                "TOOLFLEET_MAX_IN_FLIGHT": "3",
                "TOOLFLEET_IMAGE": "toolfleet:1",
                "TOOLFLEET_TEST_REDIS_PORT": "6379",
            }
        )
