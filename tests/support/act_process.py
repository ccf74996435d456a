"""A dispatcher in a process of its own, for the chaos tests that SIGKILL one mid-batch.

``python -m tests.support.act_process URL BRANCH_ID TOOLS REQUESTS_JSON [MAX_CONCURRENT]``
runs ``Branch(id=BRANCH_ID).act(requests)`` on a fleet of ``TOOLS`` (module names, comma
separated) at URL; :func:`act_argv` builds those arguments for ``sigkill_child_when``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["act_argv"]


def act_argv(
    url: str,
    branch_id: str,
    tools: Sequence[str],
    requests: list[dict[str, Any]],
    *,
    max_in_flight: int | None = None,
) -> list[str]:
    """The interpreter arguments that run this module's dispatcher on ``requests``."""
    argv = ["-m", __name__, url, branch_id, ",".join(tools), json.dumps(requests)]
    return [*argv, str(max_in_flight)] if max_in_flight is not None else argv


async def _main(argv: Sequence[str]) -> None:
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.action import CallParams
    from toolfleet.schemas.settings import Settings

    url, branch_id, tools, requests = argv[0], argv[1], argv[2], json.loads(argv[3])
    params = CallParams(max_in_flight=int(argv[4])) if len(argv) > 4 else None
    fleet = Fleet(Settings(broker_url=url, tools=tuple(tools.split(","))))
    await Branch(fleet=fleet, id=branch_id).act(requests, call_params=params)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
