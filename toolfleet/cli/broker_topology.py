"""What the broker keeps across a restart, and where it stands in its replication.

``persistence(client)`` reads ``CONFIG GET appendonly appendfsync save`` (falling back to
``INFO persistence`` when a managed Redis refuses CONFIG); ``persistence_warning`` is the one
line ``toolfleet worker`` and ``toolfleet status`` print when the broker would lose queued
calls, records and history on a restart. ``topology(client)`` reads ``INFO replication``:
the role, the replicas and their lag.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["persistence", "persistence_warning", "topology"]

_DOC = "deploy/README.md#settings-a-production-fleet-needs"


def persistence(client: redis.Redis) -> dict[str, Any]:
    """The broker's persistence: ``mode`` is ``aof-always``, ``aof-everysec``, ``aof-no``
    (AOF without fsync), ``rdb`` (snapshots only), ``none`` or ``unknown``; ``source`` says
    how it was read (``config``, ``info``) and ``note`` what could not be read."""
    found: dict[str, Any] = {
        "mode": "unknown",
        "appendonly": None,
        "appendfsync": None,
        "save": None,
        "source": None,
        "note": "",
    }
    try:
        config: dict[str, str] = {}
        for name in ("appendonly", "appendfsync", "save"):
            config.update(_decoded(client.config_get(name)))
    except redis.ResponseError as exc:  # a managed Redis: CONFIG renamed away or not allowed
        found["note"] = f"CONFIG GET refused ({exc})"
    else:
        found.update(
            appendonly=config.get("appendonly") == "yes",
            appendfsync=config.get("appendfsync"),
            save=config.get("save", ""),
            source="config",
        )
        found["mode"] = _mode(found["appendonly"], found["appendfsync"], bool(found["save"]))
        return found
    try:
        info = client.info("persistence")
    except redis.ResponseError as exc:
        found["note"] += f"; INFO persistence refused ({exc})"
        return found
    aof = bool(int(info.get("aof_enabled", 0)))
    found.update(appendonly=aof, source="info")
    if aof:
        # INFO does not say the fsync policy.
        found["mode"] = "aof"
    found["note"] += "; the fsync policy and snapshot schedule are not in INFO"
    return found


def _decoded(raw: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }


def _mode(appendonly: bool, appendfsync: str | None, snapshots: bool) -> str:
    if appendonly:
        return f"aof-{appendfsync or 'everysec'}"
    return "rdb" if snapshots else "none"


def persistence_warning(found: dict[str, Any], broker: str) -> str | None:
    """One short line when the broker would lose data on a restart, or cannot say; None
    when it keeps an append-only file."""
    mode = found["mode"]
    if mode.startswith("aof") and mode != "aof-no":
        return None
    if mode == "unknown":
        why = found["note"].lstrip("; ")
        return (
            f"toolfleet: cannot tell whether the broker {broker} persists its data ({why}); "
            f"it should run with appendonly yes ({_DOC})"
        )
    what = {
        "aof-no": "an append-only file it never fsyncs",
        "rdb": f"only snapshots (save {found['save']!r})",
        "none": "no persistence",
    }[mode]
    return (
        f"toolfleet: the broker {broker} has {what}: a restart loses queued calls and "
        f"history; set appendonly yes ({_DOC})"
    )


def topology(client: redis.Redis) -> dict[str, Any]:
    """``INFO replication``: the role (primary/replica), the replicas with their lag (bytes
    behind the primary's offset, seconds since their last ack), or the primary a replica
    follows and its link."""
    try:
        info = client.info("replication")
    except redis.ResponseError as exc:
        return {"role": "unknown", "replicas": [], "note": f"INFO replication refused ({exc})"}
    role = "primary" if info.get("role") == "master" else "replica"
    offset = int(info.get("master_repl_offset", 0))
    replicas: list[dict[str, Any]] = []
    for index in range(int(info.get("connected_slaves", 0))):
        entry = info.get(f"slave{index}")
        if not isinstance(entry, dict):
            continue
        replica_offset = int(entry.get("offset", 0))
        replicas.append(
            {
                "address": f"{entry.get('ip')}:{entry.get('port')}",
                "state": str(entry.get("state", "")),
                "lag_s": int(entry.get("lag", 0)),
                "lag_bytes": max(0, offset - replica_offset),
            }
        )
    found: dict[str, Any] = {"role": role, "replicas": replicas, "offset": offset}
    if role == "replica":
        found["primary"] = {
            "address": f"{info.get('master_host')}:{info.get('master_port')}",
            "link": str(info.get("master_link_status", "")),
            "last_io_s": int(info.get("master_last_io_seconds_ago", -1)),
        }
    return found
