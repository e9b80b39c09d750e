"""Reading ahead: the next item is loaded in a background thread while the caller works on the current one."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def read_ahead(items: Iterable[T], load: Callable[[T], R], ahead: int = 1) -> Iterator[R]:
    """``load(item)`` of each item, in order, with up to ``ahead`` loads running in one background thread while
    the caller works on the current result, so that reading, decompressing and verifying (which release the GIL)
    overlap the caller's compute. At most ``ahead + 1`` results are held at once. A load's error is raised where
    its result is reached; loads not started when the caller stops are cancelled."""
    if ahead < 1:
        raise ValueError(f"ahead must be at least 1, not {ahead}")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpd-read-ahead")
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(load, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
