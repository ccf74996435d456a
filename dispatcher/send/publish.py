"""Putting calls on the broker: the outage retry, the choice between the loop's own client
and kombu's, and one error for what failed.

A call goes out on the running loop's Redis client (toolfleet.dispatcher.send.direct: no thread
hop, one round trip) unless a monitor watches or the calls are bundled; then kombu's producer
sends it on the fleet's one publishing thread. Either way a broker outage is retried (the one
outage policy, toolfleet.broker.outage), and anything else that fails becomes one BrokerError
naming the broker (:func:`~toolfleet.dispatcher.send.enqueue.enqueue_error`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.exceptions import RedisError

from toolfleet.broker.outage import OutageRetry
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.infra.outage_log import outage_log
from toolfleet.dispatcher.send.bundles import publish_bundles
from toolfleet.dispatcher.send.direct import (
    LeadCommands,
    direct_publish_possible,
    encode_call,
    publish_direct,
    watched,
)
from toolfleet.dispatcher.send.enqueue import enqueue_error, is_outage, publish_calls, send_options
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

__all__ = ["Calls", "publish", "publish_untracked"]

Calls = Sequence[tuple[CallMessage, Tool]]


async def publish(
    fleet: Fleet,
    calls: Calls,
    *,
    bundle_size: int | None = None,
    before: LeadCommands | None = None,
) -> None:
    """Enqueue ``calls`` in one round trip; raises BrokerError.

    With ``bundle_size``, up to that many calls share one ``toolfleet.execute_many``
    message (CallParams.bundle_size); otherwise each call is its own task. ``before``
    (claimed by the caller) reaches Redis ahead of the first message. The reconciler
    tracks each call from here until its result arrives, and republishes a lost one the
    same way (:func:`publish_untracked`).
    """
    await publish_untracked(fleet, calls, bundle_size=bundle_size, before=before)
    await fleet.reconciler.published(calls, republish=lambda lost: publish_untracked(fleet, lost))


async def publish_untracked(
    fleet: Fleet,
    calls: Calls,
    *,
    bundle_size: int | None = None,
    before: LeadCommands | None = None,
) -> None:
    """Enqueue ``calls``, retrying through a broker outage up to
    ``TOOLFLEET_OUTAGE_LIMIT_S`` (a broker restarting mid-batch must not fail the calls not
    yet enqueued), or ``TOOLFLEET_CONNECT_LIMIT_S`` for a broker never reached
    (toolfleet.dispatcher.fleet.first_contact). A retry may enqueue a call twice; its
    call_id record makes the second message a no-op (C7). ``before`` rides again with each
    retry on the loop's own client (idempotent writes) and is settled once the messages are
    in or given up; kombu's path sends it alone, which settles it (written, or the batch
    runs without), so only on its first try. The retries follow the one outage policy,
    toolfleet.broker.outage."""

    lead: list[LeadCommands | None] = [before]  # None once sent alone
    retried = False

    def retrying(exc: BaseException, retry: OutageRetry) -> None:
        nonlocal retried
        retried = True
        outage_log(fleet.redis).failing("publisher", exc)

    try:
        await fleet.contact.retry(
            lambda: _publish_once(fleet, calls, bundle_size, lead),
            retry_if=lambda exc: isinstance(exc, BrokerError) and is_outage(exc),
            on_retry=retrying,
        )
        if retried:
            outage_log(fleet.redis).answering("publisher")
    except BaseException as exc:
        if before is not None:
            before.settle(exc)
        raise


async def _publish_once(
    fleet: Fleet, calls: Calls, bundle_size: int | None, lead: list[LeadCommands | None]
) -> None:
    if bundle_size is None and calls and await _direct_publishing(fleet):
        await _publish_direct(fleet, calls, lead[0])
        return
    before, lead[0] = lead[0], None
    if before is not None:
        await before.send_alone(fleet.redis)
    if not calls:
        return
    loop = asyncio.get_running_loop()
    try:
        executor = fleet.publishing_thread()
        if bundle_size is None:
            await loop.run_in_executor(executor, publish_calls, fleet.app, list(calls))
        else:
            await loop.run_in_executor(
                executor, publish_bundles, fleet.app, list(calls), bundle_size
            )
    except BrokerError:
        raise
    except Exception as exc:
        raise enqueue_error(fleet.settings.broker_url, len(calls), exc) from exc


async def _direct_publishing(fleet: Fleet) -> bool:
    """Whether calls go out on the loop's client (toolfleet.dispatcher.send.direct) now."""
    if not direct_publish_possible(fleet.app):
        return False
    try:
        return not await watched(fleet.app, fleet.redis)
    except (RedisError, OSError):
        return False  # kombu's path reports the broker (and retries an outage)


async def _publish_direct(fleet: Fleet, calls: Calls, before: LeadCommands | None) -> None:
    try:
        encoded = []
        for message, tool in calls:
            queue, options = send_options(fleet.settings, message, tool)
            encoded.append((queue, encode_call(fleet.app, message, tool, queue, options)))
        steps = [before.add_to] if before is not None else []
        replies = await publish_direct(fleet.redis, encoded, steps)
    except Exception as exc:
        raise enqueue_error(fleet.settings.broker_url, len(calls), exc) from exc
    if before is not None:
        before.settle(next((r for r in replies if isinstance(r, Exception)), None))
