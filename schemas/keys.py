"""The Redis key layout shared by workers and dispatchers. Every key is under one prefix."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "toolfleet"

    def event(self, call_id: str) -> str:
        """String: the terminal CallResult JSON of one call (the idempotency record)."""
        return f"{self.prefix}:event:{call_id}"

    def late(self, call_id: str) -> str:
        """String: the record a worker wrote for a call after the dispatcher had already
        stopped it (a sync call that ran on through a cancel or deadline)."""
        return f"{self.prefix}:late:{call_id}"

    def broker_mark(self, watcher_id: str) -> str:
        """String: written by a dispatcher's broker watch; found again after a broker restart,
        it says the broker kept its data (append-only file), so queued calls survived."""
        return f"{self.prefix}:broker-mark:{watcher_id}"

    def started(self, call_id: str) -> str:
        """String: set while a worker runs a call; found on redelivery = the worker was lost."""
        return f"{self.prefix}:started:{call_id}"

    def reply(self, collector_id: str) -> str:
        """List: CallResult JSON pushed by workers for one collector to BLPOP, and the
        progress reports of its calls that asked for them (toolfleet.schemas.progress)."""
        return f"{self.prefix}:reply:{collector_id}"

    def history(self, branch_id: str) -> str:
        """List: a branch's messages (ActionRequest/ActionResponse JSON), in order."""
        return f"{self.prefix}:history:{branch_id}"

    def events(self, branch_id: str) -> str:
        """List: a branch's logged event records (FunctionCalling.to_dict() JSON), in order."""
        return f"{self.prefix}:events:{branch_id}"

    def cancel_channel(self) -> str:
        """Pub/sub channel: call ids whose running async execution must be cancelled."""
        return f"{self.prefix}:cancel"

    def workers(self, queue: str) -> str:
        """Sorted set: hostnames of the workers consuming ``queue``, scored by last beat
        (epoch seconds); the dispatcher's test for "no worker serves this queue"."""
        return f"{self.prefix}:workers:{queue}"

    def batch(self, batch_id: str) -> str:
        """String: the journal of one act() batch (JSON; no secret values)."""
        return f"{self.prefix}:batch:{batch_id}"

    def open_batches(self) -> str:
        """Hash: batch id -> branch id of every journaled batch not yet fully written."""
        return f"{self.prefix}:batches:open"

    def tool_secrets(self) -> str:
        """Hash: tool name -> JSON list of its secret argument names, as the fleet's workers
        announced at start; how a dispatcher without a tool knows what to hide of its call."""
        return f"{self.prefix}:tools:secret_args"

    def monitor(self) -> str:
        """Hash: worker hostname -> expiry (epoch seconds) of the task-event lease a monitor's
        ``enable_events`` gave it; while one is live, a monitor watches the fleet."""
        return f"{self.prefix}:monitor"

    def dispatcher(self, dispatcher_id: str) -> str:
        """String with a short TTL: present while the dispatcher ``dispatcher_id`` is alive."""
        return f"{self.prefix}:dispatcher:{dispatcher_id}"

    def rate(self, function: str, scope: str) -> str:
        """Hash: the token bucket (tokens, as of when) of ``function``'s rate limit for one
        scope (``toolfleet.schemas.limits.LimitScope.value``); expires once it is full again."""
        return f"{self.prefix}:rate:{function}:{scope}"

    def slots(self, function: str, scope: str) -> str:
        """Sorted set: the call ids holding one of ``function``'s concurrency slots for one
        scope, scored by lease expiry (Redis server time, epoch seconds); a lapsed lease is
        a free slot."""
        return f"{self.prefix}:slots:{function}:{scope}"

    def approval(self, call_id: str) -> str:
        """Hash: a call parked for approval (toolfleet.schemas.approval): what waits, its
        state and, once decided, by whom, when and why."""
        return f"{self.prefix}:approval:{call_id}"

    def approvals(self) -> str:
        """Sorted set: the call ids awaiting approval, scored by when they were parked."""
        return f"{self.prefix}:approvals:waiting"
