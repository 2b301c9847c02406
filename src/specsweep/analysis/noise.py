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

- **Step-time lines.** One drafter measured at three or more draft lengths: where their mean step
  times fit a line in k (their misses' chi-square below its 95th percentile at the noise the
  rest of the evidence shows, pooled with the engine's usual noise), the misses are run-to-run
  noise, K - 2 degrees of freedom per level; a line they misfit is shape (captured graph sizes,
  drafting only where text matches) and is left out. A drafter that looks its drafts up in the
  text (the engine's ``looks_up``) gives no line at all: its step time follows where the text
  matches, and a line its few points happen to fit would pass that shape off as noise.

Before any of these exists, and pooled with them as its degrees of freedom, the engine's usual noise
(a ``RunNoisePrior``: what starts of that engine usually vary by, an assumption the study's own
starts take over from). Never below the starts' own request spread: each level keeps its rate's
relative standard error from its requests (``LevelFigures.relative_se``), and a start cannot be
steadier than its own requests.

The pooled spread is the workload's run-to-run relative sd: what a difference between two
configurations measured once each must exceed to mean something. It holds everything that moves
between starts (the measurement's own error, the engine's state after boot, drift and other
tenants), which a fit's residuals across draft lengths cannot tell apart from misfit, and
differences between workloads are never part of it. Sibling pairs matter most when one start
was unlucky: a configuration measured once in a slow start looks far behind its sibling at the
same k, and that spread is the evidence that it is noise, not the configuration.

Degrees of freedom: each level gives its own (the starts and ratios beyond their means), but
levels measured in the same starts share those starts' variation. Where a slow start is slow at
every level (the residuals of one start alike across levels, correlation rho), pooling L levels
adds little: the pooled sum of squares has df / (1 + (L - 1) rho^2) degrees of freedom, never
fewer than the level with the most. Where the levels' residuals are unrelated (noise that comes
from the requests, not the start), the levels' degrees of freedom add up.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from scipy import stats

from specsweep.analysis.drafters import Drafter, lookup_drafters
from specsweep.analysis.throughput import LINE_FIT_LEVEL, study_observations
from specsweep.types import MeasuredConfig, RunNoisePrior, SpeculativeConfig

MIN_RELATIVE_SD = 0.01  # a sd from a handful of repeats below this is luck (the measurement alone is ~1.5% off)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNoise:
    """One workload's run-to-run relative sd, and what it rests on."""

    workload: str
    relative_sd: float  # floored at MIN_RELATIVE_SD and at the starts' own request spread
    df: int  # effective degrees of freedom of the measured part (levels that share starts count less)
    repeated: int  # configurations measured in more than one server start
    sibling_pairs: int = 0  # draft lengths where both draft methods of one drafter were measured
    lines: int = 0  # drafters' step-time lines (per level) whose three or more draft lengths fit them
    level_correlation: float = 0.0  # how alike the levels' residuals are in the starts they share
    prior: RunNoisePrior | None = None  # the engine's usual noise, pooled in with its weight
    within: float | None = None  # the starts' own relative se from their requests' spread (mean over levels)

    def separating_starts(self, difference: float, *, z: float = 2.8) -> int:
        """Server starts of each of two configurations that separate a relative ``difference``
        (z = 2.8: a two-sided 5% test with 80% power)."""
        if difference <= 0:
            return 0
        return max(1, math.ceil(2 * (z * self.relative_sd / difference) ** 2))

    @property
    def measured(self) -> bool:
        """Whether the study's own starts (repeats or sibling pairs) measured it, not the prior alone."""
        return self.df > 0

    @property
    def basis(self) -> str:
        """What the estimate rests on, in words."""
        parts = []
        if self.repeated:
            parts.append(f"{self.repeated} repeated configuration{'s' if self.repeated > 1 else ''}")
        if self.sibling_pairs:
            parts.append(f"{self.sibling_pairs} greedy/probabilistic pair{'s' if self.sibling_pairs > 1 else ''}")
        if self.lines:
            parts.append(f"{self.lines} step-time line{'s' if self.lines > 1 else ''}")
        text = f"{' and '.join(parts)}, {self.df} degree{'s' if self.df != 1 else ''} of freedom" if parts else ""
        if self.prior is not None:
            usual = f"the engine's usual {100 * self.prior.relative_sd:.0f}% ({self.prior.source})"
            text = f"{text}, with {usual}" if text else usual
        if self.within is not None and self.within >= self.relative_sd:
            text += f"; no less than its starts' own request spread ({100 * self.within:.1f}%)"
        return text


@dataclass(slots=True)
class _Level:
    squares: float = 0.0
    df: int = 0
    # per unit (a server start, or a sibling pair at one k): its residual in units of one start's sd
    residuals: dict[Hashable, float] = field(default_factory=dict)


Cells = dict[tuple[Drafter | None, int], dict[int, list[tuple[int, float]]]]  # (drafter, k) -> level -> (trial, log T)


def run_to_run_noise(
    configs: Sequence[MeasuredConfig],
    workload: str,
    prior: RunNoisePrior | None = None,
    *,
    looks_up: Callable[[SpeculativeConfig], bool] | None = None,
) -> RunNoise | None:
    """The run-to-run relative sd of ``workload`` from repeats and sibling pairs, pooled with the
    engine's ``prior`` as that many degrees of freedom, never below the starts' own request
    spread (None: neither measured, and no prior). ``looks_up``: the engine's rule for drafters
    that look their drafts up; their step time is no line in k, so their lines are no evidence."""
    lookups = lookup_drafters((c.spec for c in configs), looks_up)
    cells: Cells = {}
    within: list[float] = []
    for config in configs:
        if not config.feasible:
            continue
        within += [r.relative_se for r in config.results.get(workload, {}).values() if r.relative_se]
        for o in study_observations([config], workload):
            at = cells.setdefault((o.drafter, o.num_speculative_tokens), {}).setdefault(o.concurrency, [])
            at.append((config.trial, math.log(o.step_time_s)))
    levels: dict[int, _Level] = {}
    repeated: set[tuple[Drafter | None, int]] = set()
    for key, by_level in cells.items():
        for level, points in by_level.items():
            if len(points) < 2:
                continue
            mean = sum(x for _, x in points) / len(points)
            row = levels.setdefault(level, _Level())
            row.squares += sum((x - mean) ** 2 for _, x in points)
            row.df += len(points) - 1
            row.residuals.update((("start", trial), x - mean) for trial, x in points)
            repeated.add(key)
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
        row.residuals.update((("pair", method, k), (d - mean) / math.sqrt(v)) for k, d, v in ratios)
        pairs.update((method, k) for k, _, _ in ratios)
    candidates = {}
    for (drafter, level), line_points in _line_points(cells).items():
        if drafter in lookups:
            continue  # a line through them, fitting or not, says nothing of the noise
        misses = _line_misses(line_points)
        if misses is not None:
            candidates[(drafter, level)] = (misses, len(line_points) - 2)
    # A line its points misfit (step-shaped times, drafting only where text matches) is not noise;
    # it misfits at the noise the rest of the evidence shows, not at the prior alone (testing at
    # the prior would keep only the lines that happen to be steady, and the estimate would be
    # biased low wherever starts vary more than the prior says). The lines kept raise that noise,
    # so the test runs again until the kept set stops changing.
    kept: set[tuple[Drafter, int]] = set()
    for _ in range(len(candidates) + 1):
        reference = _pooled_sd(levels, candidates, kept, prior)
        fitting = {
            key
            for key, (misses, df) in candidates.items()
            if reference is None
            or sum(m * m for m in misses.values()) <= reference**2 * float(stats.chi2.ppf(LINE_FIT_LEVEL, df))
        }
        if fitting == kept:
            break
        kept = fitting
    for key in kept:
        misses, df = candidates[key]
        row = levels.setdefault(key[1], _Level())
        row.squares += sum(m * m for m in misses.values())
        row.df += df
        row.residuals.update((("line", key[0], k), m) for k, m in misses.items())
    lines = len(kept)
    used = [row for row in levels.values() if row.df > 0]
    if not used and prior is None:
        return None
    own = math.sqrt(sum(w * w for w in within) / len(within)) if within else None
    effective, rho, variance = 0, 0.0, 0.0
    if used:
        df = sum(r.df for r in used)
        variance = sum(r.squares for r in used) / df
        # Levels measured in the same starts share those starts' variation: their sums of squares are
        # correlated by rho^2 and carry df / (1 + (L - 1) rho^2) degrees of freedom, not df.
        rho = _level_correlation(used)
        effective = max(*(r.df for r in used), round(df / (1 + (len(used) - 1) * rho**2)))
    if prior is not None:
        variance = (prior.df * prior.relative_sd**2 + effective * variance) / (prior.df + effective)
    return RunNoise(
        workload=workload,
        relative_sd=max(math.sqrt(variance), own or 0.0, MIN_RELATIVE_SD),
        df=effective,
        repeated=len(repeated),
        sibling_pairs=len(pairs),
        lines=lines,
        level_correlation=rho,
        prior=prior,
        within=own,
    )


def _pooled_sd(
    levels: dict[int, _Level],
    candidates: dict[tuple[Drafter, int], tuple[dict[int, float], int]],
    kept: set[tuple[Drafter, int]],
    prior: RunNoisePrior | None,
) -> float | None:
    """The relative sd of the repeats, sibling pairs and ``kept`` lines, pooled with the prior
    (plain degrees of freedom: only the line test reads it). None: no evidence and no prior."""
    squares = sum(r.squares for r in levels.values())
    df = sum(r.df for r in levels.values())
    for key in kept:
        misses, line_df = candidates[key]
        squares += sum(m * m for m in misses.values())
        df += line_df
    if prior is not None:
        squares += prior.df * prior.relative_sd**2
        df += prior.df
    return math.sqrt(squares / df) if df > 0 else None


def _line_points(cells: Cells) -> dict[tuple[Drafter, int], list[tuple[int, float, int]]]:
    """Per (drafter, level) measured at three or more draft lengths: (k, mean step time, starts)."""
    out: dict[tuple[Drafter, int], list[tuple[int, float, int]]] = {}
    for (drafter, k), by_level in cells.items():
        if drafter is None or k == 0:
            continue
        for level, points in by_level.items():
            mean = math.exp(sum(x for _, x in points) / len(points))
            out.setdefault((drafter, level), []).append((k, mean, len(points)))
    return {key: sorted(points) for key, points in out.items() if len(points) >= 3}


def _line_misses(points: Sequence[tuple[int, float, int]]) -> dict[int, float] | None:
    """Each draft length's relative miss from the line T = a + b k through the points (weighted
    by starts over T squared, as analysis/throughput.py fits it), in units of one start's: the
    residuals of a line are run-to-run noise with K - 2 degrees of freedom where it is the truth."""
    weights = [n / t**2 for _, t, n in points]
    sw = sum(weights)
    mk = sum(w * k for w, (k, _, _) in zip(weights, points, strict=True)) / sw
    mt = sum(w * t for w, (_, t, _) in zip(weights, points, strict=True)) / sw
    sxx = sum(w * (k - mk) ** 2 for w, (k, _, _) in zip(weights, points, strict=True))
    if sxx <= 0:
        return None
    slope = sum(w * (k - mk) * (t - mt) for w, (k, t, _) in zip(weights, points, strict=True)) / sxx
    out = {}
    for k, t, n in points:
        line = mt + slope * (k - mk)
        if line <= 0:
            return None
        out[k] = (t - line) / line * math.sqrt(n)
    return out


def _level_correlation(levels: Sequence[_Level]) -> float:
    """How alike two levels' residuals are in the units (starts, sibling pairs) both measured,
    averaged over pairs of levels weighted by the units they share; 0 to 1."""
    total, weight = 0.0, 0
    for i, a in enumerate(levels):
        for b in levels[i + 1 :]:
            units = a.residuals.keys() & b.residuals.keys()
            if len(units) < 2:
                continue
            cross = sum(a.residuals[u] * b.residuals[u] for u in units)
            norm = math.sqrt(sum(a.residuals[u] ** 2 for u in units) * sum(b.residuals[u] ** 2 for u in units))
            if norm > 0:
                total, weight = total + len(units) * cross / norm, weight + len(units)
    return min(max(total / weight, 0.0), 1.0) if weight else 0.0


def _sibling_ratios(cells: Cells) -> dict[tuple[int, str], list[tuple[int, float, float]]]:
    """Per (level, drafter method): (k, log step-time ratio of probabilistic over greedy, its
    variance in units of one start's) at every k where both draft methods were measured."""
    out: dict[tuple[int, str], list[tuple[int, float, float]]] = {}
    for (drafter, k), by_level in cells.items():
        if drafter is None or drafter.draft_sample_method != "greedy":
            continue
        other = cells.get((Drafter(method=drafter.method, draft_sample_method="probabilistic"), k), {})
        for level, greedy in by_level.items():
            stochastic = other.get(level)
            if not stochastic:
                continue
            ratio = sum(x for _, x in stochastic) / len(stochastic) - sum(x for _, x in greedy) / len(greedy)
            out.setdefault((level, drafter.method), []).append((k, ratio, 1 / len(stochastic) + 1 / len(greedy)))
    return out
