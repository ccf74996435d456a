"""The approval step of a call's transaction: park it, ask this process's handlers, wait.

It runs after the gate, TOOL_PRE and the JSON contract, right before the call would be
enqueued, so a call is parked only once nothing else refuses it, and a worker never sees a
call that waits (docs/controls.md, approvals).
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from toolfleet.broker.outage import through_outage
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import decide, expire, park, wait_for_decision
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.send.approval_events import announce_approval
from toolfleet.dispatcher.send.cancel import SETTLE_TIMEOUT_S
from toolfleet.dispatcher.send.enqueue import send_options
from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.errors import ApprovalNotWaitingError, BrokerError
from toolfleet.schemas.record import bounded_arguments, shown_arguments
from toolfleet.schemas.settings import masked_url
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

__all__ = ["seek_approval"]

log = logging.getLogger(__name__)


async def seek_approval(
    fleet: Fleet,
    tool: Tool,
    message: CallMessage,
    *,
    reason: str,
    wait_s: float,
    emitter: Emitter,
) -> ApprovalRequest:
    """Park the call of ``message`` and return it decided: approved, denied or expired
    after ``wait_s``. This process's approval handlers are called through ``emitter`` (a
    failing one is logged and signalled, and the next is asked). Raises BrokerError when it
    cannot be parked through an outage; a cancelled wait ends the parked call before the
    cancellation goes on."""
    now_s = time.time()
    request = ApprovalRequest(
        call_id=message.call_id,
        tool=message.function,
        arguments=bounded_arguments(
            shown_arguments(message.arguments, tool.secret_args), tool.secret_args
        ),
        branch_id=message.branch_id,
        batch_id=message.batch_id,
        tool_call_id=message.tool_call_id,
        reason=reason,
        requested_at=now_s,
        expires_at=now_s + max(0.0, wait_s),
    )
    try:
        decided = await _park_and_wait(fleet, tool, message, request, emitter)
    except asyncio.CancelledError:
        await _withdraw(fleet, tool, message, request)
        raise
    if not decided.approved:
        await announce_approval(fleet, tool, message, decided.state, decided.decision_reason)
    return decided


async def _withdraw(
    fleet: Fleet, tool: Tool, message: CallMessage, request: ApprovalRequest
) -> None:
    """C9: act() was cancelled while the call was parked: end it, so no one is asked to
    decide a call nothing waits for (a decision that landed first stands). Shielded from a
    second cancel, and bounded: a cancelled act() must end even when the broker does not
    answer; the parked call then expires at its approval time by itself."""
    why = "its act() was cancelled before a decision"
    try:
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            await asyncio.shield(expire(fleet.redis, fleet.keys, request, by="cancel", why=why))
            await asyncio.shield(announce_approval(fleet, tool, message, "withdrawn", why))
    except TimeoutError:
        log.warning(
            "call %s of tool %r: act() was cancelled, but its parked approval could not be "
            "withdrawn within %gs on %s; it expires by itself at its approval time",
            message.call_id,
            message.function,
            SETTLE_TIMEOUT_S,
            masked_url(fleet.settings.broker_url),
        )


async def _park_and_wait(
    fleet: Fleet, tool: Tool, message: CallMessage, request: ApprovalRequest, emitter: Emitter
) -> ApprovalRequest:
    queue, options = send_options(fleet.settings, message, tool)
    try:
        earlier = await through_outage(
            lambda: park(
                fleet.redis,
                fleet.keys,
                request,
                message=message.model_dump_json(),
                route={"queue": queue, "options": options},
                ttl_s=fleet.settings.record_ttl_s,
            ),
            fleet.contact.limit_s,
        )
    except (RedisError, OSError) as exc:
        raise BrokerError(
            f"could not park call {message.call_id} of tool {message.function!r} for approval "
            f"on {masked_url(fleet.settings.broker_url)!r}: {type(exc).__name__}: "
            f"{masked_url(str(exc))}; check that the broker is running"
        ) from exc
    if earlier is not None and not earlier.waiting:
        return earlier  # parked and decided before: a replay keeps its decision
    await announce_approval(fleet, tool, message, "waiting", (earlier or request).reason)
    if earlier is not None:
        request = earlier  # parked before and still waiting: wait on, ask no handler again
    else:
        await _ask_handlers(fleet, request, emitter)
    return await wait_for_decision(fleet.redis, fleet.keys, request)


async def _ask_handlers(fleet: Fleet, request: ApprovalRequest, emitter: Emitter) -> None:
    """Offer the call to this process's handlers, in order, until one decides."""
    for handler in tuple(fleet.approval_handlers):
        outcome = await emitter.call(handler, request, where="approval", call_id=request.call_id)
        if outcome.failed:
            continue  # logged and signalled; the next handler is asked
        name, verdict = outcome.handler, outcome.value
        if verdict is None:
            continue
        if not isinstance(verdict, bool):
            # A truthy "no" must not approve: only True and False decide.
            log.warning(
                "approval handler %s returned %r for call %s, which decides nothing; return "
                "True to approve, False to deny, None to leave the call to other deciders, or "
                "await fleet.deny(request.call_id, reason) to deny with a reason the model reads",
                name,
                verdict,
                request.call_id,
            )
            continue
        try:
            await decide(
                fleet.redis,
                fleet.keys,
                request.call_id,
                "approved" if verdict else "denied",
                by=f"handler {name.rsplit('.', 1)[-1]}",
            )
        except ApprovalNotWaitingError:
            pass  # someone else decided first; that decision stands
        except (RedisError, OSError) as exc:
            log.warning(
                "approval handler %s: decision on %s not recorded: %r", name, request.call_id, exc
            )
        return
