"""docs/configuration.md and ``Settings`` agree: the page has a row for every setting, under
the environment variable ``Settings.from_env`` reads, and names no ``TOOLFLEET_*`` variable that
is not a setting (a renamed or removed field would otherwise stay documented)."""

from __future__ import annotations

import re
from pathlib import Path

from toolfleet.schemas.settings import ENV_PREFIX, Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_NAMED = re.compile(rf"\b{ENV_PREFIX}[A-Z0-9_]*[A-Z0-9]")
_ROW = re.compile(rf"^\| `({ENV_PREFIX}[A-Z0-9_]+)` \|", re.MULTILINE)


def _settings_variables() -> set[str]:
    return {ENV_PREFIX + name.upper() for name in Settings.model_fields}


def test_every_setting_has_its_row_in_the_configuration_doc() -> None:
    rows = _ROW.findall(DOC.read_text(encoding="utf-8"))
    assert len(rows) == len(set(rows)), f"a setting has two rows: {sorted(rows)}"
    missing = sorted(_settings_variables() - set(rows))
    assert missing == [], f"docs/configuration.md has no row for {missing}"


def test_the_configuration_doc_names_only_real_settings() -> None:
    named = set(_NAMED.findall(DOC.read_text(encoding="utf-8")))
    unknown = sorted(named - _settings_variables())
    assert unknown == [], f"docs/configuration.md names variables that are not settings: {unknown}"
