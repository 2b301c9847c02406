"""Net tokens per second for any k: acceptance draws times step-time draws.

R(k, B) = B * E(k) / T(k, B) (analysis/throughput.py). Draws: acceptance draws times the one
step model's joint step-time draws, one draw index across every k and drafter at a concurrency, so
differences between k's are paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.fits import AcceptanceFit
from specsweep.analysis.positions import band, per_position_draws, point_per_position
from specsweep.analysis.throughput import ThroughputModel
from specsweep.errors import FitError


@dataclass(frozen=True, slots=True, kw_only=True)
class RateSample:
    """Point rates and joint draws for candidates at one concurrency (arrays: not for JSON)."""

    concurrency: int
    candidates: tuple[Candidate, ...]
    tokens_per_step: np.ndarray  # (candidates,)
    step_time_s: np.ndarray  # (candidates,)
    step_time_source: tuple[str, ...]
    tokens_per_s: np.ndarray  # (candidates,)
    draws: np.ndarray  # (draws, candidates), one joint draw per row


AcceptanceInput = AcceptanceFit | Sequence[float]


def sample_rates(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    k_min: int = 1,
    k_max: int | None = None,
    draws: int = 400,
    seed: int = 0,
    acceptance_scale: Mapping[Drafter, Mapping[int, float]] | None = None,
) -> RateSample:
    """R(k) = B E_w(k) / T(k) for off and every drafter's k = k_min..k_max at one concurrency.

    ``acceptance`` gives each drafter's acceptance for the workload: an AcceptanceFit, or plain
    S_1..S_K taken as exact (no uncertainty, no extrapolation past K). ``acceptance_scale``
    multiplies a drafter's S_1 + ... + S_k at k (a drafter that drafts at some steps only, and
    at a share that depends on k: see rigs/model.py); a k it does not name takes the share of
    steps that drafted as the step model has it (measured there, else what the text sets at its
    S_1 + ... + S_k: StepPosterior.share; 1 for a drafter that drafts at every step), as the
    counters' S_i are per drafting step. Step times
    are the one step model's joint draws, so differences between candidates are paired."""
    if concurrency not in model.concurrency_levels:
        raise FitError(f"nothing was measured at concurrency {concurrency}; measure it first.")
    rng = np.random.default_rng(seed)
    drafters = sorted(acceptance)
    arrays = {d: _acceptance_arrays(acceptance[d], draws=draws, seed=int(rng.integers(2**31))) for d in drafters}
    off_measured = any(o.candidate.off for o in model.observations)  # at some concurrency: the model carries it
    candidates: list[Candidate] = [OFF] if off_measured else []
    e_point: list[float] = [1.0] if candidates else []
    e_columns: list[np.ndarray] = [np.ones(draws)] if candidates else []
    accepted: list[float | None] = [None] if candidates else []
    for drafter in drafters:
        s_point, s_draws = arrays[drafter]
        top = s_point.size if k_max is None else min(k_max, s_point.size)
        scale_of = (acceptance_scale or {}).get(drafter, {})
        for k in range(max(k_min, 1), top + 1):
            candidate = Candidate(drafter=drafter, num_speculative_tokens=k)
            per_draft = float(np.sum(s_point[:k]))
            scale = float(scale_of[k]) if k in scale_of else model.drafted_share(candidate, concurrency, per_draft)
            candidates.append(candidate)
            accepted.append(per_draft)
            e_point.append(1.0 + per_draft * scale)
            e_columns.append(1.0 + np.sum(s_draws[:, :k], axis=1) * scale)
    if not candidates:
        raise FitError(f"nothing was measured at concurrency {concurrency} for these drafters; measure it first.")
    steps = model.step_time_draws(candidates, concurrency, draws=draws, rng=rng, accepted=accepted)
    points = [model.step_time_s(c, concurrency, a) for c, a in zip(candidates, accepted, strict=True)]
    e_arr, t_arr = np.array(e_point), np.array([t for t, _ in points])
    return RateSample(
        concurrency=concurrency,
        candidates=tuple(candidates),
        tokens_per_step=e_arr,
        step_time_s=t_arr,
        step_time_source=tuple(source for _, source in points),
        tokens_per_s=concurrency * e_arr / t_arr,
        draws=concurrency * np.column_stack(e_columns) / steps,
    )


def _acceptance_arrays(acceptance: AcceptanceInput, *, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(acceptance, AcceptanceFit):
        return point_per_position(acceptance), per_position_draws(acceptance, draws=draws, seed=seed)
    point = np.asarray(list(acceptance), dtype=float)
    if point.size == 0 or not np.all(np.isfinite(point)):
        raise FitError("exact acceptance needs finite S_1..S_K; pass at least one position.")
    return point, np.broadcast_to(point, (draws, point.size))


@dataclass(frozen=True, slots=True, kw_only=True)
class RatePrediction:
    """Predicted aggregate rate of one candidate at one concurrency, with its band."""

    concurrency: int
    candidate: Candidate
    tokens_per_step: float
    step_time_s: float
    step_time_source: str  # "measured" or "model"
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float


def predict_throughput(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    k_max: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
) -> tuple[RatePrediction, ...]:
    """Rate against k with bands at one concurrency: what a throughput-against-k figure plots."""
    sample = sample_rates(model, acceptance, concurrency=concurrency, k_max=k_max, draws=draws, seed=seed)
    low, high = band(sample.draws, sample.tokens_per_s, confidence)
    return tuple(
        RatePrediction(
            concurrency=concurrency,
            candidate=candidate,
            tokens_per_step=float(sample.tokens_per_step[j]),
            step_time_s=float(sample.step_time_s[j]),
            step_time_source=sample.step_time_source[j],
            tokens_per_s=float(sample.tokens_per_s[j]),
            tokens_per_s_low=float(low[j]),
            tokens_per_s_high=float(high[j]),
        )
        for j, candidate in enumerate(sample.candidates)
    )
