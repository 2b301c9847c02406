"""Run-to-run noise: how much one configuration's measured rate moves from one server start to the next.

A configuration measured in two or more server starts gives, per workload and concurrency level,
a few rates of the same thing. Their spread on the log scale, pooled over every repeated
configuration and level of a workload (degrees of freedom: the repeats minus one per group), is
the workload's run-to-run relative sd: what a difference between two configurations measured
once each must exceed to mean something. It holds everything that moves between starts (the
measurement's own error, the engine's state after boot, drift and other tenants), which a fit's
residuals across draft lengths cannot tell apart from misfit, and differences between workloads
are never part of it.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.types import MeasuredConfig

MIN_RELATIVE_SD = 0.01  # a sd from a handful of repeats below this is luck (the measurement alone is ~1.5% off)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNoise:
    """One workload's run-to-run relative sd, and what it rests on."""

    workload: str
    relative_sd: float  # floored at MIN_RELATIVE_SD
    df: int  # degrees of freedom: repeated measurements minus one per (configuration, level)
    repeated: int  # configurations measured in more than one server start

    def separating_starts(self, difference: float, *, z: float = 2.8) -> int:
        """Server starts of each of two configurations that separate a relative ``difference``
        (z = 2.8: a two-sided 5% test with 80% power)."""
        if difference <= 0:
            return 0
        return max(1, math.ceil(2 * (z * self.relative_sd / difference) ** 2))


def run_to_run_noise(configs: Sequence[MeasuredConfig], workload: str) -> RunNoise | None:
    """The run-to-run relative sd of ``workload`` from configurations measured more than once
    (None: no configuration was)."""
    groups: dict[tuple[str, int], list[float]] = {}
    for config in configs:
        if not config.feasible:
            continue
        for level, row in config.results.get(workload, {}).items():
            if row.output_tokens_per_s and row.output_tokens_per_s > 0:
                groups.setdefault((config.key, level), []).append(math.log(row.output_tokens_per_s))
    squares, df = 0.0, 0
    repeated = set()
    for (key, _), logs in groups.items():
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
        repeated.add(key)
    if df == 0:
        return None
    return RunNoise(
        workload=workload, relative_sd=max(math.sqrt(squares / df), MIN_RELATIVE_SD), df=df, repeated=len(repeated)
    )
