"""The caller's handle on a fleet: its configuration (settings, app, registry), its clients (one
share per event loop) and their lifecycle; approvals and the tool catalog by delegation."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from celery import Celery

from toolfleet.dispatcher.fleet.first_contact import BrokerContact
from toolfleet.dispatcher.fleet.loop_binding import LoopBinding
from toolfleet.dispatcher.fleet.tool_catalog import ToolCatalog
from toolfleet.dispatcher.govern import approvals as parked
from toolfleet.dispatcher.govern.approvals import ApprovalHandler
from toolfleet.dispatcher.govern.extension import FLEET_HOOKS, AnyExtension, overridden
from toolfleet.dispatcher.watch.broker_watch import KeptHistory
from toolfleet.dispatcher.watch.collector import Collector
from toolfleet.dispatcher.watch.reconciler import Reconciler
from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import ENV_PREFIX, Settings
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.app import create_app, redis_url_of
from toolfleet.workers.registry import Registry
from toolfleet.workers.registry import registry as default_registry

if TYPE_CHECKING:
    from toolfleet.embedded.local import LocalFleet

__all__ = ["Fleet"]

log = logging.getLogger(__name__)


class Fleet:
    """Everything a dispatcher needs to send calls to the workers and hear back.

    The tools named in ``settings.tools`` are imported into ``registry`` (the default
    registry unless given): the dispatcher validates arguments, redacts secrets and picks
    each call's queue from the tool registered under its name.

    A fleet may be used from any number of event loops, one after another or at once (one
    per thread): each loop gets its own Redis clients, collector and reply list on first use
    (:mod:`toolfleet.dispatcher.fleet.loop_binding`), closed when that loop ends through
    ``asyncio.run`` or earlier by ``await fleet.aclose()`` inside it. The one rule left: a loop
    closed by hand (``loop.close()`` without ``loop.shutdown_asyncgens()``) must
    ``await fleet.aclose()`` first, or its connections are left to the garbage collector.
    """

    def __init__(self, settings: Settings | None = None, *, registry: Registry | None = None):
        self.settings = settings if settings is not None else Settings.from_env()
        if self.settings.broker_url is None:
            # The command line starts a private Redis when no broker is set; a library that
            # silently wrote into db 0 of whatever Redis is local would surprise its user.
            raise ConfigurationError(
                f"no broker: set {ENV_PREFIX}BROKER_URL (for example "
                f"redis://127.0.0.1:6379/0) or pass Settings(broker_url=...); for a private "
                f"local fleet with no Redis to install, use "
                f"`with Fleet.embedded(tools=[...]) as fleet:`"
            )
        self.registry = registry if registry is not None else default_registry
        self.registry.load_modules(self.settings.tools)
        self.keys = Keys(self.settings.key_prefix)
        self.app: Celery = create_app(self.settings, registry=self.registry)
        self.redis_url = redis_url_of(self.app)
        # kombu producers are not thread-safe: one publishing thread per fleet, shared by
        # every loop that uses it (batched messages, and single ones while a monitor watches;
        # otherwise calls go out on the loop's own client, toolfleet.dispatcher.send.direct).
        self._executor: ThreadPoolExecutor | None = None
        self._bindings: dict[asyncio.AbstractEventLoop, LoopBinding] = {}
        self._bindings_lock = threading.Lock()
        # Secret argument names the workers announced for tools this dispatcher lacks.
        self.catalog = ToolCatalog(self.registry)
        self.approval_handlers: list[ApprovalHandler] = []
        # Reached once: silence is then an outage, else most likely a wrong URL (first_contact).
        self.contact = BrokerContact(self.settings)

    @classmethod
    def from_env(cls, *, registry: Registry | None = None, **overrides: Any) -> Fleet:
        """A fleet for ``TOOLFLEET_*`` settings; keyword overrides win over the environment."""
        return cls(Settings.from_env(**overrides), registry=registry)

    @classmethod
    def embedded(
        cls, tools: Iterable[Any] = (), *, persist: bool = False, **settings: Any
    ) -> LocalFleet[Fleet]:
        """A private local fleet for a ``with`` (or ``async with``) block: a Redis of its own
        and one sync and one async worker, stopped when the block ends. ``tools``: module
        names, modules or ``@tool`` functions defined in a module (not ``__main__``);
        ``settings``: other Settings fields; ``persist`` keeps its Redis data for the next
        embedded run (as ``toolfleet demo`` does)."""
        from toolfleet.embedded.local import LocalFleet

        return LocalFleet(cls, tools, persist=persist, **settings)

    def tool(self, function: str) -> Tool:
        """The registered tool named ``function``; UnknownToolError if there is none."""
        return self.registry.get(function)

    def _bind(self) -> LoopBinding:
        loop = asyncio.get_running_loop()
        # Lock-free for the common case (several times per call): a dict read is atomic.
        binding = self._bindings.get(loop)
        if binding is not None:
            return binding
        with self._bindings_lock:
            binding = self._bindings.get(loop)
            if binding is not None:
                return binding
            # A loop closed without shutdown_asyncgens() (closed by hand) cannot close its
            # binding any more; forget it and let the collector free its sockets.
            for stale in [other for other in self._bindings if other.is_closed()]:
                log.warning(
                    "fleet: an event loop was closed without 'await fleet.aclose()' or "
                    "loop.shutdown_asyncgens(); its Redis connections are left to the "
                    "garbage collector"
                )
                del self._bindings[stale]
            binding = LoopBinding(
                self.redis_url,
                self.keys,
                self.settings,
                self._release,
                on_answer=self.contact.answered,
            )
            self._bindings[loop] = binding
            return binding

    async def _release(self, binding: LoopBinding) -> None:
        with self._bindings_lock:
            if self._bindings.get(binding.loop) is binding:
                del self._bindings[binding.loop]
        await binding.aclose()

    @property
    def collector_id(self) -> str:
        """The running loop's dispatcher id (names its reply list and its liveness key)."""
        return self._bind().dispatcher_id

    @property
    def reply_key(self) -> str:
        """The Redis list the running loop's collector reads results from."""
        return self._bind().reply_key

    @property
    def redis(self) -> aioredis.Redis:
        """The asyncio Redis client for history and records, bound to the running loop."""
        return self._bind().redis

    @property
    def histories(self) -> dict[KeptHistory, int]:
        """The running loop's histories of branches with a batch in flight (see LoopBinding)."""
        return self._bind().histories

    @property
    def collector(self) -> Collector:
        return self._bind().collector

    @property
    def reconciler(self) -> Reconciler:
        return self._bind().reconciler

    async def learn_tools(self, functions: Iterable[Any]) -> None:
        """Read what the workers announced about tools named in a batch that this dispatcher
        has not imported (toolfleet.dispatcher.fleet.tool_catalog); never raises."""
        await self.catalog.learn(self.redis, self.keys, functions)

    def announced_secret_args(self, function: Any) -> frozenset[str] | None:
        """The secret argument names the fleet's workers announced for ``function``, or None
        when no worker did (then no argument value of its call may be shown)."""
        return self.catalog.secret_args(function)

    def expect(self, call_id: str, attempt: int) -> asyncio.Future[CallResult]:
        return self.collector.expect(call_id, attempt)

    def publishing_thread(self) -> ThreadPoolExecutor:
        """The one thread this fleet runs kombu's producers in: publishes and task events."""
        with self._bindings_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="toolfleet-publish"
                )
            return self._executor

    # -- calls parked for approval (toolfleet.dispatcher.govern.approvals) ------------------

    async def approve(
        self, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> ApprovalRequest:
        """Let the waiting call ``call_id`` run; ApprovalNotWaitingError (an ApprovalError)
        when it is not waiting."""
        return await parked.approve(self.redis, self.keys, call_id, by=by, reason=reason)

    async def deny(self, call_id: str, reason: str, *, by: str | None = None) -> ApprovalRequest:
        """Refuse the waiting call ``call_id``: it ends as a denial the model reads, with
        ``reason``; ApprovalNotWaitingError (an ApprovalError) when it is not waiting."""
        return await parked.deny(self.redis, self.keys, call_id, reason, by=by)

    async def approvals(self) -> list[ApprovalRequest]:
        """Every call of the fleet waiting for approval, oldest first."""
        return await parked.waiting_approvals(self.redis, self.keys)

    def use(self, extension: AnyExtension) -> AnyExtension:
        """Register ``extension.on_approval`` as an approval handler (as :meth:`on_approval`;
        handlers are asked in registration order). Returns it."""
        overridden(extension, FLEET_HOOKS, "fleet")
        self.on_approval(extension.on_approval)
        return extension

    def on_approval(self, handler: ApprovalHandler) -> ApprovalHandler:
        """Install ``handler(request) -> True | False | None`` (sync or async): called in this
        process for each call its batches park. True approves, False denies, None leaves the
        call waiting for another decider; a handler that raises is logged, recorded as a
        CallbackFailed signal of the branch whose call it is, and skipped; one that returns
        anything else is logged and skipped. To deny with a reason the model reads, a handler
        awaits ``fleet.deny(request.call_id, reason)`` and returns None."""
        self.approval_handlers.append(handler)
        return handler

    async def aclose(self) -> None:
        """Close the running loop's clients and background tasks now.

        Optional when the loop is run by ``asyncio.run`` (or ``asyncio.Runner``): each
        loop's share closes itself when that loop shuts down. Other loops' shares are left
        to them. The fleet stays usable: the next call in any loop binds afresh."""
        loop = asyncio.get_running_loop()
        with self._bindings_lock:
            binding = self._bindings.get(loop)
        if binding is not None:
            await self._release(binding)

    def close(self) -> None:
        """Stop the publishing thread now rather than when the fleet is garbage-collected
        (a new one starts if the fleet is used again). Each loop's clients close with that
        loop, or with ``await fleet.aclose()`` inside it."""
        with self._bindings_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    @property
    def loops_bound(self) -> int:
        """How many event loops hold clients of this fleet now (0 after they all ended)."""
        with self._bindings_lock:
            return len(self._bindings)

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
