"""Where a study's time went, and what a full grid would have cost on the same rig.

Booting and measuring come from each trial's record (tuning/records.py: TrialTimes, modelled
seconds on the emulator); idle is the rest of the run's wall clock (stopping servers, waiting
for their memory, deciding). The grid's cost is every configuration of the space booted once
and measured at the fixed budget: the mean boot of this study's trials, plus, per workload and
level, ``requests x max_tokens`` tokens at the level's mean measured rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.config import StudyConfig
from specsweep.tuning.records import TrialRecord
from specsweep.tuning.workloads import study_workloads


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyTime:
    """One run of a study's time, by what it was spent on."""

    boot_s: float
    measure_s: float
    idle_s: float  # wall clock
    starts: int  # server starts this run
    modelled: bool  # boot and measure in the emulator's modelled seconds
    grid_configurations: int
    grid_requests: int  # per level, the fixed budget the grid is costed at
    grid_s: float | None  # None: nothing measured to cost it from


def study_time(
    trials: Sequence[TrialRecord],
    config: StudyConfig,
    *,
    grid_configurations: int,
    run_wall_s: float,
    trial_wall_s: float,
) -> StudyTime:
    """The time of ``trials`` (this run's server starts) and the grid's estimated cost."""
    timed = [t for t in trials if t.times is not None and t.reused_from is None]
    boot = sum(t.times.boot_s for t in timed if t.times is not None)
    measure = sum(t.times.measure_s for t in timed if t.times is not None)
    modelled = any(t.times.modelled for t in timed if t.times is not None)
    requests = config.measure.requests or config.measure.max_requests
    grid = None
    if timed:
        per_level = []
        for workload in study_workloads(config):
            for level in config.measure.concurrency:
                rates = [
                    row.whole_level_output_tokens_per_s
                    for t in timed
                    if (row := t.results.get(workload, {}).get(level)) and row.whole_level_output_tokens_per_s
                ]
                if rates:
                    per_level.append(requests * config.measure.max_tokens * len(rates) / sum(rates))
        if per_level:
            grid = grid_configurations * (boot / len(timed) + sum(per_level))
    return StudyTime(
        boot_s=boot,
        measure_s=measure,
        idle_s=max(0.0, run_wall_s - trial_wall_s),
        starts=len(timed),
        modelled=modelled,
        grid_configurations=grid_configurations,
        grid_requests=requests,
        grid_s=grid,
    )
