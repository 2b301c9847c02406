"""Live ``watch``: a poll's snapshots in, intervals kept, the estimates of the windows so far out.

Windows run from the first snapshot in steps of ``--window``; the last one is the window under
way. Finished windows are analysed once and kept; the one under way and the whole span are
analysed again at each refresh. Only intervals are kept, not snapshots (a day at one poll a
second is 86,400 small records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from specsweep.engines.registry import EngineInfo
from specsweep.errors import FitError
from specsweep.measurement.series import Interval, IntervalReader
from specsweep.runtime.poll import PollMissed
from specsweep.types import MetricsSnapshot
from specsweep.watch.engines import detect_engine, series_names
from specsweep.watch.windows import WatchReport, WatchSettings, WindowReport, analyse_windows


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveUpdate:
    """What one poll added: the interval it closed (None after a missed scrape) and the report so far."""

    interval: Interval | None
    report: WatchReport | None
    missed: PollMissed | None = None


class LiveWatch:
    """Feeds a poll's snapshots to the analysis (see the module doc)."""

    def __init__(
        self, make_settings: Callable[[EngineInfo], WatchSettings], *, engine: str | None, source: str
    ) -> None:
        self._make_settings = make_settings
        self._engine = engine
        self._source = source
        self.settings: WatchSettings | None = None
        self._reader: IntervalReader | None = None
        self.intervals: list[Interval] = []
        self.start: float | None = None
        self.last_report: WatchReport | None = None
        self._cache: dict[tuple[float, float, int], WindowReport] = {}

    def wanted(self, first: MetricsSnapshot) -> list[str]:
        """From the first scrape: the engine, the settings, and the sample names to keep."""
        info = detect_engine(set(first.samples), self._engine, source=self._source)
        self.settings = self._make_settings(info)
        names = series_names(info)
        self._reader = IntervalReader(names)
        return list(names.wanted())

    def add(self, event: MetricsSnapshot | PollMissed) -> LiveUpdate:
        """One poll's snapshot (or its failure): the interval it closes and the estimates so far."""
        if isinstance(event, PollMissed):
            return LiveUpdate(interval=None, report=self.last_report, missed=event)
        assert self._reader is not None and self.settings is not None
        if self.start is None:
            self.start = event.taken_at
        interval = self._reader.add(event)
        if interval is None:
            return LiveUpdate(interval=None, report=None)
        self.intervals.append(interval)
        self.last_report = self.report(end=event.taken_at)
        return LiveUpdate(interval=interval, report=self.last_report)

    def report(self, *, end: float | None = None) -> WatchReport | None:
        """The windows from the first snapshot to ``end`` (the last interval's end by default)."""
        if not self.intervals or self.settings is None or self.start is None:
            return None
        end = end if end is not None else self.intervals[-1].end
        try:
            return analyse_windows(self.intervals, self.settings, start=self.start, end=end, cache=self._cache)
        except FitError:
            return self.last_report

    def with_settings(self, **changes: Any) -> None:
        if self.settings is not None:
            self.settings = replace(self.settings, **changes)
