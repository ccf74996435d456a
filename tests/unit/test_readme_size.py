"""README.md stays under 12 KB (CONTRIBUTING.md): what toolfleet is, when to use it, set-up,
the quick start, one provider loop, the API summary and links; detail lives in docs/."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
LIMIT_BYTES = 12 * 1024


def test_the_readme_stays_under_12_kb() -> None:
    size = README.stat().st_size
    assert size <= LIMIT_BYTES, (
        f"README.md is {size:,} bytes, over {LIMIT_BYTES:,} (12 KB, CONTRIBUTING.md): move "
        "detail into docs/ and link it"
    )
