"""A program whose main() fails while one of its act() calls waits for approval, just after
it blocked its own event loop for a moment (as a ``subprocess.run`` of ``toolfleet
approvals`` from inside the loop does). It must end at once with its own RuntimeError.

``python -m tests.support.blocked_loop_exit`` with the ``TOOLFLEET_*`` environment of a fleet
whose workers load ``tests.support.approval_tools``; ``SIDE`` names the tool's side file.
"""

from __future__ import annotations

import asyncio
import os
import time

from toolfleet import Branch, Fleet

# Longer than the approval wait's longest poll interval (0.5 s), so that poll is due when
# the loop comes back, in the same loop turns as main()'s end.
_BLOCK_S = 1.0
_PARK_DEADLINE_S = 30.0
_SETTLE_S = 1.5


async def main() -> None:
    fleet = Fleet.from_env()
    branch = Branch(fleet=fleet)
    side = os.environ["SIDE"]
    request = {"function": "refund", "arguments": {"side": side, "token": 1, "amount": 5}}
    acting = asyncio.create_task(branch.act([request]))
    deadline = time.monotonic() + _PARK_DEADLINE_S
    while not await fleet.approvals():
        if acting.done() or time.monotonic() > deadline:
            raise SystemExit(f"the call was never parked: {acting}")
        await asyncio.sleep(0.05)
    print("parked", flush=True)
    # The poll backs off to its longest interval; it now sleeps nearly all of the time.
    await asyncio.sleep(_SETTLE_S)
    # The caller blocks its own loop, as a subprocess.run from inside it would: on purpose.
    time.sleep(_BLOCK_S)  # noqa: ASYNC251
    raise RuntimeError("main() fails while a call waits for approval")


if __name__ == "__main__":
    # wait_for, as the program that met the hang had it: two more loop turns at the end of
    # main(), in which the approval poll starts a Redis command.
    asyncio.run(asyncio.wait_for(main(), 300))
