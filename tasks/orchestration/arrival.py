"""Waiting for a partition's raw data: a deferrable sensor whose trigger polls the store from the triggerer
(no worker slot is held while it waits) and fails clearly when nothing arrives in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Literal

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from airflow.triggers.base import BaseTrigger, TriggerEvent
from pydantic import BaseModel

from tasks.core.uris import redact


class Arrival(BaseModel):
    """What the trigger reports: raw data ``arrived`` at ``source`` (``files`` of them), or a ``timeout``."""

    status: Literal["arrived", "timeout"]
    source: str
    files: int | None = None

    def event(self) -> TriggerEvent:
        return TriggerEvent(self.model_dump(exclude_none=True))


class ArrivalParams(BaseModel):
    """The run's param the wait reads (the others are the stage's)."""

    arrival_timeout_h: float

    @classmethod
    def of(cls, context: Any) -> ArrivalParams:
        return cls.model_validate(context["params"])


def arrived(source: str) -> list[str]:
    """The raw files at ``source`` (one object, or the visible objects under a prefix); [] while none."""
    from tasks.core.sources import CorpusInputError, source_uris

    try:
        return source_uris(source)
    except CorpusInputError:
        return []


class SourceArrivalTrigger(BaseTrigger):
    """Polls ``source`` every ``poll_s`` seconds until raw files are there or ``deadline`` (epoch seconds) passes."""

    def __init__(self, source: str, poll_s: float, deadline: float) -> None:
        super().__init__()
        self.source, self.poll_s, self.deadline = source, poll_s, deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            "source": self.source,
            "poll_s": self.poll_s,
            "deadline": self.deadline,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            if found := await asyncio.to_thread(arrived, self.source):
                yield Arrival(status="arrived", source=self.source, files=len(found)).event()
                return
            if time.time() >= self.deadline:
                yield Arrival(status="timeout", source=self.source).event()
                return
            await asyncio.sleep(min(self.poll_s, max(self.deadline - time.time(), 0.0)))


class WaitForSource(BaseOperator):
    """Succeeds (returning the resolved source) once the run's partition has raw data at its ``source`` param,
    resolved for the partition's date; defers to the triggerer meanwhile; fails after ``params.arrival_timeout_h``."""

    def __init__(self, *, poll_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_s = poll_s

    def execute(self, context: Any) -> str:
        source = _resolved_source(context)
        if found := arrived(source):
            self.log.info("raw data for the partition is there: %s (%d file(s))", redact(source), len(found))
            return source
        wait = timedelta(hours=ArrivalParams.of(context).arrival_timeout_h)
        self.log.info("waiting up to %s for raw data at %s (polling every %ss)", wait, redact(source), self.poll_s)
        self.defer(
            trigger=SourceArrivalTrigger(source, self.poll_s, time.time() + wait.total_seconds()),
            method_name="execute_complete",
        )
        raise AssertionError("unreachable: defer() raises")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> str:
        arrival = Arrival.model_validate(event)
        if arrival.status != "arrived":
            hours = ArrivalParams.of(context).arrival_timeout_h
            raise AirflowFailException(
                f"no raw data arrived at {redact(arrival.source)} within {hours} h (arrival_timeout_h)"
            )
        self.log.info("raw data arrived at %s (%d file(s))", redact(arrival.source), arrival.files)
        return arrival.source


def _resolved_source(context: Any) -> str:
    from tasks.core.sources import resolve_source
    from tasks.orchestration import runtime

    params = runtime.staging_params(context)
    return resolve_source(params.source, params.ingest_date)
