"""The broker as both sides use it at run time: the Redis clients of a broker URL (Sentinel
included) and the replica wait (``redis_url``), commands that keep a cancellation
(``redis_cancel``), the one outage retry (``outage``), liveness and monitor leases
(``liveness``), the OpenTelemetry spans across it (``tracing``), the Lua scripts it runs
(``lua/``, ``lua_scripts``) and what toolfleet keeps per client (``client_settings``).
``workers`` and ``dispatcher`` import it; it imports only ``schemas``."""

__all__: list[str] = []
