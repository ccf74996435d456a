"""The dispatcher's shared infrastructure, the layer under every step: what it logs while the
broker is down (outage_log), how a background task is stopped for sure (stopping), and what
it reads of kombu's Redis transport beyond kombu's documented API (kombu_internals)."""

__all__: list[str] = []
