import threading

import pytest

from tasks.core import prefetch


def test_yields_every_item_with_its_load_in_order():
    assert list(prefetch.ahead([3, 1, 2], lambda n: n * 10)) == [(3, 30), (1, 10), (2, 20)]


def test_the_next_item_loads_while_the_caller_holds_this_one():
    started = {n: threading.Event() for n in range(3)}

    def load(n: int) -> int:
        started[n].set()
        return n

    items = prefetch.ahead(range(3), load)
    assert next(items) == (0, 0)
    assert started[1].wait(5)  # loaded in the background before the caller asks for it
    assert not started[2].is_set()  # but never more than one ahead
    assert list(items) == [(1, 1), (2, 2)]


def test_a_load_error_is_raised_at_its_item_after_the_items_before_it():
    def load(n: int) -> int:
        if n == 1:
            raise ValueError("shard 1 is corrupt")
        return n

    items = prefetch.ahead(range(3), load)
    assert next(items) == (0, 0)
    with pytest.raises(ValueError, match="shard 1 is corrupt"):
        next(items)


def test_closing_early_waits_for_the_load_in_flight():
    finished = []
    release = threading.Event()

    def load(n: int) -> int:
        if n == 1:
            release.wait(5)
        finished.append(n)
        return n

    items = prefetch.ahead(range(5), load)
    assert next(items) == (0, 0)
    release.set()
    items.close()
    assert finished == [0, 1]


def test_no_items_no_loads():
    assert list(prefetch.ahead([], lambda n: pytest.fail("loaded"))) == []
