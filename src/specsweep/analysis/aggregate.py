"""Acceptance from aggregate counts only: the geometric rate a behind a mean accepted per step.

llama.cpp's per-request ``timings`` (draft_n, draft_n_accepted) and SGLang's accept length give
no per-position detail, only how many drafted tokens a step accepted on average at a known k.
Under the geometric model S_i = a^i that mean is a^1 + ... + a^k, which rises from 0 to k as a
goes from 0 to 1, so it identifies a. From SGLang, pass drafted = k * verify steps and
accepted = completion tokens - verify steps for each request.

Uncertainty: with two or more requests, a bootstrap over requests (whole requests resampled,
so clustering within a request is respected); with totals only, the spread of A under the
fitted geometric model over independent steps, inflated by the design effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import brentq
from scipy.special import logit

from specsweep.analysis.decay import BOUND
from specsweep.analysis.fits import MAX_VARIANCE, AcceptanceFit, ModelFit, check_design_effect
from specsweep.analysis.positions import predict_draft_lengths
from specsweep.errors import FitError


def geometric_rate(mean_accepted_per_step: float, num_speculative_tokens: int) -> float:
    """The a in [0, 1] with a + a^2 + ... + a^k = mean accepted per step (clamped to 0..k)."""
    k = num_speculative_tokens
    if mean_accepted_per_step <= 0:
        return 0.0
    if mean_accepted_per_step >= k:
        return 1.0
    return float(brentq(lambda a: sum(a**i for i in range(1, k + 1)) - mean_accepted_per_step, 0.0, 1.0, xtol=1e-14))


def fit_aggregate_acceptance(
    *,
    num_speculative_tokens: int,
    requests: Sequence[tuple[float, float]],
    k_max: int | None = None,
    design_effect: float = 1.0,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
) -> AcceptanceFit:
    """Geometric acceptance from per-request (drafted tokens, accepted tokens) at draft length k.

    Pass one pair of totals when per-request figures are not available. Raises FitError when
    nothing was drafted or a pair is impossible.
    """
    k = num_speculative_tokens
    if k < 1:
        raise FitError("aggregate acceptance needs the draft length k >= 1 it was measured at.")
    pairs = np.asarray(list(requests), dtype=float).reshape(-1, 2) if len(requests) else np.zeros((0, 2))
    if not np.all(np.isfinite(pairs)) or np.any(pairs < 0) or np.any(pairs[:, 1] > pairs[:, 0]):
        raise FitError("each request needs 0 <= accepted <= drafted tokens; check the timings fields read.")
    drafted, accepted = pairs[:, 0], pairs[:, 1]
    steps = drafted / k
    if steps.sum() <= 0:
        raise FitError("no drafted tokens were reported: measure with speculation on.")
    check_design_effect(design_effect)
    k_max = max(10, k) if k_max is None else k_max
    if k_max < 1 or draws < 1:
        raise FitError("k_max and draws must be at least 1.")
    mean = float(accepted.sum() / steps.sum())
    a = geometric_rate(mean, k)
    theta = float(np.clip(logit(min(max(a, 1e-13), 1 - 1e-13)), -BOUND, BOUND))
    used = drafted > 0
    if used.sum() >= 2:
        variance = _bootstrap_variance(steps[used], accepted[used], k, draws=draws, seed=seed)
        how = f"bootstrap over {int(used.sum())} requests"
    else:
        variance = design_effect * _independent_steps_variance(a, k, float(steps.sum()))
        how = "totals only: steps treated as independent (times the design effect), so the band is optimistic"
    fit = ModelFit(
        name="geometric",
        param_names=("a",),
        params=(a,),
        unconstrained=(theta,),
        covariance=((min(variance, MAX_VARIANCE),),),
        num_params=1,
        log_likelihood=None,
        aic=None,
        akaike_weight=1.0,
        per_position=tuple(a**i for i in range(1, k_max + 1)),
        conditional=(a,) * k_max,
    )
    result = AcceptanceFit(
        source="aggregate",
        num_drafts=float(steps.sum()),
        accepted_per_position=(),
        num_speculative_tokens=k,
        measured_positions=0,
        k_max=k_max,
        design_effect=design_effect,
        confidence=confidence,
        positions=(),
        models=(fit,),
        saturated=None,
        chosen="geometric",
        choice_reason=(
            f"aggregate counts identify only the geometric rate: a = {a:.4f} from {mean:.4f} accepted "
            f"per step at k = {k}; interval by {how}."
        ),
        draws=draws,
        seed=seed,
    )
    return replace(result, prediction=predict_draft_lengths(result))


def _bootstrap_variance(steps: np.ndarray, accepted: np.ndarray, k: int, *, draws: int, seed: int) -> float:
    """Variance of logit(a) over requests resampled with replacement."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, steps.size, size=(draws, steps.size))
    means = accepted[picks].sum(axis=1) / steps[picks].sum(axis=1)
    rates = np.clip([geometric_rate(m, k) for m in means], 1e-13, 1 - 1e-13)
    return float(np.var(np.clip(logit(rates), -BOUND, BOUND), ddof=1)) if draws > 1 else MAX_VARIANCE


def _independent_steps_variance(a: float, k: int, steps: float) -> float:
    """Delta-method variance of logit(a) when each of ``steps`` steps is an independent draw of A."""
    a = min(max(a, 1e-9), 1 - 1e-9)
    survival = np.array([a**i for i in range(1, k + 1)])
    positions = np.arange(1, k + 1)
    mean = survival.sum()
    variance_a_count = float(np.sum((2 * positions - 1) * survival) - mean**2)  # Var(A) for one step
    slope = float(np.sum(positions * a ** (positions - 1)))  # d mean / d a
    variance_rate = variance_a_count / steps / slope**2
    return min(variance_rate / (a * (1 - a)) ** 2, MAX_VARIANCE) if math.isfinite(variance_rate) else MAX_VARIANCE
