import logging

import pytest

from tasks.core.progress import EVERY_S_ENV, Progress, default_every_s, format_bytes, format_duration

LOGGER = logging.getLogger("tests.progress")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    return lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER.name]


def _reporter(clock, total, **options):
    return Progress("encode", total, every_s=options.pop("every_s", 30), logger=LOGGER, clock=clock, **options)


def test_logs_rate_and_eta_at_most_every_interval_then_a_final_line(clock, lines):
    with _reporter(clock, 1000) as reporter:
        for _ in range(13):  # 10 rows every 5 s: lines at 30 s and 60 s
            clock.now += 5
            reporter.update(10)
    assert lines() == [
        "encode: 60/1,000 rows (6.0%), 2 rows/s, ETA 7m50s",
        "encode: 120/1,000 rows (12.0%), 2 rows/s, ETA 7m20s",
        "encode: finished 130/1,000 rows (13.0%) in 1m05s, 2 rows/s",
    ]


def test_update_says_when_it_logged_and_facts_go_on_the_line(clock, lines):
    reporter = _reporter(clock, 400)
    logged = []
    for step in range(1, 9):
        clock.now += 10
        logged.append(reporter.update(50, step=f"{step}/8", loss=0.012345678))
    reporter.close()
    reporter.close()  # the final line is logged once
    assert logged == [False, False, True, False, False, True, False, False]
    assert lines() == [
        "encode: 150/400 rows (37.5%), 5 rows/s, ETA 50s, step=3/8, loss=0.01235",
        "encode: 300/400 rows (75.0%), 5 rows/s, ETA 20s, step=6/8, loss=0.01235",
        "encode: finished 400/400 rows (100.0%) in 1m20s, 5 rows/s, step=8/8, loss=0.01235",
    ]


def test_a_resumed_loop_counts_only_its_own_rate(clock, lines):
    reporter = _reporter(clock, 1000, done=500)
    clock.now += 30
    reporter.update(100)
    assert lines() == ["encode: 600/1,000 rows (60.0%), 3.33 rows/s, ETA 2m00s"]


def test_work_found_done_counts_in_the_share_not_in_the_rate(clock, lines):
    reporter = _reporter(clock, 1000)
    reporter.skip(400)
    clock.now += 20
    reporter.update(100)
    clock.now += 10
    reporter.update(100)
    assert lines() == ["encode: 600/1,000 rows (60.0%), 6.67 rows/s, ETA 1m00s"]


def test_an_unknown_total_has_no_share_or_eta(clock, lines):
    reporter = _reporter(clock, None, unit="lines")
    clock.now += 40
    reporter.update(2000)
    assert lines() == ["encode: 2,000 lines, 50 lines/s"]


def test_a_failed_loop_says_where_it_stopped(clock, lines):
    with pytest.raises(RuntimeError), _reporter(clock, 100) as reporter:
        clock.now += 3
        reporter.update(30)
        raise RuntimeError("boom")
    assert lines() == ["encode: stopped at 30/100 rows (30.0%) in 3.0s, 10 rows/s"]


def test_every_s_zero_logs_every_update(clock, lines):
    reporter = _reporter(clock, 3, every_s=0)
    assert [reporter.update() for _ in range(3)] == [True, True, True]
    assert len(lines()) == 3 and lines()[-1].startswith("encode: 3/3 rows (100.0%)")


def test_a_bar_replaces_the_periodic_lines_not_the_final_one(clock, lines):
    with _reporter(clock, 100, every_s=0, bar=True) as reporter:
        for _ in range(10):
            clock.now += 1
            reporter.update(10, loss=0.5)
    assert lines() == ["encode: finished 100/100 rows (100.0%) in 10s, 10 rows/s, loss=0.5"]


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(EVERY_S_ENV, raising=False)
    assert default_every_s() == 30 and Progress("x").every_s == 30
    monkeypatch.setenv(EVERY_S_ENV, "2.5")
    assert Progress("x").every_s == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(EVERY_S_ENV, bad)
        with pytest.raises(ValueError, match=f"{EVERY_S_ENV}='{bad}'"):
            Progress("x")


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.04, "0.0s"), (4.25, "4.2s"), (42.4, "42s"), (185, "3m05s"), (7620, "2h07m")]
)
def test_durations(seconds, shown):
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(
    ("size", "shown"), [(512, "512 B"), (1536, "1.5 KiB"), (5 * 1024**2, "5.0 MiB"), (3 * 1024**4, "3.0 TiB")]
)
def test_sizes(size, shown):
    assert format_bytes(size) == shown
