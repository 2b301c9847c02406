"""Net tokens per second for any k: acceptance draws times step-time draws.

R(k, B) = B * E(k) / T(k, B) (analysis/throughput.py). Draws: acceptance draws times step-time
draws, one joint draw index across every k and drafter at a concurrency, so differences between
k's are paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.fits import AcceptanceFit, band, per_position_draws, point_per_position
from specsweep.analysis.throughput import ThroughputModel, step_time_draws
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
    """R(k) = B E_w(k) / T(k) for off and every drafter's k = k_min..k_max at one measured concurrency.

    ``acceptance`` gives each drafter's acceptance for the workload: an AcceptanceFit, or plain
    S_1..S_K taken as exact (no uncertainty, no extrapolation past K). ``acceptance_scale``
    multiplies a drafter's S_1 + ... + S_k at k (a drafter that drafts at some steps only, and
    at a share that depends on k: see analysis/rig.py); a k it does not name keeps 1.
    """
    rng = np.random.default_rng(seed)
    candidates: list[Candidate] = []
    e_point: list[float] = []
    t_point: list[float] = []
    sources: list[str] = []
    columns: list[np.ndarray] = []
    off = model.fit_for(concurrency, None)
    floor_draws: np.ndarray | float = 1e-9
    floor_point = 1e-9
    if off is not None:
        t, source = off.step_time_s(0)
        candidates.append(OFF)
        e_point.append(1.0)
        t_point.append(t)
        sources.append(source)
        off_draws = step_time_draws(off, [0], draws=draws, rng=rng)[:, 0]
        columns.append(concurrency / off_draws)
        # A step that drafts verifies at least what a step without drafting decodes: no line
        # (least of all a one-point fit with its drawn slope) may go below speculation off.
        floor_draws, floor_point = off_draws, t
    for drafter in sorted(acceptance):
        fit = model.fit_for(concurrency, drafter)
        if fit is None:
            continue
        s_point, s_draws = _acceptance_arrays(acceptance[drafter], draws=draws, seed=int(rng.integers(2**31)))
        top = s_point.size if k_max is None else min(k_max, s_point.size)
        ks = list(range(max(k_min, 1), top + 1))
        if not ks:
            continue
        t_draws = np.maximum(step_time_draws(fit, ks, draws=draws, rng=rng), np.reshape(floor_draws, (-1, 1)))
        scale_of = (acceptance_scale or {}).get(drafter, {})
        scale = np.array([float(scale_of.get(k, 1.0)) for k in ks])
        e_draws = 1.0 + np.cumsum(s_draws[:, :top], axis=1)[:, top - len(ks) :] * scale
        e_points = 1.0 + np.cumsum(s_point[:top])[top - len(ks) :] * scale
        for j, k in enumerate(ks):
            t, source = fit.step_time_s(k)
            t = max(t, floor_point)
            candidates.append(Candidate(drafter=drafter, num_speculative_tokens=k))
            e_point.append(float(e_points[j]))
            t_point.append(t)
            sources.append(source)
            columns.append(concurrency * e_draws[:, j] / t_draws[:, j])
    if not candidates:
        raise FitError(f"nothing was measured at concurrency {concurrency} for these drafters; measure it first.")
    e_arr, t_arr = np.array(e_point), np.array(t_point)
    return RateSample(
        concurrency=concurrency,
        candidates=tuple(candidates),
        tokens_per_step=e_arr,
        step_time_s=t_arr,
        step_time_source=tuple(sources),
        tokens_per_s=concurrency * e_arr / t_arr,
        draws=np.column_stack(columns),
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
    step_time_source: str  # "measured" or "line"
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float


def predict_throughput(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    k_min: int = 1,
    k_max: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
) -> tuple[RatePrediction, ...]:
    """Rate against k with bands at one concurrency: what a throughput-against-k figure plots."""
    sample = sample_rates(model, acceptance, concurrency=concurrency, k_min=k_min, k_max=k_max, draws=draws, seed=seed)
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
