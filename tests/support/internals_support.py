"""What the tests of a pinned library's internals (test_celery_internals, test_flower_internals,
test_kombu_internals) share: a failure names the internal that changed, the version our module
was written against, the one installed, and the one module to adapt."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def change_message(module: str, written_against: str, installed: str) -> Callable[[str], str]:
    """``changed(what)``: the failure message for an internal of ``module``'s library that is
    no longer as ``module`` (a path, e.g. workers/celery_internals.py) was written against."""

    def changed(what: str) -> str:
        return (
            f"{what} — {module} was written against {written_against}; {installed} is "
            f"installed: adapt {module}"
        )

    return changed


def parameters(function: object) -> list[str]:
    """The parameter names of ``function``, in order."""
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]
