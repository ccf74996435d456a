"""The worker side of toolfleet: the Celery app, the execute task, the asyncio pool, the registry."""

from workers.keys import Keys
from workers.settings import ENV_PREFIX, Settings

__all__ = ["ENV_PREFIX", "Keys", "Settings"]
