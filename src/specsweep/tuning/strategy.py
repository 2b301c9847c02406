"""Model-guided search: which configuration to restart the server with next, or that none is worth it.

Every decision is derived from the study's trials alone (their typed records), so ``--resume``
and several workers sharing one storage continue where the stored trials leave off. The study
loop enqueues the decision as an optuna trial.

Order of decisions:

1. speculation off, when the space has it (the floor every drafter's step time is above);
2. each drafter (draft method and opened fields) at its largest draft length that has not failed:
   for chain drafters one run at the largest k measures the acceptance of every smaller k
   (E(k) = 1 + S_1 + ... + S_k);
3. then the untried configuration with the highest upper bound of the predicted objective.
   The prediction is the analysis layer's, on the report's own models (analysis/study.py:
   ``model_workload`` per workload; analysis/bounds.py for the bounds). While a drafter has one draft length
   measured its step-time slope is unknown and the bound is wide, so the next pick of that
   drafter pins the line; after that the bound is tight and the picks are the predicted
   optimum and its neighbours.

Stopping: the noise is the largest of the workloads' pooled relative sd (residuals of lines
through three or more draft lengths, or repeats of one configuration). Once it is measured, the
search stops when no untried configuration's upper bound beats the best measured objective by
more than that noise.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specsweep.analysis.bounds import CandidateScore, score_candidates, study_noise
from specsweep.analysis.drafters import Candidate, Drafter, drafter_of
from specsweep.analysis.study import WorkloadModel, model_workload, study_k_max
from specsweep.errors import FitError
from specsweep.tuning.records import TrialRecord
from specsweep.tuning.space import OFF_KEY, Space, config_key
from specsweep.types import MeasuredConfig

ACCEPTANCE_CONFIDENCE = 0.90  # the acceptance band of the upper bound (one-sided 95%)
ACCEPTANCE_DRAWS = 200


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
    models: Mapping[str, WorkloadModel]  # what the decision was made on (empty before any drafter ran)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    key: str
    params: dict[str, Any]
    candidate: Candidate

    @property
    def k(self) -> int:
        return self.candidate.num_speculative_tokens

    @property
    def drafter(self) -> Drafter | None:
        return self.candidate.drafter


def decide_next(
    trials: Sequence[TrialRecord],
    space: Space,
    *,
    concurrency: int,
    workloads: Mapping[str, float],
    exclude: Collection[str] = (),
) -> SearchDecision:
    """The next configuration to measure, from the study's trials (see the module doc).

    ``exclude``: keys not to choose, e.g. the ones that failed in this run (a failure stored
    by an earlier run is tried again, as the study loop does for every sampler).
    """
    configs = _space_configs(space)
    measured = [t for t in trials if t.measured]
    measured_keys = {t.key for t in measured}
    running = {t.key for t in trials if t.running and t.key is not None}
    failed = set(exclude) - measured_keys
    untried = [c for c in configs.values() if c.key not in measured_keys | failed | running]
    best = max((t for t in measured if t.feasible), key=lambda t: float(t.value or 0.0), default=None)

    def decision(config: _Config | None, phase: str, reason: str, **extra: Any) -> SearchDecision:
        return SearchDecision(
            params=None if config is None else dict(config.params),
            key=None if config is None else config.key,
            phase=phase,
            reason=reason,
            best_key=best.key if best else None,
            best_objective=float(best.value or 0.0) if best else None,
            noise=extra.get("noise"),
            candidates=extra.get("candidates", ()),
            models=extra.get("models", {}),
        )

    off = configs.get(OFF_KEY)
    if off is not None and off in untried:
        return decision(off, "speculation off", "speculation off first: the floor of every drafter's step time")
    by_drafter: dict[Drafter, list[_Config]] = {}
    for c in configs.values():
        if c.drafter is not None and c.key not in failed:
            by_drafter.setdefault(c.drafter, []).append(c)
    for drafter, group in by_drafter.items():
        largest = max(group, key=lambda c: c.k)
        done = any(drafter_of(t.spec) == drafter and t.num_speculative_tokens >= largest.k for t in measured)
        if largest in untried and not done:
            return decision(
                largest,
                "largest k",
                f"k={largest.k} is the largest draft length of {drafter.label}: one run there gives the "
                "acceptance of every shorter draft",
            )
    if not untried:
        busy = f" ({len(running)} being measured by other workers)" if running else ""
        return decision(None, "stop", f"every configuration of the space was measured or failed{busy}")
    if not any(t.num_speculative_tokens for t in measured):
        if any(configs[key].drafter is not None for key in running if key in configs):
            # Another worker is measuring a drafter's largest k: its acceptance curve is what
            # every further choice needs, so wait for it instead of guessing.
            return decision(None, "wait", "waiting for another worker's largest-k trial: its acceptance is needed next")
        return decision(None, "stop", "no drafter could be measured (every one failed)")
    measured_configs = [t.measured_config() for t in measured]
    models = model_search(measured_configs, workloads, k_max=max(c.k for c in configs.values()))
    noise = study_noise(models)
    scores = score_candidates(
        models, [c.candidate for c in untried], concurrency=concurrency, weights=workloads, noise=noise
    )
    if not any(m.fits for m in models.values()):
        # Without a model (e.g. no acceptance counters), fall back to the largest untried k of the best drafter.
        fallback = max(untried, key=lambda c: (c.drafter is not None, c.k))
        reason = "no prediction possible (no measured drafter reported acceptance counts)"
        return decision(fallback, "largest k", f"{reason}; measuring the largest untried k", models=models)
    if not scores:
        return decision(None, "stop", "no untried configuration of a measured drafter is left", noise=noise)
    extra = {"noise": noise, "candidates": tuple(scores), "models": models}
    top = max(scores, key=lambda s: s.upper)
    if best is not None and noise is not None and top.upper <= float(best.value or 0.0) * (1.0 + noise):
        label = _measured_label(best)
        return decision(
            None,
            "stop",
            f"no untried configuration can beat the best measured one ({label}, {best.value:.1f} tok/s) by more "
            f"than the measured noise ({100 * noise:.1f}%): the highest upper bound is "
            f"{top.candidate.short_label} at {top.upper:.1f} tok/s",
            **extra,
        )
    best_point = max(scores, key=lambda s: s.predicted)
    worth = [s for s in scores if s.line_pinned and (best is None or s.upper > float(best.value or 0.0))]
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
        f"{top.candidate.short_label}: predicted {top.predicted:.1f} tok/s, up to {top.upper:.1f}"
        + (f" (best measured {best.value:.1f})" if best else "")
        + ("" if top.line_pinned else f"; {top.drafter.label}'s step-time slope is known from one draft length only")
        + (f"; the highest prediction is {best_point.candidate.short_label}" if best_point is not top else "")
        + ("" if noise is not None else "; the run-to-run noise is not measured yet")
    )
    chosen = next(c for c in untried if c.candidate == top.candidate)
    return decision(chosen, phase, reason, **extra)


def model_search(
    configs: Sequence[MeasuredConfig], workloads: Mapping[str, float], *, k_max: int
) -> dict[str, WorkloadModel]:
    """The report's models of every workload, with the acceptance band the upper bounds use."""
    k_max = study_k_max(configs, k_max)
    out = {}
    for name in workloads:
        try:
            out[name] = model_workload(
                configs, name, k_max=k_max, confidence=ACCEPTANCE_CONFIDENCE, draws=ACCEPTANCE_DRAWS
            )
        except FitError:
            continue
    return out


def _space_configs(space: Space) -> dict[str, _Config]:
    out: dict[str, _Config] = {}
    for params in space.distinct_params():
        spec = space.config_from_params(params)
        drafter = drafter_of(spec)
        k = int(params["num_speculative_tokens"])
        candidate = Candidate(drafter=drafter if k else None, num_speculative_tokens=k if drafter else 0)
        out[config_key(spec)] = _Config(key=config_key(spec), params=params, candidate=candidate)
    return out


def _measured_label(record: TrialRecord) -> str:
    drafter = drafter_of(record.spec)
    return Candidate(drafter=drafter, num_speculative_tokens=record.num_speculative_tokens).short_label
