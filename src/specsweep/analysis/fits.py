"""Acceptance decay fits from per-position counts, with intervals and predictions for every k.

From one measurement at the largest k (n_0 = num_drafts, n_i = accepted_per_position[i-1]):
each curve family in ``decay`` fitted by maximum likelihood on its unconstrained parameters and
ranked by AIC (the lowest chosen, the choice explained), with the saturated model (p_i free per
position) beside them: it cannot extrapolate, but a much lower AIC says no curve follows every
position; Wilson intervals per position (``intervals``), widened by an optional design effect;
and S_k, E(k) with bands for k = 1..k_max (``positions``). A curve's parameter covariance is the
inverse Hessian at the optimum, times the design effect. docs/math.md states each step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize

from specsweep.analysis.decay import (
    EPS,
    MODEL_NAMES,
    log_likelihood,
    model_named,
    saturated_conditional,
    survival,
)
from specsweep.analysis.intervals import PositionEstimate, position_estimates
from specsweep.analysis.positions import BorrowedTail, DraftLengthPrediction, predict_draft_lengths
from specsweep.errors import FitError

MAX_VARIANCE = 100.0  # cap on an unconstrained parameter's variance where the data do not pin it


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFit:
    """One curve family fitted to the counts."""

    name: str
    param_names: tuple[str, ...]
    params: tuple[float, ...]  # natural scale (a, b0, g, alpha, ...)
    unconstrained: tuple[float, ...]  # the optimiser's scale (see decay)
    covariance: tuple[tuple[float, ...], ...]  # of ``unconstrained``, design effect included
    num_params: int
    log_likelihood: float | None  # None for aggregate data, which have no per-position likelihood
    aic: float | None
    delta_aic: float = 0.0  # above the best parametric model (rank_models fills it in)
    akaike_weight: float = 0.0  # among the parametric models (0 for the saturated one)
    per_position: tuple[float, ...]  # fitted S_1..S_kmax
    conditional: tuple[float, ...]  # fitted p_1..p_kmax
    converged: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptanceFit:
    """Fitted acceptance of one workload under one drafter."""

    source: str  # "per_position" (counters per position) or "aggregate" (mean accepted per step)
    num_drafts: float
    accepted_per_position: tuple[float, ...]
    num_speculative_tokens: int  # the k the data were measured at
    measured_positions: int  # K: positions with counts (0 for aggregate data)
    k_max: int
    design_effect: float
    confidence: float
    positions: tuple[PositionEstimate, ...]
    models: tuple[ModelFit, ...]  # parametric models, lowest AIC first
    saturated: ModelFit | None
    chosen: str
    choice_reason: str
    prediction: tuple[DraftLengthPrediction, ...] = ()  # k = 1..k_max (positions.predict_draft_lengths)
    draws: int
    seed: int
    borrowed: BorrowedTail | None = None  # positions past K taken from the other draft sampling

    def model(self, name: str) -> ModelFit:
        """The fit of the model called ``name``."""
        fits = self.models if self.saturated is None else (*self.models, self.saturated)
        for fit in fits:
            if fit.name == name:
                return fit
        raise KeyError(name)

    @property
    def per_position(self) -> tuple[float, ...]:
        """Predicted S_1..S_kmax (measured where measured)."""
        return tuple(p.per_position for p in self.prediction)


def fit_acceptance(
    *,
    num_drafts: float,
    accepted_per_position: Sequence[float],
    k_max: int | None = None,
    design_effect: float = 1.0,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
    models: Sequence[str] = MODEL_NAMES,
) -> AcceptanceFit:
    """Fit every decay model to one measurement's counts and predict S_k, E(k) up to k_max.

    ``k_max`` defaults to max(10, measured positions). Raises FitError when the counts cannot
    be fitted (no drafts, negative or rising counts, nothing measured).
    """
    counts = validate_counts(num_drafts, accepted_per_position)
    check_design_effect(design_effect)
    measured = counts.size - 1
    k_max = max(10, measured) if k_max is None else k_max
    if k_max < 1 or draws < 1:
        raise FitError("k_max and draws must be at least 1.")
    fitted = [fit_decay_model(name, counts, k_max=k_max, design_effect=design_effect) for name in models]
    fitted, chosen, reason = rank_models(fitted, saturated := fit_saturated(counts, k_max=k_max))
    fit = AcceptanceFit(
        source="per_position",
        num_drafts=float(counts[0]),
        accepted_per_position=tuple(float(c) for c in counts[1:]),
        num_speculative_tokens=measured,
        measured_positions=measured,
        k_max=k_max,
        design_effect=design_effect,
        confidence=confidence,
        positions=position_estimates(counts, confidence=confidence, design_effect=design_effect),
        models=tuple(fitted),
        saturated=saturated,
        chosen=chosen,
        choice_reason=reason,
        draws=draws,
        seed=seed,
    )
    return replace(fit, prediction=predict_draft_lengths(fit))


def check_design_effect(design_effect: float) -> None:
    """FitError unless the design effect is a finite number of at least 1."""
    if not design_effect >= 1.0 or not math.isfinite(design_effect):
        raise FitError(f"design effect {design_effect} is not a number of at least 1; pass 1 + (m - 1) * rho.")


def validate_counts(num_drafts: float, accepted_per_position: Sequence[float]) -> np.ndarray:
    """n_0..n_K as floats, or FitError saying what is wrong with them."""
    try:
        counts = np.asarray([num_drafts, *accepted_per_position], dtype=float)
    except (TypeError, ValueError) as error:
        raise FitError(f"acceptance counts are not numbers ({error}); pass numeric counts.") from None
    if counts.ndim != 1 or counts.size < 2:
        raise FitError("no per-position acceptance counts: measure with speculation on, at k >= 1.")
    if not np.all(np.isfinite(counts)):
        raise FitError("acceptance counts include NaN or infinity; re-measure the window.")
    if counts[0] <= 0:
        raise FitError("no drafts were counted: measure with speculation on and requests that decode.")
    if np.any(counts < 0):
        raise FitError("a per-position acceptance count is negative: the counters were reset mid-window; re-measure.")
    rising = np.flatnonzero(counts[1:] > counts[:-1] * (1 + 1e-9) + 1e-9)
    if rising.size:
        i = int(rising[0]) + 1
        raise FitError(
            f"position {i} accepted more often than {'the drafts' if i == 1 else f'position {i - 1}'}; "
            "per-position counts must not rise along the draft: re-measure the window."
        )
    return np.minimum.accumulate(counts)  # removes rounding-level rises only


def fit_decay_model(name: str, counts: np.ndarray, *, k_max: int, design_effect: float = 1.0) -> ModelFit:
    """Maximum-likelihood fit of one decay model (delta_aic and akaike_weight left at 0)."""
    model = model_named(name)
    positions = np.arange(1, counts.size, dtype=float)
    reached, accepted = counts[:-1], counts[1:]
    scale = 1.0 / counts[0]  # per drafted step, so tolerances mean the same for any amount of data

    def objective(theta: np.ndarray) -> float:
        return -log_likelihood(model.conditional(theta, positions), counts)

    def scaled_with_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        # d(log L)/dp_i is analytic; dp_i/dtheta by central differences in one vectorised call
        m, h = theta.size, 1e-6
        stack = np.concatenate([theta + np.eye(m) * h, theta - np.eye(m) * h, theta[None, :]])
        rates = model.conditional(stack, positions)
        p = np.clip(rates[-1], EPS, 1 - EPS)
        jacobian = (rates[:m] - rates[m : 2 * m]) / (2 * h)
        gradient = jacobian @ (accepted / p - (reached - accepted) / (1 - p))
        return -log_likelihood(rates[-1], counts) * scale, -gradient * scale

    empirical = saturated_conditional(counts)
    lower, upper = np.array([b[0] for b in model.bounds]), np.array([b[1] for b in model.bounds])
    best = None
    for start in model.starts(empirical):
        result = minimize(
            scaled_with_gradient,
            np.clip(start, lower, upper),
            jac=True,
            method="SLSQP",
            bounds=model.bounds,
            options={"ftol": 1e-12, "maxiter": 500},
        )
        if best is None or result.fun < best.fun:
            best = result
    assert best is not None
    theta = np.asarray(best.x, dtype=float)
    covariance = design_effect * inverse_hessian(objective, theta, model.bounds)
    conditional = model.conditional(theta, np.arange(1, k_max + 1, dtype=float))
    ll = -objective(theta)
    return ModelFit(
        name=name,
        param_names=model.param_names,
        params=model.natural(theta),
        unconstrained=tuple(float(t) for t in theta),
        covariance=tuple(tuple(float(c) for c in row) for row in covariance),
        num_params=len(model.param_names),
        log_likelihood=ll,
        aic=2 * len(model.param_names) - 2 * ll,
        per_position=tuple(float(s) for s in survival(conditional)),
        conditional=tuple(float(p) for p in conditional),
        converged=bool(best.success),
    )


def inverse_hessian(
    objective: Callable[[np.ndarray], float], theta: np.ndarray, bounds: Sequence[tuple[float, float]]
) -> np.ndarray:
    """Covariance from the negative log-likelihood's curvature, by central differences.

    Directions the data do not pin down (a flat likelihood, an optimum on a bound) get
    variance MAX_VARIANCE instead of infinity.
    """
    m = theta.size
    h = 1e-3
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    centre = np.clip(theta, lo + 2 * h, hi - 2 * h)
    f0 = objective(centre)
    hessian = np.empty((m, m))
    for a in range(m):
        for b in range(a, m):
            ea, eb = np.eye(m)[a] * h, np.eye(m)[b] * h
            if a == b:
                value = (objective(centre + ea) - 2 * f0 + objective(centre - ea)) / (h * h)
            else:
                value = (
                    objective(centre + ea + eb)
                    - objective(centre + ea - eb)
                    - objective(centre - ea + eb)
                    + objective(centre - ea - eb)
                ) / (4 * h * h)
            hessian[a, b] = hessian[b, a] = value
    if not np.all(np.isfinite(hessian)):
        return np.eye(m) * MAX_VARIANCE
    eigenvalues, vectors = np.linalg.eigh(hessian)
    eigenvalues = np.maximum(eigenvalues, 1.0 / MAX_VARIANCE)
    covariance: np.ndarray = (vectors / eigenvalues) @ vectors.T
    return covariance


def fit_saturated(counts: np.ndarray, *, k_max: int) -> ModelFit:
    """p_i free at every position that any step reached: the best any model could do."""
    conditional = saturated_conditional(counts)
    informative = np.isfinite(conditional)
    filled = np.where(informative, conditional, 0.0)
    ll = log_likelihood(filled, counts)
    shown = filled[:k_max]
    k = int(informative.sum())
    return ModelFit(
        name="saturated",
        param_names=tuple(f"p{i}" for i in range(1, counts.size)),
        params=tuple(float(p) for p in filled),
        unconstrained=(),
        covariance=(),
        num_params=k,
        log_likelihood=ll,
        aic=2 * k - 2 * ll,
        per_position=tuple(float(s) for s in survival(shown)),
        conditional=tuple(float(p) for p in shown),
    )


def rank_models(fitted: list[ModelFit], saturated: ModelFit | None) -> tuple[list[ModelFit], str, str]:
    """Sort by AIC, fill in delta AIC and Akaike weights, name the choice and say why."""
    if not fitted:
        raise FitError("no decay model to fit: name at least one of " + ", ".join(MODEL_NAMES) + ".")
    scored = sorted(((f.aic, f) for f in fitted if f.aic is not None), key=lambda pair: pair[0])
    if len(scored) != len(fitted):
        raise FitError("every decay model ranked by AIC needs a per-position likelihood.")
    best = scored[0][0]
    fitted = [replace(f, delta_aic=aic - best, akaike_weight=math.exp(-(aic - best) / 2)) for aic, f in scored]
    total = sum(f.akaike_weight for f in fitted)
    fitted = [replace(f, akaike_weight=f.akaike_weight / total) for f in fitted]
    chosen = fitted[0]
    table = ", ".join([f"{chosen.name} {best:.2f}"] + [f"{f.name} +{f.delta_aic:.2f}" for f in fitted[1:]])
    reason = f"{chosen.name} has the lowest AIC ({table})"
    if len(fitted) > 1 and fitted[1].delta_aic < 2:
        reason += f"; {fitted[1].name} is within 2 AIC units, so the data barely separate them"
    if saturated is not None and saturated.aic is not None and saturated.aic < best - 2:
        reason += (
            f"; the saturated model (p_i free) scores {best - saturated.aic:.1f} lower, so the rates vary "
            "more than any curve: measured positions use the measured rates and the curve only extrapolates"
        )
    return fitted, chosen.name, reason + "."
