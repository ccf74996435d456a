"""The worker side of toolfleet: Celery app, execute task, asyncio pool, tool registry."""

from workers.keys import Keys
from workers.settings import ENV_PREFIX, Settings

__all__ = ["ENV_PREFIX", "Keys", "Settings"]
