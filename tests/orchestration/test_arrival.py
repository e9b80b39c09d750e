import asyncio
import threading
import time

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tasks.core import storage
from tasks.orchestration.arrival import SourceArrivalTrigger, WaitForSource, arrived


def _first_event(trigger: SourceArrivalTrigger) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_the_trigger_fires_when_raw_files_arrive_under_the_prefix(tmp_path):
    prefix = tmp_path / "raw" / "2026-11-02"
    source = storage.to_uri(str(prefix))
    assert arrived(source) == []

    def land():
        time.sleep(0.3)
        prefix.mkdir(parents=True)
        (prefix / "part-1.txt").write_text("a sentence\n")

    threading.Thread(target=land).start()
    start = time.monotonic()
    event = _first_event(SourceArrivalTrigger(source, poll_s=0.05, deadline=time.time() + 30))
    assert event == {"status": "arrived", "source": source, "files": 1}
    assert time.monotonic() - start < 5


def test_the_trigger_times_out_and_the_operator_fails_clearly(tmp_path):
    source = storage.to_uri(str(tmp_path / "never"))
    event = _first_event(SourceArrivalTrigger(source, poll_s=0.05, deadline=time.time() + 0.2))
    assert event == {"status": "timeout", "source": source}
    trigger = SourceArrivalTrigger(source, poll_s=1, deadline=5.0)
    assert trigger.serialize() == (
        "tasks.orchestration.arrival.SourceArrivalTrigger",
        {"source": source, "poll_s": 1, "deadline": 5.0},
    )
    operator = WaitForSource(task_id="wait_for_source")
    with pytest.raises(AirflowFailException, match=r"no raw data arrived at .*/never within 0.5 h"):
        operator.execute_complete({"params": {"arrival_timeout_h": 0.5}}, event)
