"""Metric series over time: counter growth per interval (resets handled) and gauge samples, from a
sequence of snapshots: a live poll of /metrics, or a Prometheus range turned into snapshots.

Counters (docs/watch.md#the-estimates). Each series (one sample name and one label set) grows
by the difference of its values; one whose value fell or whose ``_created`` sample changed
restarted from zero, and one that first shows up after the first snapshot started from zero
unless its ``_created`` time says it existed before. Growth is summed over label sets,
per-position counters per ``position``.

Gauges. Every snapshot's value of each label set is one sample, standing for the time since the
previous snapshot. Each label set is a batch of its own (a data-parallel engine, an instance), so
its samples are kept apart, never added up across label sets.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specsweep.measurement.counters import position_label
from specsweep.types import CounterNames, MetricsSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesNames:
    """The sample names one engine publishes, as watch reads them (None: not published)."""

    counters: CounterNames
    finished_requests: str | None = None  # a counter of finished requests (any label set)
    running: str | None = None  # gauge: requests in the running batch
    waiting: str | None = None  # gauge: requests queued
    accept_length: str | None = None  # gauge: mean tokens per verification step (SGLang)

    @property
    def counter_names(self) -> tuple[str, ...]:
        """Every counter read, the per-position one last."""
        c = self.counters
        names = (c.generation_tokens, c.prompt_tokens, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens)
        return tuple(n for n in (*names, self.finished_requests, c.accepted_per_position) if n)

    @property
    def gauge_names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.running, self.waiting, self.accept_length) if n)

    def wanted(self) -> tuple[str, ...]:
        """Every sample name to keep from a scrape or to ask Prometheus for, ``_created`` included."""
        counters = self.counter_names
        return (*counters, *(created_name(n) for n in counters), *self.gauge_names)


def created_name(counter: str) -> str:
    """``vllm:generation_tokens_total`` -> ``vllm:generation_tokens_created``."""
    return counter.removesuffix("_total") + "_created"


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """What the server did between two snapshots (times in seconds on the snapshots' clock)."""

    start: float
    end: float
    growth: dict[str, float]  # counter sample name -> growth summed over label sets (absent: not published)
    per_position: tuple[float, ...]  # accepted-per-position growth, position 0 first (empty: not published)
    positions: int  # per-position series present at the end: the draft length the server publishes
    gauges: dict[str, tuple[float, ...]] = field(default_factory=dict)  # gauge -> value per label set at the end
    resets: int = 0  # series of the generation counter that restarted from zero here

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k))


class IntervalReader:
    """Turns snapshots, fed in time order, into Intervals (module doc); keeps each series' last value."""

    def __init__(self, names: SeriesNames) -> None:
        self.names = names
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float | None]] = {}
        self._previous: MetricsSnapshot | None = None
        self._first_time: float | None = None

    def add(self, snapshot: MetricsSnapshot) -> Interval | None:
        """The interval that ends at ``snapshot`` (None for the first one)."""
        before = self._previous
        self._previous = snapshot
        if before is None:
            self._first_time = snapshot.taken_at
            for name in self.names.counter_names:
                created = {_key(lb): v for lb, v in snapshot.values(created_name(name))}
                for labels, value in snapshot.values(name):
                    self._last[(name, _key(labels))] = (value, created.get(_key(labels)))
            return None
        return self._interval(before, snapshot)

    def _interval(self, before: MetricsSnapshot, after: MetricsSnapshot) -> Interval:
        names, per_pos = self.names, self.names.counters.accepted_per_position
        growth: dict[str, float] = {}
        positions: dict[int, float] = {}
        resets = 0
        for name in self.names.counter_names:
            created = {_key(lb): v for lb, v in after.values(created_name(name))}
            found = after.values(name)
            if not found and name not in before.samples:
                continue
            total = 0.0
            for labels, value in found:
                key = (name, _key(labels))
                made = created.get(_key(labels))
                seen = self._last.get(key)
                if seen is None:
                    existed = made is not None and self._first_time is not None and made < self._first_time
                    grew = 0.0 if existed else value
                elif value < seen[0] or (made is not None and seen[1] is not None and made != seen[1]):
                    grew = value
                    resets += name == names.counters.generation_tokens
                else:
                    grew = value - seen[0]
                self._last[key] = (value, made)
                if name == per_pos:
                    position = position_label(labels.get("position", "0"), name)
                    positions[position] = positions.get(position, 0.0) + grew
                else:
                    total += grew
            if name != per_pos:
                growth[name] = total
        gauges = {g: tuple(v for _, v in after.values(g)) for g in names.gauge_names if after.values(g)}
        depth = len({labels.get("position") for labels, _ in after.values(per_pos)}) if per_pos else 0
        return Interval(
            start=before.taken_at,
            end=after.taken_at,
            growth=growth,
            per_position=tuple(positions.get(i, 0.0) for i in range(max(positions) + 1)) if positions else (),
            positions=depth,
            gauges=gauges,
            resets=resets,
        )


def intervals_from_snapshots(snapshots: Sequence[MetricsSnapshot], names: SeriesNames) -> list[Interval]:
    """One Interval per pair of consecutive snapshots (sorted by time), per the module doc."""
    reader = IntervalReader(names)
    found = (reader.add(s) for s in sorted(snapshots, key=lambda s: s.taken_at))
    return [interval for interval in found if interval is not None]


def keep_names(snapshot: MetricsSnapshot, wanted: Sequence[str]) -> MetricsSnapshot:
    """The snapshot with only the samples watch reads (a long poll keeps less)."""
    kept = {name: snapshot.samples[name] for name in wanted if name in snapshot.samples}
    return MetricsSnapshot(taken_at=snapshot.taken_at, samples=kept)
