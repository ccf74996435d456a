"""The round trips on one call's critical path, seen by Redis: ``MONITOR`` through a slow proxy.

With every process delayed ``D`` ms each way (bench/netproxy.py) and ``D`` far above what the
processes spend computing, the commands Redis executes fall into **waves**: a command that
needs the answer of an earlier one (or a pop woken by it) reaches Redis at least one round trip
(2 D) later, while commands sent without waiting (a pipeline, a script, two processes acting on
the same wake-up) arrive together. Cutting the call's commands at every gap longer than D gives
its sequential steps; those that start early enough for their answer to reach the caller before
it returned (more than D/2 before) are on its critical path. The count is the number of round
trips the caller waited for.

``MONITOR`` lists a blocking pop when it is issued, not when an ``LPUSH`` wakes it, so a wave
of nothing but pops is a consumer going back to wait (not a step), and the wake shows as the
woken process's next command one round trip later. Nor is a wave a step when each of its
commands (name and key) was also seen while the processes sat idle for ``IDLE_S`` before the
calls: the workers' heartbeat and presence, every 2 s. Each command is labelled with the process
that sent it: the proxy names the client port behind each of its connections to Redis, and
/proc names the process that owns that port.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from bench.netproxy import DelayProxy

__all__ = ["trace_calls"]

# Blocking pops: issued to wait for the next message or reply, not a step of this call.
_POPS = frozenset({"BRPOP", "BLPOP", "BLMPOP", "BZPOPMIN"})
_MARKER = "bench-network-trace-end"
_MONITOR_JOIN_S = 10.0
# Longer than the workers' 2 s heartbeat, so its commands are known as background.
IDLE_S = 2.2


def trace_calls(
    server_port: int,
    proxy: DelayProxy,
    call_one: Callable[[dict[str, Any]], Sequence[float]],
    calls: int,
    delay_ms: float,
    worker_pid: int,
    caller: str,
) -> dict[str, Any]:
    """Trace ``calls`` sequential calls of ``call_one`` at ``delay_ms`` each way.

    ``call_one`` returns the call's latency as the caller timed it (a list of one float), so
    what the caller does after it (Celery's ``forget()``) is not on the path. Returns the
    fewest round trips on a call's critical path and each call's count, the median commands
    per call (up to the caller's return, and in all), the waves of a call with the fewest, and
    of one with the most when they differ. ``caller`` names the calling process in the labels
    ("dispatcher").
    """
    delay_s = delay_ms / 1000
    proxy.set_delay(delay_ms)
    for i in range(2):  # the new delay settles on every connection, outside the windows
        call_one({"value": -1 - i})
    direct = redis.Redis(port=server_port)
    monitor = direct.monitor()
    monitor.__enter__()
    seen: list[dict[str, Any]] = []
    listener = threading.Thread(target=_listen, args=(monitor, seen), daemon=True)
    listener.start()
    windows = []
    try:
        time.sleep(IDLE_S)
        idle_until = time.time()
        for i in range(calls):
            start = time.time()
            (latency,) = call_one({"value": i})
            windows.append((start, start + latency))
            time.sleep(8 * delay_s)  # the call's after-work (acks) ends before the next starts
        ports = proxy.connections()
    finally:
        direct.echo(_MARKER)
        listener.join(_MONITOR_JOIN_S)
        monitor.__exit__(None, None, None)
        direct.close()
    labels = _labels(ports, worker_pid, caller)
    idle = {_signature(c) for c in seen if c["time"] < idle_until}
    traced = [_waves(seen, start, end, delay_s, labels, idle) for start, end in windows]
    on_path = [sum(1 for w in waves if w["on_path"]) for waves in traced]
    fewest, most = on_path.index(min(on_path)), on_path.index(max(on_path))
    return {
        "trace_delay_ms": delay_ms,
        # The steps every call takes; a call may take more (a cached read gone stale).
        "round_trips_on_path": on_path[fewest],
        "round_trips_each_call": on_path,
        "commands_on_path": statistics.median(
            sum(len(w["commands"]) for w in waves if w["on_path"]) for waves in traced
        ),
        "commands_in_all": statistics.median(
            sum(len(w["commands"]) for w in waves) for waves in traced
        ),
        "waves": traced[fewest],
        **({"waves_of_the_longest": traced[most]} if on_path[most] > on_path[fewest] else {}),
    }


def _listen(monitor: Any, seen: list[dict[str, Any]]) -> None:
    for command in monitor.listen():
        if command["command"] == f"ECHO {_MARKER}":
            return
        seen.append(command)


def _signature(command: dict[str, Any]) -> str:
    """A command's name and first argument (its key): what a background timer repeats."""
    return " ".join(command["command"].split(" ", 2)[:2]).upper()


def _waves(
    seen: Sequence[dict[str, Any]],
    start: float,
    end: float,
    delay_s: float,
    labels: dict[str, str],
    idle: set[str],
) -> list[dict[str, Any]]:
    """The commands of one call's window (to 4 D after it returned, for its after-work)."""
    mine = [c for c in seen if start <= c["time"] <= end + 4 * delay_s]
    groups: list[list[dict[str, Any]]] = []
    for command in mine:
        if groups and command["time"] - groups[-1][-1]["time"] <= delay_s:
            groups[-1].append(command)
        else:
            groups.append([command])
    waves = []
    last_label = "?"
    for group in groups:
        named = []
        for command in group:
            name = command["command"].split(" ", 1)[0].upper()
            if command["client_type"] == "lua":
                named.append(f"{last_label} (script): {name}")
                continue
            last_label = labels.get(command["client_port"], f"port {command['client_port']}")
            named.append(f"{last_label}: {name}")
        at_s = group[0]["time"] - start
        background = all(
            _signature(c) in idle or c["command"].split(" ", 1)[0].upper() in _POPS for c in group
        )
        waves.append(
            {
                "at_ms": round(1000 * at_s, 1),
                # the first step arrives D after the call starts, each next one 2 D later
                "round_trip": round((at_s - delay_s) / (2 * delay_s) + 1, 2),
                "on_path": group[0]["time"] < end - delay_s / 2 and not background,
                "background": background,
                "commands": named,
            }
        )
    return waves


def _labels(ports: dict[int, int], worker_pid: int, caller: str) -> dict[str, str]:
    """{the proxy's port towards Redis (as MONITOR shows it): the process behind it}."""
    owners = _port_owners(set(ports.values()))
    labels = {}
    for up_port, client_port in ports.items():
        pid = owners.get(client_port)
        if pid is None:
            role = f"pid ? (port {client_port})"
        elif pid == os.getpid():
            role = caller
        elif pid == worker_pid:
            role = "worker"
        elif _sid(pid) == worker_pid:
            role = "worker child"
        else:
            role = f"pid {pid}"
        labels[str(up_port)] = role
    return labels


def _port_owners(ports: set[int]) -> dict[int, int]:
    """{local TCP port: pid} for the given loopback client ports (Linux /proc)."""
    inodes: dict[str, int] = {}
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports:
                inodes[fields[9]] = port
    owners: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners[inodes[target[8:-1]]] = int(entry)
    return owners


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
