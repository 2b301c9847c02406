"""How much an untried configuration could still give: the search's predictions and upper bounds.

For a candidate (a drafter at k) and the objective's concurrency B, per workload w the prediction
is B E_w(k) / T_w(k) and the upper bound B E_w,high(k) / T_w,low(k), weighted like the objective.
E_high is the acceptance fit's band; T_low = T(k) - z sd(T(k)) from the step-time line's
covariance, never below the step time with speculation off (drafting does not make a step
faster). A drafter measured at one draft length has no slope yet: its bound allows twice the
slope through the off point, or, when its sibling (the same method with the other draft
sampling) has a pinned line, that line's relative slope and its interval.

The models are the report's (analysis/study.py: ``model_workload``), so the search stops on
the model the report draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.study import WorkloadModel
from specsweep.analysis.throughput import StepTimeFit, ThroughputModel

UPPER_Z = 1.645  # one-sided 95% for the step time
MIN_NOISE = 0.01  # below this a relative sd from a few residuals is luck (measurement alone is ~1.5% off)


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateScore:
    """One untried configuration: predicted objective and its upper bound."""

    candidate: Candidate
    predicted: float
    upper: float
    line_pinned: bool  # the drafter's step time is known at two or more draft lengths

    @property
    def drafter(self) -> Drafter:
        assert self.candidate.drafter is not None
        return self.candidate.drafter

    @property
    def num_speculative_tokens(self) -> int:
        return self.candidate.num_speculative_tokens


def measured_noise(model: ThroughputModel) -> float | None:
    """The pooled relative sd, when some fit has residual degrees of freedom (else None: not measured)."""
    has_df = any(f.residual_df > 0 for f in model.fits) or any(p.observations > 1 for f in model.fits for p in f.points)
    return max(model.pooled_relative_sd, MIN_NOISE) if has_df else None


def study_noise(models: Mapping[str, WorkloadModel]) -> float | None:
    """The largest measured noise of the workloads' models (None while no model has measured one)."""
    noises = [n for m in models.values() if m.throughput is not None and (n := measured_noise(m.throughput))]
    return max(noises) if noises else None


def score_candidates(
    models: Mapping[str, WorkloadModel],
    candidates: Sequence[Candidate],
    *,
    concurrency: int,
    weights: Mapping[str, float],
    noise: float | None,
    upper_z: float = UPPER_Z,
) -> list[CandidateScore]:
    """Prediction and upper bound of every candidate the models can predict for every workload."""
    weight_sum = sum(weights.values())
    scores = []
    for candidate in candidates:
        drafter, k = candidate.drafter, candidate.num_speculative_tokens
        if drafter is None:
            continue
        predicted = upper = 0.0
        pinned = True
        for name, weight in weights.items():
            model = models.get(name)
            fit = model.fits.get(drafter) if model is not None else None
            throughput = model.throughput if model is not None else None
            line = throughput.fit_for(concurrency, drafter) if throughput is not None else None
            if fit is None or line is None or throughput is None or k > fit.k_max:
                break
            sibling = next(
                (
                    other
                    for d in model.fits
                    if d.method == drafter.method and d != drafter and (other := throughput.fit_for(concurrency, d))
                ),
                None,
            )
            t_point, t_low = step_time_bounds(line, k, upper_z, noise or throughput.pooled_relative_sd, sibling)
            off = throughput.fit_for(concurrency, None)
            if off is not None:
                t_floor = off.step_time_s(0)[0]
                t_low, t_point = max(t_low, t_floor), max(t_point, t_floor)
            row = fit.prediction[k - 1]
            predicted += weight * concurrency * row.tokens_per_step / t_point
            upper += weight * concurrency * row.tokens_per_step_high / t_low
            pinned = pinned and not line.wide_band
        else:
            scores.append(
                CandidateScore(
                    candidate=candidate, predicted=predicted / weight_sum, upper=upper / weight_sum, line_pinned=pinned
                )
            )
    return scores


def step_time_bounds(
    fit: StepTimeFit, k: int, z: float, noise: float, sibling: StepTimeFit | None
) -> tuple[float, float]:
    """Point step time at k and its optimistic (low) bound."""
    point, source = fit.step_time_s(k)
    if source == "measured":
        return point, point
    if fit.wide_band and sibling is not None and not sibling.wide_band and sibling.intercept_s > 0:
        return _borrowed_bounds(fit, k, z, noise, sibling)
    if fit.wide_band:
        anchor = fit.points[0]
        steepest = 2.0 * fit.slope_s_per_token
        return point, anchor.step_time_s - steepest * (anchor.num_speculative_tokens - k)
    (vaa, vab), (_, vbb) = fit.covariance
    # The covariance carries the fit's own residual sd; rescale it to the pooled noise.
    scale = (noise / fit.relative_sd) ** 2 if fit.relative_sd > 0 else 1.0
    sd = math.sqrt(max(vaa + 2 * k * vab + k * k * vbb, 0.0) * scale)
    return point, point - z * sd


def _borrowed_bounds(fit: StepTimeFit, k: int, z: float, noise: float, sibling: StepTimeFit) -> tuple[float, float]:
    """A drafter measured at one k, shaped like its sibling's pinned line: T(k) = T(k1) (1 + r k) / (1 + r k1).

    Drawing the drafts another way scales the whole step by a near-constant factor (the
    emulator's ``probabilistic_factor``; vLLM's extra sampling work), so the relative slope
    r = b / a carries over. Its sd comes from the sibling's covariance (delta method), the
    anchor's from the noise.
    """
    anchor = fit.points[0]
    k1, t1 = anchor.num_speculative_tokens, anchor.step_time_s
    a, b = sibling.intercept_s, sibling.slope_s_per_token
    (vaa, vab), (_, vbb) = sibling.covariance
    scale = (noise / sibling.relative_sd) ** 2 if sibling.relative_sd > 0 else 1.0
    r = b / a
    var_r = max(vbb / a**2 - 2 * b * vab / a**3 + b**2 * vaa / a**4, 0.0) * scale
    r_low, r_high = max(r - z * math.sqrt(var_r), 0.0), r + z * math.sqrt(var_r)

    def shaped(rate: float) -> float:
        return t1 * (1 + rate * k) / (1 + rate * k1)

    optimistic = min(shaped(r_low), shaped(r_high)) * (1 - z * noise / math.sqrt(anchor.observations))
    return shaped(r), optimistic
