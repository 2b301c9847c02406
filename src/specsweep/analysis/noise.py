"""Run-to-run noise: how much one configuration's measured step time moves from one server start to the next.

Two kinds of evidence, per workload and concurrency level, on the log scale of step times:

- **Repeats.** A configuration measured in two or more server starts gives a few measurements
  of the same thing; their spread around their mean (one degree of freedom per start beyond
  the first).
- **Sibling pairs.** One drafter's two draft methods (greedy and probabilistic) at the same k
  run the same steps: the draft and verify passes are the same, and sampling the drafts
  stochastically costs the same share of a step whatever k is. Their step times differ by one
  factor per level, so where both were measured at several draft lengths, the spread of their
  log ratios around the mean ratio is run-to-run noise too (one degree of freedom per draft
  length beyond the first). Were the factor not the same at every k, the misfit would only
  widen the estimate.

The pooled spread is the workload's run-to-run relative sd: what a difference between two
configurations measured once each must exceed to mean something. It holds everything that moves
between starts (the measurement's own error, the engine's state after boot, drift and other
tenants), which a fit's residuals across draft lengths cannot tell apart from misfit, and
differences between workloads are never part of it. Sibling pairs matter most when one start
was unlucky: a configuration measured once in a slow start looks far behind its sibling at the
same k, and that spread is the evidence that it is noise, not the configuration.

Degrees of freedom are counted once per server start, not once per level: every level of one
start shares that start's variation, so a start measured at two levels is not two independent
draws. The degrees of freedom are those of the level with the most.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.analysis.drafters import Drafter
from specsweep.analysis.throughput import study_observations
from specsweep.types import MeasuredConfig

MIN_RELATIVE_SD = 0.01  # a sd from a handful of repeats below this is luck (the measurement alone is ~1.5% off)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNoise:
    """One workload's run-to-run relative sd, and what it rests on."""

    workload: str
    relative_sd: float  # floored at MIN_RELATIVE_SD
    df: int  # degrees of freedom: independent server starts beyond what the means and ratios used
    repeated: int  # configurations measured in more than one server start
    sibling_pairs: int = 0  # draft lengths where both draft methods of one drafter were measured

    def separating_starts(self, difference: float, *, z: float = 2.8) -> int:
        """Server starts of each of two configurations that separate a relative ``difference``
        (z = 2.8: a two-sided 5% test with 80% power)."""
        if difference <= 0:
            return 0
        return max(1, math.ceil(2 * (z * self.relative_sd / difference) ** 2))

    @property
    def basis(self) -> str:
        """What the estimate rests on, in words."""
        parts = []
        if self.repeated:
            parts.append(f"{self.repeated} repeated configuration{'s' if self.repeated > 1 else ''}")
        if self.sibling_pairs:
            parts.append(f"{self.sibling_pairs} greedy/probabilistic pair{'s' if self.sibling_pairs > 1 else ''}")
        return f"{' and '.join(parts)}, {self.df} degree{'s' if self.df != 1 else ''} of freedom"


@dataclass(slots=True)
class _Level:
    squares: float = 0.0
    df: int = 0


def run_to_run_noise(configs: Sequence[MeasuredConfig], workload: str) -> RunNoise | None:
    """The run-to-run relative sd of ``workload`` from repeats and sibling pairs (None: neither was measured)."""
    cells: dict[tuple[int, Drafter | None, int], list[float]] = {}
    for o in study_observations([c for c in configs if c.feasible], workload):
        cells.setdefault((o.concurrency, o.drafter, o.num_speculative_tokens), []).append(math.log(o.step_time_s))
    levels: dict[int, _Level] = {}
    repeated: set[tuple[Drafter | None, int]] = set()
    for (level, drafter, k), logs in cells.items():
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        row = levels.setdefault(level, _Level())
        row.squares += sum((x - mean) ** 2 for x in logs)
        row.df += len(logs) - 1
        repeated.add((drafter, k))
    pairs: set[tuple[str, int]] = set()
    for (level, method), ratios in _sibling_ratios(cells).items():
        if len(ratios) < 2:
            continue
        # Weighted mean of the log ratios (weight: 1 / its variance in units of one start's).
        total = sum(1 / v for _, _, v in ratios)
        mean = sum(d / v for _, d, v in ratios) / total
        row = levels.setdefault(level, _Level())
        row.squares += sum((d - mean) ** 2 / v for _, d, v in ratios)
        row.df += len(ratios) - 1
        pairs.update((method, k) for k, _, _ in ratios)
    used = [row for row in levels.values() if row.df > 0]
    if not used:
        return None
    sd = math.sqrt(sum(r.squares for r in used) / sum(r.df for r in used))
    return RunNoise(
        workload=workload,
        relative_sd=max(sd, MIN_RELATIVE_SD),
        df=max(r.df for r in used),
        repeated=len(repeated),
        sibling_pairs=len(pairs),
    )


def _sibling_ratios(
    cells: dict[tuple[int, Drafter | None, int], list[float]],
) -> dict[tuple[int, str], list[tuple[int, float, float]]]:
    """Per (level, drafter method): (k, log step-time ratio of probabilistic over greedy, its
    variance in units of one start's) at every k where both draft methods were measured."""
    out: dict[tuple[int, str], list[tuple[int, float, float]]] = {}
    for (level, drafter, k), greedy in cells.items():
        if drafter is None or drafter.draft_sample_method != "greedy":
            continue
        other = cells.get((level, Drafter(method=drafter.method, draft_sample_method="probabilistic"), k))
        if not other:
            continue
        ratio = sum(other) / len(other) - sum(greedy) / len(greedy)
        out.setdefault((level, drafter.method), []).append((k, ratio, 1 / len(other) + 1 / len(greedy)))
    return out
