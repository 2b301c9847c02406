"""The recommended draft length and drafter per workload and concurrency, and per batch size.

The candidate with the highest predicted rate wins; predictions use measured points first
(analysis/throughput.py), so a measured configuration is ranked on what it did. Candidates the
data cannot tell from the winner (the paired difference's interval reaches 0, at the confidence
that holds over every cell the study reports at once: value.leader_confidence) are named as
tied with it: they are what a study measures again, or what it says it could not separate. (An
earlier rule took the smallest tied k when it was predicted within 2%: on noisy data that
traded true losses of up to 3.6% for a saving the data could not show.)

Only candidates inside the searched space compete: draft lengths ``k_min``..``k_max`` of the
measured drafters, and speculation off when it was measured.

Gains are fractions: 0.12 means 12% more tokens per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.latency import LatencyLimit
from specsweep.analysis.positions import band
from specsweep.analysis.rates import AcceptanceInput, RateSample, sample_rates
from specsweep.analysis.throughput import ThroughputModel
from specsweep.analysis.value import leader_confidence, pick
from specsweep.errors import FitError
from specsweep.types import BatchSizeRange


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateRate:
    """One candidate's predicted rate and how far it falls short of the highest prediction."""

    candidate: Candidate
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    shortfall_tokens_per_s: float  # highest predicted minus this one, from paired draws
    shortfall_low_tokens_per_s: float
    shortfall_high_tokens_per_s: float
    step_time_source: str  # "measured" or "model"
    measured_tokens_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Gain:
    """The recommendation's rate over another configuration's, minus 1."""

    over: Candidate
    predicted: float | None  # None when the other configuration has no prediction here
    predicted_low: float | None
    predicted_high: float | None
    measured: float | None  # from measured rates of both, when both were measured


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """What to run for one workload at one concurrency, and why."""

    workload: str
    concurrency: int
    choice: Candidate
    speculation_off: bool
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    measured_tokens_per_s: float | None
    tied: tuple[Candidate, ...]  # candidates the data cannot tell from the choice, best predicted first
    # of those, the ones that cannot be more than the tolerance faster or slower: either is fine
    within_tolerance: tuple[Candidate, ...] = ()
    measured: bool  # the choice itself was measured at this concurrency
    gain_over_off: Gain | None
    gain_over_baseline: Gain | None
    reason: str
    candidates: tuple[CandidateRate, ...]
    confidence: float  # of the intervals
    leader_confidence: float  # of the paired differences that name the tied: over every cell at once
    draws: int
    seed: int


def recommend_draft_length(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    workload: str = "",
    baseline: Candidate | None = None,
    k_min: int = 1,
    k_max: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
    acceptance_scale: Mapping[Drafter, Mapping[int, float]] | None = None,
    tolerance: float = 0.01,
    limit: LatencyLimit | None = None,
    idle: Collection[Candidate] = (),
    cells: int = 1,
) -> Recommendation:
    """Best k and drafter for one workload at one measured concurrency (see the module doc).

    ``acceptance_scale``: see sample_rates. ``tolerance``: a tied candidate that cannot be more
    than this share faster or slower than the choice is one either of which is fine. ``limit``: a latency
    target; only the candidates it keeps compete (all of them, said in the reason, when it keeps
    none). ``idle``: configurations the engine runs as speculation off (they never draft): not
    candidates of their own. ``cells``: how many cells the study names leaders in at once (the
    tied are named at value.leader_confidence over them)."""
    sample = sample_rates(
        model, acceptance, concurrency=concurrency, k_min=k_min, k_max=k_max, draws=draws, seed=seed,
        acceptance_scale=acceptance_scale,
    )  # fmt: skip

    def measured(candidate: Candidate) -> float | None:
        return model.measured_tokens_per_s(candidate, concurrency=concurrency, workload=workload) if workload else None

    return recommend_from_sample(
        sample, measured, workload=workload, baseline=baseline, confidence=confidence, tolerance=tolerance,
        limit=limit, idle=idle, cells=cells, seed=seed,
    )  # fmt: skip


def recommend_from_sample(
    sample: RateSample,
    measured: Callable[[Candidate], float | None],
    *,
    workload: str = "",
    baseline: Candidate | None = None,
    confidence: float = 0.95,
    tolerance: float = 0.01,
    limit: LatencyLimit | None = None,
    idle: Collection[Candidate] = (),
    cells: int = 1,
    seed: int = 0,
) -> Recommendation:
    """The recommendation from joint rate draws (``sample``) and what was measured of each
    candidate at this cell (``measured``: its mean measured rate, None where never measured): the
    one rule's pick, the tied, the gains and the reason (recommend_draft_length's arguments)."""
    concurrency, draws = sample.concurrency, sample.draws.shape[0]
    runnable = [j for j, c in enumerate(sample.candidates) if c not in idle]
    kept = [j for j in runnable if limit is None or limit.allows(sample.candidates[j])]
    unmet = limit is not None and not kept
    kept = kept or runnable
    # The one rule (analysis/value.py): the measured configuration with the least expected loss;
    # nothing measured here (a rig's model, another workload), the highest prediction.
    measured_here = [j for j in kept if measured(sample.candidates[j]) is not None]
    if measured_here:
        chosen, _ = pick(sample.draws[:, kept], [kept.index(j) for j in measured_here], tolerance)
        chosen = kept[chosen]
    else:
        chosen = max(kept, key=lambda j: sample.tokens_per_s[j])
    shortfall = sample.draws[:, chosen : chosen + 1] - sample.draws
    shortfall_point = sample.tokens_per_s[chosen] - sample.tokens_per_s
    short_low, short_high = band(shortfall, shortfall_point, confidence)
    rate_low, rate_high = band(sample.draws, sample.tokens_per_s, confidence)
    choice = sample.candidates[chosen]
    leaders = leader_confidence(cells, confidence)
    tie_low, tie_high = band(shortfall, shortfall_point, leaders)
    tied = sorted(
        (j for j in kept if j != chosen and tie_low[j] <= 0.0),
        key=lambda j: -sample.tokens_per_s[j],
    )
    rows = tuple(
        CandidateRate(
            candidate=c,
            tokens_per_s=float(sample.tokens_per_s[j]),
            tokens_per_s_low=float(rate_low[j]),
            tokens_per_s_high=float(rate_high[j]),
            shortfall_tokens_per_s=float(shortfall_point[j]),
            shortfall_low_tokens_per_s=float(short_low[j]),
            shortfall_high_tokens_per_s=float(short_high[j]),
            step_time_source=sample.step_time_source[j],
            measured_tokens_per_s=measured(c),
        )
        for j, c in enumerate(sample.candidates)
    )
    # Within the tolerance both ways: it can be neither more than the tolerance faster nor slower
    # (one that may be far slower is not "either is fine", whoever runs it instead of the choice).
    bound = tolerance * sample.tokens_per_s[chosen]
    fine = [j for j in tied if -tie_low[j] <= bound and tie_high[j] <= bound]
    reason = _reason(
        sample, chosen, tied, fine, (short_low, short_high), (confidence, leaders), tolerance, kept, measured_here
    )
    if limit is not None:
        said = "The latency target is not met here" if unmet else "Latency target"
        reason += f" {said}: {limit.describe()}."
    return Recommendation(
        workload=workload,
        concurrency=concurrency,
        choice=choice,
        speculation_off=choice.off,
        tokens_per_s=float(sample.tokens_per_s[chosen]),
        tokens_per_s_low=float(rate_low[chosen]),
        tokens_per_s_high=float(rate_high[chosen]),
        measured_tokens_per_s=measured(choice),
        tied=tuple(sample.candidates[j] for j in tied),
        within_tolerance=tuple(sample.candidates[j] for j in fine),
        measured=measured(choice) is not None,
        gain_over_off=_gain(sample, chosen, OFF, measured, confidence),
        gain_over_baseline=None if baseline is None else _gain(sample, chosen, baseline, measured, confidence),
        reason=reason,
        candidates=rows,
        confidence=confidence,
        leader_confidence=leaders,
        draws=draws,
        seed=seed,
    )


def _reason(
    sample: RateSample,
    chosen: int,
    tied: list[int],
    fine: list[int],
    interval: tuple[np.ndarray, np.ndarray],
    confidences: tuple[float, float],  # of the intervals, and of the paired differences that name the tied
    tolerance: float,
    kept: list[int],
    measured_here: list[int],
) -> str:
    top, rate = sample.candidates[chosen], sample.tokens_per_s
    (low, high), (confidence, leaders) = interval, confidences
    others = [j for j in kept if j != chosen]
    ahead = [j for j in others if rate[j] > rate[chosen]]
    if ahead:
        text = f"{top.label} has the least expected loss of the measured configurations ({rate[chosen]:.1f} tok/s)"
    else:
        text = f"{top.label} has the highest predicted rate ({rate[chosen]:.1f} tok/s)"
    if others:
        runner = min(others, key=lambda j: abs(rate[chosen] - rate[j]))
        gap = rate[chosen] - rate[runner]
        # faster predicted yet not picked: never measured, or measured with more doubt (a larger expected loss)
        why = "less surely" if runner in measured_here else "never measured here"
        text += (
            f"; next is {sample.candidates[runner].label}, {abs(gap):.2f} tok/s {'slower' if gap >= 0 else 'faster'}"
            f"{'' if gap >= 0 else ' predicted, ' + why} "
            f"({confidence:.0%} interval {low[runner]:.2f} to {high[runner]:.2f})"
        )
    if fine:
        names = _names(sample, fine)
        text += f"; it and {names} are within {100 * tolerance:g}% of each other: either is fine"
    rest = [j for j in tied if j not in fine]
    if rest:
        text += (
            f"; the data cannot tell it from {_names(sample, rest)} (their paired difference's "
            f"{100 * leaders:.4g}% interval includes 0, and reaches beyond {100 * tolerance:g}%)"
        )
    return text + (": turn speculation off." if top.off else ".")


def _names(sample: RateSample, columns: list[int]) -> str:
    return ", ".join(sample.candidates[j].label for j in columns[:3]) + (" and others" if len(columns) > 3 else "")


def _gain(
    sample: RateSample, chosen: int, other: Candidate, measured: Callable[[Candidate], float | None], confidence: float
) -> Gain:
    mine, theirs = measured(sample.candidates[chosen]), measured(other)
    measured_gain = mine / theirs - 1.0 if mine is not None and theirs else None
    if other not in sample.candidates:
        return Gain(over=other, predicted=None, predicted_low=None, predicted_high=None, measured=measured_gain)
    j = sample.candidates.index(other)
    point = float(sample.tokens_per_s[chosen] / sample.tokens_per_s[j] - 1.0)
    low, high = band(sample.draws[:, chosen] / sample.draws[:, j] - 1.0, np.array(point), confidence)
    return Gain(
        over=other, predicted=point, predicted_low=float(low), predicted_high=float(high), measured=measured_gain
    )


def batch_size_table(k_by_concurrency: Mapping[int, int], *, max_batch: int) -> tuple[BatchSizeRange, ...]:
    """vLLM ``num_speculative_tokens_per_batch_size`` rows [start, end, k] covering 1..max_batch.

    Between two measured concurrency levels B_a < B_b the split is at their geometric midpoint:
    batch sizes up to floor(sqrt(B_a * B_b)) take B_a's k, larger ones B_b's (step cost grows
    roughly with log B across the range graphs are captured for, so the midpoint in log B is the
    even guess). Below the smallest level its k holds, above the largest its k holds up to
    max_batch. Adjacent rows with the same k merge, so one row means one k serves every batch
    size and no table is needed. k = 0 means no drafting at those batch sizes.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    levels = sorted(b for b in k_by_concurrency if b >= 1)
    if not levels:
        raise FitError("no concurrency level has a recommended k; measure at least one level.")
    rows: list[list[int]] = []
    start = 1
    for index, level in enumerate(levels):
        if index + 1 < len(levels):
            end = max(level, min(math.floor(math.sqrt(level * levels[index + 1])), levels[index + 1] - 1))
        else:
            end = max_batch
        end = min(end, max_batch)
        if start > end:
            continue
        k = k_by_concurrency[level]
        if rows and rows[-1][2] == k:
            rows[-1][1] = end
        else:
            rows.append([start, end, k])
        start = end + 1
    return tuple(BatchSizeRange(start=s, end=e, num_speculative_tokens=k) for s, e, k in rows)
