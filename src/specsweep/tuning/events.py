"""What a study reports while it runs, one record per event (the CLI prints them).

Measurement progress inside a trial arrives as :class:`TrialProgress`, which wraps runtime's
measurement events (``WarmingUp``, ``LevelStarted``, ``RequestDone``) with the trial and workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from specsweep.runtime.measure import MeasureEvent
from specsweep.types import BootFacts, Configuration, LevelFigures


@dataclass(frozen=True, slots=True, kw_only=True)
class Note:
    """Something the user should know that is not a trial's result."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """The search chose the next configuration, or says why it stops (None)."""

    phase: str
    reason: str
    configuration: Configuration | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartsLeft:
    """Before a server start: it is start ``starts + 1`` of at most ``cap``; about ``expected`` in
    all, which leaves about ``left_s``."""

    starts: int
    cap: int
    expected: int | None  # None: not known yet (before the search values any start)
    left_s: float | None  # None: not known yet
    start_s: float | None  # a start's mean cost so far (None: none timed yet)
    modelled: bool  # the times in the emulator's modelled seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialStarting:
    trial: int
    configuration: Configuration


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialReady:
    trial: int
    startup_s: float
    boot: BootFacts


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuringWorkload:
    trial: int
    workload: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialProgress:
    """A measurement event (runtime.measure) of one workload in one trial."""

    trial: int
    workload: str
    event: MeasureEvent


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialDone:
    trial: int
    value: float
    configuration: Configuration
    results: dict[str, dict[int, LevelFigures]]
    boot_s: float | None = None  # what this start's boot took
    measure_s: float | None = None
    modelled: bool = False  # both in the emulator's modelled seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialFailed:
    trial: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialReused:
    """A duplicate of a configuration measured before: its figures were copied, no start."""

    trial: int
    source: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredElsewhere:
    """Another worker of a shared study measures this configuration."""

    trial: int
    source: int
    worker: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """Other workers measure what is left; this one waits for them."""

    trials: tuple[int, ...]


# What a study reports while it runs.
StudyEvent = (
    Note
    | Planned
    | StartsLeft
    | TrialStarting
    | TrialReady
    | MeasuringWorkload
    | TrialProgress
    | TrialDone
    | TrialFailed
    | TrialReused
    | MeasuredElsewhere
    | Waiting
)
