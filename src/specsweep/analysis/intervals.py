"""Binomial intervals for acceptance rates, with clustering folded in as a design effect, and the
per-position estimates (S_i, p_i) with their intervals.

Drafted steps are not independent: steps of one request share its context, so the counts carry
less information than their size suggests. The design effect 1 + (m - 1) rho (m steps per
request, rho the within-request correlation) divides the effective sample size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.stats import norm

from specsweep.measurement.acceptance import conditional_from_unconditional


def z_value(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` (1.96 at 0.95)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must lie strictly between 0 and 1")
    return float(norm.ppf(0.5 + confidence / 2.0))


def wilson_interval(
    successes: float, trials: float, *, confidence: float = 0.95, design_effect: float = 1.0
) -> tuple[float, float]:
    """Wilson score interval for successes / trials, both divided by the design effect first.

    With no trials nothing is known and the interval is (0, 1).
    """
    if design_effect < 1.0:
        raise ValueError("the design effect is at least 1")
    if trials <= 0:
        return 0.0, 1.0
    n = trials / design_effect
    x = min(max(successes, 0.0), trials) / design_effect
    z = z_value(confidence)
    centre = (x + z * z / 2.0) / (n + z * z)
    half = z / (n + z * z) * math.sqrt(max(x * (n - x) / n, 0.0) + z * z / 4.0)
    rate = x / n  # the interval always holds it; min/max only guard against rounding at 0 and 1
    return max(0.0, min(centre - half, rate)), min(1.0, max(centre + half, rate))


@dataclass(frozen=True, slots=True, kw_only=True)
class PositionEstimate:
    """What was measured at one position, with Wilson intervals."""

    position: int
    reached: float  # n_(i-1): steps that accepted every earlier position
    accepted: float  # n_i
    per_position: float  # S_i = n_i / n_0
    per_position_low: float
    per_position_high: float
    conditional: float | None  # p_i = n_i / n_(i-1); None when no step reached position i
    conditional_low: float | None
    conditional_high: float | None


def position_estimates(counts: np.ndarray, *, confidence: float, design_effect: float) -> tuple[PositionEstimate, ...]:
    """S_i and p_i per measured position, each with its Wilson interval."""
    n0 = counts[0]
    per_position = [float(c / n0) for c in counts[1:]]
    conditional = conditional_from_unconditional(per_position)
    interval = partial(wilson_interval, confidence=confidence, design_effect=design_effect)
    out = []
    for i in range(1, counts.size):
        reached, accepted = float(counts[i - 1]), float(counts[i])
        s_low, s_high = interval(accepted, n0)
        p = conditional[i - 1] if reached > 0 else None
        p_low, p_high = interval(accepted, reached) if reached > 0 else (None, None)
        out.append(
            PositionEstimate(
                position=i,
                reached=reached,
                accepted=accepted,
                per_position=per_position[i - 1],
                per_position_low=s_low,
                per_position_high=s_high,
                conditional=None if p is None else float(p),
                conditional_low=p_low,
                conditional_high=p_high,
            )
        )
    return tuple(out)
