"""Load the next item in a background thread while the caller works on the current one.

A stage that reads shard after shard and computes on each (fit-pca's moments, its projected targets)
otherwise waits for every read, checksum included, with a core idle; reading one shard ahead overlaps
the read (Arrow's decoding and sha256 both release the GIL) with the caller's work. At most two loaded
items are alive at once: the one the caller holds and the one being loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Loaded = TypeVar("Loaded")


def ahead(items: Iterable[Item], load: Callable[[Item], Loaded]) -> Iterator[tuple[Item, Loaded]]:
    """Each item with ``load(item)``, in order, the next one loading while the caller holds this one. An
    error of ``load`` is raised where its item would have been yielded; closing the iterator early waits for
    the load in flight and drops it."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpd-prefetch") as pool:
        pending: tuple[Item, Future[Loaded]] | None = None
        for item in items:
            submitted = (item, pool.submit(load, item))
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = submitted
        if pending is not None:
            yield pending[0], pending[1].result()
