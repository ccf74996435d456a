"""The generic failure-capturing execution event (ADR-0012 D1)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr

from toolfleet.schemas.execution import Execution
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.status import EventStatus

__all__ = ["Event"]


class Event(ToolfleetModel):
    """One execution attempt whose outcome is data, not an exception.

    ``invoke()`` runs only from PENDING. An ordinary ``Exception`` ends the event
    FAILED and is not re-raised; a ``BaseException`` outside ``Exception``
    (cancellation) ends it CANCELLED and propagates.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    execution: Execution = Field(default_factory=Execution)
    streaming: bool = Field(default=False, exclude=True)

    _completion_event: asyncio.Event | None = PrivateAttr(default=None)

    @property
    def status(self) -> EventStatus:
        return self.execution.status

    @status.setter
    def status(self, value: EventStatus) -> None:
        value = EventStatus(value)  # a plain "completed" must still signal completion
        self.execution.status = value
        if value.is_terminal and self._completion_event is not None:
            self._completion_event.set()

    @property
    def response(self) -> Any:
        return self.execution.response

    @property
    def completion_event(self) -> asyncio.Event:
        """Set once the event reaches a terminal status; created on first access."""
        if self._completion_event is None:
            self._completion_event = asyncio.Event()
            if self.status.is_terminal:
                self._completion_event.set()
        return self._completion_event

    async def _invoke(self) -> Any:
        raise NotImplementedError("subclasses of Event implement _invoke()")

    async def invoke(self) -> None:
        if self.status is not EventStatus.PENDING:
            return
        self.status = EventStatus.PROCESSING
        start = time.perf_counter()
        try:
            response = await self._invoke()
        except Exception as exc:
            self.execution.duration = time.perf_counter() - start
            self.execution.add_error(exc)
            self.status = EventStatus.FAILED
        except BaseException as exc:
            self.execution.duration = time.perf_counter() - start
            self.execution.add_error(exc)
            self.status = EventStatus.CANCELLED
            raise
        else:
            self.execution.duration = time.perf_counter() - start
            self.execution.response = response
            self.status = EventStatus.COMPLETED

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at.isoformat(),
            "execution": self.execution.to_dict(),
        }
