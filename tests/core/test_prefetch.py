import threading

import pytest

from tasks.core.prefetch import read_ahead


def test_results_come_in_order_of_the_items():
    assert list(read_ahead(range(7), lambda i: i * i)) == [i * i for i in range(7)]


def test_the_next_item_loads_while_the_caller_works_on_this_one():
    second_loading = threading.Event()

    def load(i: int) -> int:
        if i == 1:
            second_loading.set()
        return i

    for i in read_ahead([0, 1, 2], load):
        if i == 0:  # the caller is still on item 0: item 1 is being read meanwhile
            assert second_loading.wait(timeout=10)


@pytest.mark.parametrize("ahead", [1, 3])
def test_at_most_ahead_loads_run_beyond_the_current_item(ahead):
    started = []
    results = read_ahead(range(20), lambda i: started.append(i) or i, ahead=ahead)
    assert next(results) == 0
    threading.Event().wait(0.2)  # time for loads that should not start to start
    assert len(started) <= ahead + 1
    results.close()


def test_an_error_is_raised_where_its_result_is_reached_and_later_loads_do_not_run():
    loaded = []

    def load(i: int) -> int:
        loaded.append(i)
        if i == 2:
            raise ValueError("shard 2 is corrupt")
        return i

    results = read_ahead(range(10), load)
    assert [next(results), next(results)] == [0, 1]
    with pytest.raises(ValueError, match="shard 2 is corrupt"):
        next(results)
    assert max(loaded) <= 3


def test_ahead_below_one_is_refused():
    with pytest.raises(ValueError, match="ahead must be at least 1"):
        next(read_ahead([1], lambda i: i, ahead=0))
