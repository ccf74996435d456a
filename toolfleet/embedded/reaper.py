"""The embedded fleet's reaper: kills its process groups if toolfleet dies without cleaning up.

Run as a script (``python -I reaper.py``), not imported: it must start in milliseconds and
depend on nothing. It reads process-group ids from stdin, ``+PGID`` when one starts and
``-PGID`` when toolfleet has stopped it; at end of file (toolfleet exited, even by SIGKILL)
it SIGKILLs every group still listed. So a worker busy in a blocking tool, or its prefork pool
processes, never outlive the toolfleet that started them.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    groups: set[int] = set()
    for line in sys.stdin:
        text = line.strip()
        if text.startswith("+") and text[1:].isdigit():
            groups.add(int(text[1:]))
        elif text.startswith("-") and text[1:].isdigit():
            groups.discard(int(text[1:]))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main()
