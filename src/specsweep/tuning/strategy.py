"""Model-guided search: which configuration to restart the server with next, or that none is worth it.

Every decision is derived from the study's trials alone (their parameters and ``results``
attributes), so ``--resume`` and several workers sharing one storage continue where the
stored trials leave off. The study loop enqueues the decision as an optuna trial.

Order of decisions:

1. speculation off, when the space has it (the floor every drafter's step time is above);
2. each drafter (draft method and opened fields) at its largest draft length that has not failed:
   for chain drafters one run at the largest k measures the acceptance of every smaller k
   (E(k) = 1 + S_1 + ... + S_k);
3. then the untried configuration with the highest upper bound of the predicted objective.
   The prediction is the analysis layer's: ``fit_acceptance`` per drafter and workload, and
   ``fit_throughput_model`` for step time against k. While a drafter has one draft length
   measured its step-time slope is unknown and the bound is wide, so the next pick of that
   drafter pins the line; after that the bound is tight and the picks are the predicted
   optimum and its neighbours.

Upper bound of a candidate: for each workload B * E_high(k) / T_low(k), weighted like the
objective, with E_high the acceptance fit's band and T_low = T(k) - z sd(T(k)) from the line's
covariance (for a one-point line, the steepest slope its band allows), never below the
step time with speculation off (drafting does not make a step faster).

Stopping: the noise is the throughput model's pooled relative sd (residuals of lines through
three or more draft lengths, or repeats of one configuration). Once it is measured, the search
stops when no untried configuration's upper bound beats the best measured objective by more
than that noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.analysis.study import drafter_of
from specsweep.analysis.throughput import (
    Drafter,
    StepTimeFit,
    ThroughputModel,
    ThroughputObservation,
    fit_throughput_model,
)
from specsweep.errors import FitError
from specsweep.tuning.space import OFF, Space, config_key

UPPER_Z = 1.645  # one-sided 95% for the step time; the acceptance band is the fit's 90% band
ACCEPTANCE_CONFIDENCE = 0.90
MIN_NOISE = 0.01  # below this a relative sd from a few residuals is luck (measurement alone is ~1.5% off)


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateScore:
    """One untried configuration: predicted objective and its upper bound."""

    key: str
    num_speculative_tokens: int
    drafter: Drafter
    predicted: float
    upper: float
    line_pinned: bool  # the drafter's step time is known at two or more draft lengths


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchDecision:
    """The next configuration to measure (``params``), or None with the reason to stop."""

    params: dict[str, Any] | None
    key: str | None
    phase: str  # "speculation off", "largest k", "pin the step-time line", "predicted optimum", "upper bound",
    # "stop", or "wait" (params None: another worker is measuring what the next choice needs)
    reason: str
    best_key: str | None
    best_objective: float | None
    noise: float | None  # measured relative sd; None while unmeasured
    candidates: tuple[CandidateScore, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    key: str
    params: dict[str, Any]
    k: int
    drafter: Drafter | None  # None: speculation off


@dataclass(frozen=True, slots=True, kw_only=True)
class _Measured:
    key: str
    k: int
    drafter: Drafter | None
    objective: float
    feasible: bool
    results: dict[str, Any]


def decide_next(
    trials: Sequence[optuna.trial.FrozenTrial],
    space: Space,
    *,
    concurrency: int,
    workloads: Mapping[str, float],
    exclude: Collection[str] = (),
    upper_z: float = UPPER_Z,
) -> SearchDecision:
    """The next configuration to measure, from the study's trials (see the module doc).

    ``exclude``: keys not to choose, e.g. the ones that failed in this run (a failure stored
    by an earlier run is tried again, as the study loop does for every sampler).
    """
    configs = _space_configs(space)
    measured, running = _read_trials(trials, configs)
    failed = set(exclude) - set(measured)
    untried = [c for c in configs.values() if c.key not in measured and c.key not in failed and c.key not in running]
    best = max((m for m in measured.values() if m.feasible), key=lambda m: m.objective, default=None)

    def decision(config: _Config, phase: str, reason: str, **extra: Any) -> SearchDecision:
        return SearchDecision(
            params=dict(config.params),
            key=config.key,
            phase=phase,
            reason=reason,
            best_key=best.key if best else None,
            best_objective=best.objective if best else None,
            noise=extra.get("noise"),
            candidates=extra.get("candidates", ()),
        )

    off = configs.get(OFF)
    if off is not None and off in untried:
        return decision(off, "speculation off", "speculation off first: the floor of every drafter's step time")
    by_drafter: dict[Drafter, list[_Config]] = {}
    for c in configs.values():
        if c.drafter is not None and c.key not in failed:
            by_drafter.setdefault(c.drafter, []).append(c)
    for drafter, group in by_drafter.items():
        largest = max(group, key=lambda c: c.k)
        if largest in untried and not any(m.drafter == drafter and m.k >= largest.k for m in measured.values()):
            return decision(
                largest,
                "largest k",
                f"k={largest.k} is the largest draft length of {_name(drafter)}: one run there gives the "
                "acceptance of every shorter draft",
            )
    if not untried:
        busy = f" ({len(running)} being measured by other workers)" if running else ""
        return _stop(f"every configuration of the space was measured or failed{busy}", best, None, ())
    if not any(m.drafter is not None for m in measured.values()):
        if any(configs[key].drafter is not None for key in running if key in configs):
            # Another worker is measuring a drafter's largest k: its acceptance curve is what
            # every further choice needs, so wait for it instead of guessing.
            return replace(
                _stop("waiting for another worker's largest-k trial: its acceptance is needed next", best, None, ()),
                phase="wait",
            )
        return _stop("no drafter could be measured (every one failed)", best, None, ())
    try:
        scores, noise = _score(measured, untried, concurrency=concurrency, workloads=workloads, upper_z=upper_z)
    except FitError as exc:
        # Without a model (e.g. no acceptance counters), fall back to the largest untried k of the best drafter.
        fallback = max(untried, key=lambda c: (c.drafter is not None, c.k))
        return decision(fallback, "largest k", f"no prediction possible ({exc}); measuring the largest untried k")
    if not scores:
        return _stop("no untried configuration of a measured drafter is left", best, noise, ())
    top = max(scores, key=lambda s: s.upper)
    if best is not None and noise is not None:
        threshold = best.objective * (1.0 + noise)
        if top.upper <= threshold:
            return _stop(
                f"no untried configuration can beat the best measured one ({_describe(best)}, {best.objective:.1f} "
                f"tok/s) by more than the measured noise ({100 * noise:.1f}%): the highest upper bound is "
                f"{_label(top)} at {top.upper:.1f} tok/s",
                best,
                noise,
                tuple(scores),
            )
    best_point = max(scores, key=lambda s: s.predicted)
    worth = [s for s in scores if s.line_pinned and (best is None or s.upper > best.objective)]
    if noise is None and worth:
        # A third draft length on a pinned line measures the noise every other bound needs.
        top = max(worth, key=lambda s: s.upper)
    if top.line_pinned:
        phase = "predicted optimum" if top is best_point else "upper bound"
    else:
        # A drafter whose step-time line is not pinned yet: measure its predicted optimum, which
        # pins the line and tests the prediction in one restart.
        top = max((s for s in scores if s.drafter == top.drafter), key=lambda s: s.predicted)
        phase = "pin the step-time line"
    reason = (
        f"{_label(top)}: predicted {top.predicted:.1f} tok/s, up to {top.upper:.1f}"
        + (f" (best measured {best.objective:.1f})" if best else "")
        + ("" if top.line_pinned else f"; {_name(top.drafter)}'s step-time slope is known from one draft length only")
        + (f"; the highest prediction is {_label(best_point)}" if best_point is not top else "")
        + ("" if noise is not None else "; the run-to-run noise is not measured yet")
    )
    chosen = next(c for c in untried if c.key == top.key)
    return decision(chosen, phase, reason, noise=noise, candidates=tuple(scores))


def _stop(reason: str, best: _Measured | None, noise: float | None, scores: tuple) -> SearchDecision:
    return SearchDecision(
        params=None,
        key=None,
        phase="stop",
        reason=reason,
        best_key=best.key if best else None,
        best_objective=best.objective if best else None,
        noise=noise,
        candidates=scores,
    )


def _space_configs(space: Space) -> dict[str, _Config]:
    out: dict[str, _Config] = {}
    for params in space.distinct_params():
        spec = space.config_from_params(params)
        key = config_key(spec)
        k = int(params["num_speculative_tokens"])
        out[key] = _Config(key=key, params=params, k=k, drafter=drafter_of(spec) if k else None)
    return out


def _read_trials(
    trials: Sequence[optuna.trial.FrozenTrial], configs: Mapping[str, _Config]
) -> tuple[dict[str, _Measured], set[str]]:
    """Measured configurations (a repeat under its own ``key#trial`` name) and the keys being measured."""
    measured: dict[str, _Measured] = {}
    running: set[str] = set()
    state = optuna.trial.TrialState
    for trial in trials:
        attrs = trial.user_attrs
        key = attrs.get("key")
        if key is None:
            continue
        if trial.state == state.RUNNING:
            running.add(key)
        elif trial.state == state.COMPLETE and "results" in attrs and "reused_from" not in attrs:
            config = configs.get(key)
            k = config.k if config else _k_of(attrs)
            drafter = config.drafter if config else None
            record = _Measured(
                key=f"{key}#{trial.number}" if key in measured else key,
                k=k,
                drafter=drafter if k else None,
                objective=float(trial.value or 0.0),
                feasible=all(c <= 0 for c in attrs.get("constraints", [0.0])),
                results=attrs["results"],
            )
            measured[record.key] = record
    return measured, running


def _k_of(attrs: Mapping[str, Any]) -> int:
    spec = attrs.get("spec")
    return 0 if spec is None else int(json.loads(spec).get("num_speculative_tokens", 0))


def _score(
    measured: Mapping[str, _Measured],
    untried: Sequence[_Config],
    *,
    concurrency: int,
    workloads: Mapping[str, float],
    upper_z: float,
) -> tuple[list[CandidateScore], float | None]:
    model = fit_throughput_model(_observations(measured.values()))
    noise = _measured_noise(model)
    acceptance = _acceptance_fits(measured.values(), workloads, k_max=max(c.k for c in untried) or 1)
    off_fit = model.fit_for(concurrency, None)
    weight_sum = sum(workloads.values())
    scores = []
    for config in untried:
        if config.drafter is None or config.drafter not in acceptance:
            continue
        fit = model.fit_for(concurrency, config.drafter)
        if fit is None:
            continue
        sibling = next(
            (
                model.fit_for(concurrency, d)
                for d in acceptance
                if d.method == config.drafter.method and d != config.drafter and model.fit_for(concurrency, d)
            ),
            None,
        )
        t_point, t_low = _step_time_bounds(fit, config.k, upper_z, noise or model.pooled_relative_sd, sibling)
        if off_fit is not None:
            t_floor = off_fit.step_time_s(0)[0]
            t_low = max(t_low, t_floor)
            t_point = max(t_point, t_floor)
        predicted = upper = 0.0
        for name, weight in workloads.items():
            fits = acceptance[config.drafter]
            if name not in fits or config.k > fits[name].k_max:
                break
            row = fits[name].prediction[config.k - 1]
            predicted += weight * concurrency * row.tokens_per_step / t_point
            upper += weight * concurrency * row.tokens_per_step_high / t_low
        else:
            scores.append(
                CandidateScore(
                    key=config.key,
                    num_speculative_tokens=config.k,
                    drafter=config.drafter,
                    predicted=predicted / weight_sum,
                    upper=upper / weight_sum,
                    line_pinned=not fit.wide_band,
                )
            )
    return scores, noise


def _observations(measured) -> list[ThroughputObservation]:
    out = []
    for m in measured:
        for workload, levels in m.results.items():
            for level, row in levels.items():
                rate = row.get("output_tokens_per_s")
                e = 1.0 if m.drafter is None else row.get("mean_acceptance_length")
                if not rate or not e or rate <= 0:
                    continue
                out.append(
                    ThroughputObservation(
                        num_speculative_tokens=m.k if m.drafter is not None else 0,
                        concurrency=int(level),
                        output_tokens_per_s=float(rate),
                        tokens_per_step=float(e),
                        drafter=m.drafter,
                        workload=workload,
                    )
                )
    return out


def _measured_noise(model: ThroughputModel) -> float | None:
    """The pooled relative sd, when some fit has residual degrees of freedom (else None: not measured)."""
    has_df = any(f.residual_df > 0 for f in model.fits) or any(p.observations > 1 for f in model.fits for p in f.points)
    return max(model.pooled_relative_sd, MIN_NOISE) if has_df else None


def _acceptance_fits(
    measured, workloads: Mapping[str, float], *, k_max: int
) -> dict[Drafter, dict[str, AcceptanceFit]]:
    """Per drafter and workload: the fit from its trial at the largest k, counts summed over levels."""
    longest: dict[Drafter, _Measured] = {}
    for m in measured:
        if m.drafter is not None and (m.drafter not in longest or m.k > longest[m.drafter].k):
            longest[m.drafter] = m
    out: dict[Drafter, dict[str, AcceptanceFit]] = {}
    for drafter, m in longest.items():
        fits = {}
        for name in workloads:
            drafts, accepted = 0.0, None
            for row in m.results.get(name, {}).values():
                counts = row.get("accepted_per_position")
                if not row.get("num_drafts") or not counts:
                    continue
                drafts += float(row["num_drafts"])
                accepted = list(counts) if accepted is None else [a + b for a, b in zip(accepted, counts, strict=False)]
            if accepted and drafts > 0:
                fits[name] = fit_acceptance(
                    num_drafts=drafts,
                    accepted_per_position=accepted[: m.k],
                    k_max=max(k_max, m.k),
                    confidence=ACCEPTANCE_CONFIDENCE,
                    draws=200,
                )
        if fits:
            out[drafter] = fits
    if not out:
        raise FitError("no measured drafter reported per-position acceptance counts")
    return out


def _step_time_bounds(
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


def _name(drafter: Drafter) -> str:
    return f"{drafter.method} ({drafter.draft_sample_method})"


def _label(score: CandidateScore) -> str:
    return f"k={score.num_speculative_tokens} {score.drafter.draft_sample_method}"


def _describe(m: _Measured) -> str:
    if m.drafter is None:
        return "speculation off"
    return f"k={m.k} {m.drafter.draft_sample_method}"
