"""S_1..S_kmax of an acceptance fit: its point, its joint draws and its bands per draft length,
and the positions a drafter borrows from its other draft sampling.

Up to the last measured position K the point is the measured rate (E(k) needs no model there);
beyond it the chosen curve carries S_K on, S_k = S_K p_(K+1) ... p_k, so predictions never rise.
Bands come from joint draws: measured positions by a parametric bootstrap of the counts (n_0 /
design effect steps resampled binomially), the curve's by its parameters drawn from the normal
approximation at the optimum, so they widen past the measured range; a percentile band is
widened to hold the point where skew would leave it outside.

**Borrowed positions** (docs/math.md states the model and its prior). The two draft samplings
of one method run the same drafter against the same target, so their conditional rates differ by
one shift on the logit scale,

    logit p_i(this) = logit p_i(other) + shift + e_i,    e_i ~ N(0, departure^2) per position,

and where the other was measured at more positions, positions K+1.. take its rates (measured up
to its own K, its curve beyond) moved by the shift, instead of this drafter's own curve carried
past its data. ``shift`` is fitted by maximum likelihood at positions 1..K, its variance with the
other's sampling variance there; ``departure`` from how far those counts stray from one shift,
never below ``DEPARTURE_PRIOR``, so a borrowed position stays less certain than a measured one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from specsweep.analysis.decay import model_named, saturated_conditional, survival
from specsweep.measurement.acceptance import expected_tokens_per_step

if TYPE_CHECKING:
    from specsweep.analysis.fits import AcceptanceFit

DEPARTURE_PRIOR = 0.1  # logit; the floor of a borrowed position's own departure from the shift
_CLIP = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftLengthPrediction:
    """Predicted S_k and E(k) at one draft length, with bands."""

    num_speculative_tokens: int
    per_position: float  # S_k
    per_position_low: float
    per_position_high: float
    tokens_per_step: float  # E(k)
    tokens_per_step_low: float
    tokens_per_step_high: float
    source: str  # "measured" (within the measured positions), "model" (aggregate data) or "extrapolated"


@dataclass(frozen=True, slots=True, kw_only=True)
class BorrowedTail:
    """Positions past a drafter's own K taken from its other draft sampling, moved by a shift."""

    lender: AcceptanceFit  # the other draft sampling's fit, measured at more positions
    shift: float  # logit p(this) - logit p(lender), fitted at positions 1..K
    shift_sd: float
    departure_sd: float  # per borrowed position, on the logit scale
    chi_square: float  # of this drafter's counts at 1..K under the shifted lender
    positions: int  # K: this drafter's own measured positions


def lend_positions(fit: AcceptanceFit, lender: AcceptanceFit) -> AcceptanceFit:
    """``fit`` with positions K+1..k_max borrowed from ``lender``, when the lender was measured
    at more positions than ``fit``; else ``fit`` unchanged. Both carry per-position counts."""
    own = fit.measured_positions
    if own < 1 or lender.measured_positions <= own or lender.k_max < fit.k_max:
        return fit
    counts = np.asarray([fit.num_drafts, *fit.accepted_per_position], dtype=float) / fit.design_effect
    reached, accepted = counts[:-1], counts[1:]
    lender_counts = np.asarray([lender.num_drafts, *lender.accepted_per_position], dtype=float) / lender.design_effect
    base = logit(np.clip(np.nan_to_num(saturated_conditional(lender_counts)[:own], nan=0.0), _CLIP, 1 - _CLIP))

    def minus_log_likelihood(shift: float) -> float:
        q = np.clip(expit(base + shift), _CLIP, 1 - _CLIP)
        return -float(np.sum(accepted * np.log(q) + (reached - accepted) * np.log1p(-q)))

    shift = float(minimize_scalar(minus_log_likelihood, bounds=(-15.0, 15.0), method="bounded").x)
    q = np.clip(expit(base + shift), _CLIP, 1 - _CLIP)
    information = reached * q * (1 - q)
    total = float(np.sum(information))
    if total <= 0:
        return fit
    lender_p = np.clip(expit(base), _CLIP, 1 - _CLIP)
    lender_variance = 1.0 / np.maximum(lender_counts[:-1][:own] * lender_p * (1 - lender_p), _CLIP)
    shift_variance = 1.0 / total + float(np.sum((information / total) ** 2 * lender_variance))
    chi_square = float(np.sum((accepted - reached * q) ** 2 / np.maximum(information, _CLIP)))
    departure = max(DEPARTURE_PRIOR, float(np.sqrt(max(0.0, chi_square - (own - 1)) / total)))
    tail = BorrowedTail(
        lender=lender, shift=shift, shift_sd=float(np.sqrt(shift_variance)), departure_sd=departure,
        chi_square=chi_square, positions=own,
    )  # fmt: skip
    borrowing = replace(fit, borrowed=tail)
    return replace(borrowing, prediction=predict_draft_lengths(borrowing))


def point_per_position(fit: AcceptanceFit) -> np.ndarray:
    """S_1..S_kmax: measured up to K, then the lender's rates moved by the shift where positions
    are borrowed, else the chosen curve's conditional rates carried on."""
    measured = np.asarray(fit.accepted_per_position, dtype=float) / fit.num_drafts if fit.measured_positions else None
    tail = fit.borrowed
    if tail is not None:
        lender = _conditional(point_per_position(tail.lender)[None, :])
        curve = expit(logit(lender) + tail.shift)
    else:
        curve = np.asarray(fit.model(fit.chosen).conditional, dtype=float)[None, :]
    joined: np.ndarray = _join(measured, curve, fit.k_max)[0]
    return joined


def per_position_draws(fit: AcceptanceFit, *, draws: int, seed: int) -> np.ndarray:
    """Joint draws of S_1..S_kmax, shape (draws, k_max); deterministic given ``seed``."""
    rng = np.random.default_rng(seed)
    measured = None
    if fit.measured_positions:
        counts = np.asarray([fit.num_drafts, *fit.accepted_per_position], dtype=float)
        rates = np.nan_to_num(saturated_conditional(counts), nan=0.0)
        effective = max(1, round(counts[0] / fit.design_effect))
        reached = np.full(draws, effective, dtype=np.int64)
        measured = np.empty((draws, rates.size))
        for i, rate in enumerate(rates):
            reached = rng.binomial(reached, rate)
            measured[:, i] = reached / effective
    tail = fit.borrowed
    if tail is not None:
        lender = _conditional(per_position_draws(tail.lender, draws=draws, seed=int(rng.integers(2**31))))
        shift = rng.normal(tail.shift, tail.shift_sd, size=(draws, 1))
        departure = rng.normal(0.0, tail.departure_sd, size=lender.shape)
        curve = expit(logit(lender) + shift + departure)
    else:
        chosen = fit.model(fit.chosen)
        model = model_named(chosen.name)
        theta = rng.multivariate_normal(chosen.unconstrained, chosen.covariance, size=draws, method="eigh")
        lo, hi = np.array([b[0] for b in model.bounds]), np.array([b[1] for b in model.bounds])
        curve = model.conditional(np.clip(theta, lo, hi), np.arange(1, fit.k_max + 1, dtype=float))
    return _join(measured, curve, fit.k_max)


def _conditional(per_position: np.ndarray) -> np.ndarray:
    """p_i = S_i / S_(i-1) along the last axis, clipped inside (0, 1) for the logit."""
    previous = np.concatenate([np.ones_like(per_position[..., :1]), per_position[..., :-1]], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(previous > 0, per_position / np.where(previous > 0, previous, 1.0), 0.0)
    clipped: np.ndarray = np.clip(rates, _CLIP, 1 - _CLIP)
    return clipped


def _join(measured: np.ndarray | None, curve: np.ndarray, k_max: int) -> np.ndarray:
    """Measured S up to K (rows of draws, or one row), then S_K times the curve's p_(K+1..)."""
    rows = curve.shape[0] if measured is None else max(curve.shape[0], np.atleast_2d(measured).shape[0])
    if measured is None:
        return np.broadcast_to(survival(curve[:, :k_max]), (rows, k_max)).copy()
    measured = np.atleast_2d(measured)
    out = np.empty((rows, k_max))
    known = min(measured.shape[1], k_max)
    out[:, :known] = measured[:, :known]
    if k_max > measured.shape[1]:
        tail = np.broadcast_to(curve[:, measured.shape[1] : k_max], (rows, k_max - measured.shape[1]))
        out[:, known:] = measured[:, -1:] * survival(tail)
    return out


def band(samples: np.ndarray, point: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile band over axis 0, widened to hold ``point``."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail], axis=0)
    return np.minimum(low, point), np.maximum(high, point)


def predict_draft_lengths(fit: AcceptanceFit) -> tuple[DraftLengthPrediction, ...]:
    """S_k and E(k) with bands for k = 1..k_max from the fit's own draws."""
    point = point_per_position(fit)
    samples = per_position_draws(fit, draws=fit.draws, seed=fit.seed)
    s_low, s_high = band(samples, point, fit.confidence)
    e_point = np.array([expected_tokens_per_step(list(point), k) for k in range(1, fit.k_max + 1)])
    e_low, e_high = band(1.0 + np.cumsum(samples, axis=1), e_point, fit.confidence)
    return tuple(
        DraftLengthPrediction(
            num_speculative_tokens=k,
            per_position=float(point[k - 1]),
            per_position_low=float(s_low[k - 1]),
            per_position_high=float(s_high[k - 1]),
            tokens_per_step=float(e_point[k - 1]),
            tokens_per_step_low=float(e_low[k - 1]),
            tokens_per_step_high=float(e_high[k - 1]),
            source=_source(fit, k),
        )
        for k in range(1, fit.k_max + 1)
    )


def _source(fit: AcceptanceFit, k: int) -> str:
    if k <= fit.measured_positions:
        return "measured"
    if fit.borrowed is not None and k <= fit.borrowed.lender.measured_positions:
        return "borrowed"
    return "model" if k <= fit.num_speculative_tokens else "extrapolated"
