"""Progress of a long loop, reported through logging (which Airflow captures in the task log).

:class:`Progress` counts work done and logs ``<what>: done/total unit (pct), rate unit/s, ETA`` at most
every ``every_s`` seconds (default ``$HPD_LOG_EVERY_S``, else 30), then a final line. With ``bar=True``
(an interactive terminal) a tqdm bar shows the progress instead of the periodic lines; the final line is
logged all the same::

    with Progress("encode_teacher ingest_date=2026-11-30", total=rows, logger=log) as progress:
        for batch in batches:
            ...
            progress.update(len(batch), loss=loss)  # extra facts go on the line as loss=0.0123

``skip(n)`` counts work an earlier run already did (in the share done, not in the rate); leaving the
``with`` block through an exception logs where the loop stopped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import Any

from tasks.core import settings

EVERY_S_ENV = settings.env_name("log_every_s")

log = logging.getLogger(__name__)


def default_every_s() -> float:
    """Seconds between progress lines: ``$HPD_LOG_EVERY_S`` (a number >= 0), else 30; a wrong value raises
    :class:`~tasks.core.settings.SettingsError` (a ValueError)."""
    return settings.current().log_every_s


def format_duration(seconds: float) -> str:
    """``4.2s``, ``42s``, ``3m05s``, ``2h07m``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def format_bytes(size: int) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    if size < 1024:
        return f"{size} B"
    value, unit = size / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


@dataclass
class Progress:
    """Counts ``unit`` done out of ``total`` (None: unknown) and logs the rate and ETA every ``every_s``
    seconds; ``done`` is where a resumed loop starts (the rate counts only what this run does)."""

    what: str
    total: int | None = None
    _: KW_ONLY
    unit: str = "rows"
    done: int = 0
    every_s: float = field(default_factory=default_every_s)
    bar: bool = False
    logger: logging.Logger = log
    clock: Callable[[], float] = time.monotonic
    _start: float = field(init=False)
    _last: float = field(init=False)
    _initial: int = field(init=False)
    _facts: dict[str, object] = field(init=False, default_factory=dict)
    _bar: Any = field(init=False, default=None)
    _closed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._start = self._last = self.clock()
        self._initial = self.done
        if self.bar:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, initial=self.done, desc=self.what, unit=" " + self.unit)

    def update(self, n: int = 1, **facts: object) -> bool:
        """Count ``n`` more; ``facts`` (loss=..., step=...) go on the next line. True when the progress was
        shown (a line logged, or the bar redrawn)."""
        self.done += n
        self._facts = facts
        if self._bar is not None:
            if facts:
                self._bar.set_postfix({k: _number(v) for k, v in facts.items()}, refresh=False)
            return bool(self._bar.update(n))
        now = self.clock()
        if now - self._last < self.every_s:
            return False
        self._last = now
        self.logger.info("%s: %s", self.what, self._status(now))
        return True

    def skip(self, n: int) -> None:
        """Count ``n`` found already done (a part an earlier run did): in the share done, not in the rate."""
        self.done += n
        self._initial += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self, failed: bool = False) -> None:
        """Log the final line (once): what was done, in how long, at what rate."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elapsed = self.clock() - self._start
        outcome = f"stopped at {self._count()}" if failed else f"finished {self._count()}"
        rate = (self.done - self._initial) / elapsed if elapsed > 0 else math.nan
        tail = f", {_rate(rate)} {self.unit}/s" if math.isfinite(rate) else ""
        self.logger.info("%s: %s in %s%s%s", self.what, outcome, format_duration(elapsed), tail, self._fact_text())

    def _count(self) -> str:
        if self.total is None:
            return f"{self.done:,} {self.unit}"
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        return f"{self.done:,}/{self.total:,} {self.unit}{share}"

    def _status(self, now: float) -> str:
        elapsed = now - self._start
        rate = (self.done - self._initial) / elapsed if elapsed > 0 else 0.0
        status = f"{self._count()}, {_rate(rate)} {self.unit}/s"
        if self.total is not None:
            left = max(self.total - self.done, 0)
            status += f", ETA {format_duration(left / rate) if rate > 0 else '?'}"
        return status + self._fact_text()

    def _fact_text(self) -> str:
        return "".join(f", {name}={_number(value)}" for name, value in self._facts.items())

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close(failed=kind is not None)
