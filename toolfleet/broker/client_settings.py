"""Settings toolfleet keeps per redis client, beside the client rather than stuck onto it.

A redis-py client is redis-py's object: toolfleet adds no attributes to it. What toolfleet
needs to know about one client (today: how many replicas its writes must reach) is a
:class:`ClientSettings`, found by the client in a table that holds clients weakly, so an
entry goes with its client (a per-loop client is dropped with its loop) and costs one
dictionary lookup to read.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientSettings", "client_settings", "set_client_settings"]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What toolfleet keeps about one redis client.

    ``replica_acks``: its writes of records and history count as written only once this many
    replicas acknowledge them (``Settings.replica_acks``, TOOLFLEET_REPLICA_ACKS; 0: none).
    """

    replica_acks: int = 0


_DEFAULT = ClientSettings()
_BY_CLIENT: weakref.WeakKeyDictionary[Any, ClientSettings] = weakref.WeakKeyDictionary()


def set_client_settings(client: Any, settings: ClientSettings) -> Any:
    """Keep ``settings`` for ``client`` (replacing any before); returns ``client``."""
    _BY_CLIENT[client] = settings
    return client


def client_settings(client: Any) -> ClientSettings:
    """The settings kept for ``client``; the defaults for a client given none."""
    return _BY_CLIENT.get(client, _DEFAULT)
