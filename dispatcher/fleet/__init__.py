"""The fleet: the caller's handle (``Fleet``: configuration, clients, lifecycle), each event
loop's share of it and the first contact with its broker."""

from toolfleet.dispatcher.fleet.default import default_fleet
from toolfleet.dispatcher.fleet.handle import Fleet

__all__ = ["Fleet", "default_fleet"]
