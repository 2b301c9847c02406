"""Model-guided search: which configuration to restart the server with next, or that none is worth it.

Every decision is derived from the study's trials alone (their typed records), so ``--resume``
and several workers sharing one storage continue where the stored trials leave off. The study
loop enqueues the decision as an optuna trial. Every cell the study reports, each (workload,
concurrency level), counts: a configuration is worth a restart when it could change the
recommendation of any cell, and with it the per-batch-size table of the paste.

Order of decisions (docs/search.md):

1. speculation off, when the space has it (the floor every drafter's step time is above);
2. each drafter (draft method and opened fields) at its largest draft length that has not failed:
   for chain drafters one run at the largest k measures the acceptance of every smaller k;
3. a drafter whose step-time line rests on one draft length: its predicted optimum, which pins
   the line and tests the prediction in one restart;
4. the best measured configuration once more (until some configuration was measured twice): the
   run-to-run noise of each workload (analysis/noise.py) that every further decision compares with;
5. the untried configuration that could gain most in some cell: its upper bound (analysis/bounds.py,
   on the report's own models) over the cell's best measured rate, beyond that workload's noise;
6. when no untried configuration can: each cell's recommendation that was never measured
   ("confirm"), then leaders the data cannot tell apart, measured again in turn ("separate"),
   each up to ``MAX_STARTS`` server starts;
7. stop, saying why (and which leaders stayed tied).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specsweep.analysis.bounds import CandidateScore, measured_noise, score_candidates
from specsweep.analysis.drafters import Candidate, Drafter, drafter_of
from specsweep.analysis.noise import RunNoise, run_to_run_noise
from specsweep.analysis.recommendation import Recommendation
from specsweep.analysis.study import (
    StudyAnalysis,
    WorkloadModel,
    analyze_with_settings,
    measured_rates,
    model_workload,
    study_k_max,
)
from specsweep.errors import FitError
from specsweep.tuning.records import TrialRecord
from specsweep.tuning.space import OFF_KEY, Space, config_key
from specsweep.types import MeasuredConfig, StudySettings

ACCEPTANCE_CONFIDENCE = 0.90  # the acceptance band of the upper bound (one-sided 95%)
ACCEPTANCE_DRAWS = 200
MAX_STARTS = 2  # server starts of one configuration, repeats included, while separating leaders
SEPARATION_MARGIN = 0.01  # leaders are separated when the runner-up could be this much faster


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchDecision:
    """The next configuration to measure (``params``), or None with the reason to stop."""

    params: dict[str, Any] | None
    key: str | None
    phase: str  # "speculation off", "largest k", "pin the step-time line", "repeat", "upper bound",
    # "confirm", "separate", "stop", or "wait" (params None: another worker is measuring what is needed)
    reason: str
    repeat: bool  # params were measured before: measure them again (not a duplicate to reuse)
    best_key: str | None
    best_objective: float | None
    noise: Mapping[str, RunNoise]  # per workload, once repeats or sibling pairs measured it
    candidates: tuple[CandidateScore, ...]
    models: Mapping[str, WorkloadModel]  # what the decision was made on (empty before any drafter ran)
    ties: tuple[str, ...] = ()  # at a stop: leaders that stayed tied, and what would separate them


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
    settings: StudySettings,
    *,
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
    failed = set(exclude) - measured_keys  # never measured: not to be tried
    # failed in this run, measured or not: not to be measured again (a repeat, a tie to separate);
    # choosing it would only fail again, or be turned away by the study loop, forever
    blocked = set(exclude) | running
    untried = [c for c in configs.values() if c.key not in measured_keys | failed | running]
    objective = settings.objective_concurrency
    weights = settings.workload_weights
    best = max((t for t in measured if t.feasible), key=lambda t: float(t.value or 0.0), default=None)

    def decision(
        config: _Config | None, phase: str, reason: str, *, repeat: bool = False, **extra: Any
    ) -> SearchDecision:
        return SearchDecision(
            params=None if config is None else dict(config.params),
            key=None if config is None else config.key,
            phase=phase,
            reason=reason,
            repeat=repeat,
            best_key=best.key if best else None,
            best_objective=float(best.value or 0.0) if best else None,
            noise=extra.get("noise", {}),
            candidates=extra.get("candidates", ()),
            models=extra.get("models", {}),
            ties=extra.get("ties", ()),
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
    if not any(t.num_speculative_tokens for t in measured):
        if any(configs[key].drafter is not None for key in running if key in configs):
            # Another worker is measuring a drafter's largest k: its acceptance curve is what
            # every further choice needs, so wait for it instead of guessing.
            return decision(None, "wait", "waiting for another worker's largest-k trial: its acceptance is needed next")
        if not untried:
            return decision(None, "stop", "every configuration of the space was measured or failed")
        return decision(None, "stop", "no drafter could be measured (every one failed)")
    mconfigs = [t.measured_config() for t in measured]
    models = model_search(mconfigs, weights, k_max=max(c.k for c in configs.values()))
    noise = {w: n for w in weights if (n := run_to_run_noise(mconfigs, w)) is not None}
    cells = [(w, b) for w in weights for b in settings.concurrency_levels]
    potentials = _potentials(models, mconfigs, untried, cells, noise)
    extra: dict[str, Any] = {"noise": noise, "models": models, "candidates": tuple(s for _, s, _ in potentials)}
    if not any(m.fits for m in models.values()):
        if untried:
            # Without a model (e.g. no acceptance counters), fall back to the largest untried k.
            fallback = max(untried, key=lambda c: (c.drafter is not None, c.k))
            reason = "no prediction possible (no measured drafter reported acceptance counts)"
            return decision(fallback, "largest k", f"{reason}; measuring the largest untried k", **extra)
        return decision(None, "stop", "every configuration of the space was measured or failed", **extra)
    top_gain = max(potentials, key=lambda p: p[0], default=None)
    if top_gain is not None and top_gain[0] > 0 and not top_gain[1].line_pinned:
        # The candidate that could gain most rests on a one-point line: pin that drafter's line
        # at its predicted optimum (a sibling's pinned line may already keep its bound low).
        _, score, cell = top_gain
        drafter = score.drafter
        same = [(g, s, c) for g, s, c in potentials if s.drafter == drafter and c == cell]
        _, top, _ = max(same, key=lambda p: p[1].predicted)
        chosen = next(c for c in untried if c.candidate == top.candidate)
        return decision(
            chosen,
            "pin the step-time line",
            f"{top.candidate.short_label}: predicted {top.predicted:.1f} tok/s for {_cell(cell)}, up to "
            f"{top.upper:.1f}; {drafter.label}'s step-time slope is known from one draft length only",
            **extra,
        )
    if not any(n.repeated for n in noise.values()) and best is not None:
        again = configs.get(best.key or "")
        if again is not None and again.key not in blocked:
            return decision(
                again,
                "repeat",
                f"{again.candidate.short_label} once more, the best measured at concurrency {objective}: the "
                "run-to-run noise every further decision compares with is measured by repeats",
                repeat=True,
                **extra,
            )
    worth = [(gain, s, cell) for gain, s, cell in potentials if gain > _noise_of(noise, models, cell[0])]
    if worth:
        gain, top, cell = max(worth, key=lambda p: p[0])
        chosen = next(c for c in untried if c.candidate == top.candidate)
        reason = (
            f"{top.candidate.short_label}: up to {top.upper:.1f} tok/s for {_cell(cell)} (predicted "
            f"{top.predicted:.1f}), {100 * gain:.1f}% over the best measured there, beyond its noise "
            f"({100 * _noise_of(noise, models, cell[0]):.1f}%)"
        )
        return decision(chosen, "upper bound", reason, **extra)
    analysis = _analysis(mconfigs, settings)
    follow_up = _follow_up(analysis, mconfigs, configs, set(exclude), running, noise)
    if follow_up is not None:
        config, phase, reason, repeat = follow_up
        return decision(config, phase, reason, repeat=repeat, **extra)
    if top_gain is None:
        bound = "; every configuration of the space was measured"
    elif top_gain[0] > 0:
        bound = (
            f"; the most an untried configuration could add is {100 * top_gain[0]:.1f}% "
            f"({top_gain[1].candidate.short_label} for {_cell(top_gain[2])})"
        )
    else:
        bound = "; no untried configuration's upper bound reaches the best measured in any cell"
    noises = "; ".join(f"{w} {100 * n.relative_sd:.1f}% from {n.basis}" for w, n in noise.items()) or "not measured"
    ties = _ties(analysis, mconfigs, noise)
    return decision(
        None,
        "stop",
        f"no untried configuration can change a recommendation by more than the run-to-run noise ({noises}){bound}",
        ties=ties,
        **extra,
    )


def _cell(cell: tuple[str, int]) -> str:
    return f"{cell[0]} at concurrency {cell[1]}"


def _noise_of(noise: Mapping[str, RunNoise], models: Mapping[str, WorkloadModel], workload: str) -> float:
    """A workload's run-to-run noise; before any repeat, the model's residual noise (at least 1%)."""
    if workload in noise:
        return noise[workload].relative_sd
    model = models.get(workload)
    residual = measured_noise(model.throughput) if model is not None and model.throughput is not None else None
    return residual or 0.01


def _potentials(
    models: Mapping[str, WorkloadModel],
    configs: Sequence[MeasuredConfig],
    untried: Sequence[_Config],
    cells: Sequence[tuple[str, int]],
    noise: Mapping[str, RunNoise],
) -> list[tuple[float, CandidateScore, tuple[str, int]]]:
    """Per untried candidate and cell: how much its upper bound exceeds the cell's best measured rate."""
    out = []
    candidates = [c.candidate for c in untried]
    for workload, level in cells:
        rated = measured_rates(configs, workload, level)
        if not rated:
            continue
        scores = score_candidates(
            models, candidates, concurrency=level, weights={workload: 1.0},
            noise=noise[workload].relative_sd if workload in noise else None,
        )  # fmt: skip
        out.extend((s.upper / rated[0].tokens_per_s - 1.0, s, (workload, level)) for s in scores)
    return out


def _analysis(configs: Sequence[MeasuredConfig], settings: StudySettings) -> StudyAnalysis | None:
    try:
        return analyze_with_settings(configs, settings)
    except FitError:
        return None


def _follow_up(
    analysis: StudyAnalysis | None,
    configs: Sequence[MeasuredConfig],
    space: Mapping[str, _Config],
    failed: set[str],
    running: set[str],
    noise: Mapping[str, RunNoise],
) -> tuple[_Config, str, str, bool] | None:
    """After the search: a recommendation never measured, then a tied leader to measure again."""
    if analysis is None:
        return None
    by_candidate = {c.candidate: c for c in space.values()}
    starts = {key: sum(1 for c in configs if c.key == key) for key in {c.key for c in configs}}
    for rec in analysis.recommendations:
        config = by_candidate.get(rec.choice)
        if not rec.measured and config is not None and config.key not in failed | running:
            return (
                config,
                "confirm",
                f"{rec.choice.short_label} is recommended for {_cell((rec.workload, rec.concurrency))} but was never "
                "measured: measure it before it is pasted",
                False,
            )
    for rec in analysis.recommendations:
        if not _tie_matters(rec):
            continue
        # the runner-up to separate from the choice: the first tied candidate that was measured (an
        # unmeasured one is the upper-bound phase's business), as the stop's tie lines name it
        measured = [c for c in rec.tied if by_candidate.get(c) is not None and by_candidate[c].key in starts]
        pair = [c for c in (rec.choice, *measured[:1]) if by_candidate.get(c) is not None]
        if len(pair) < 2 or rec.workload not in noise:
            continue
        keys = [by_candidate[c].key for c in pair]
        if any(k not in starts or k in running | failed for k in keys) or min(starts[k] for k in keys) >= MAX_STARTS:
            continue
        fewer = min(pair, key=lambda c: (starts[by_candidate[c].key], c != rec.choice))
        return (
            by_candidate[fewer],
            "separate",
            f"{rec.choice.short_label} and {pair[1].short_label} are tied for "
            f"{_cell((rec.workload, rec.concurrency))}: measuring {fewer.short_label} again "
            f"(start {starts[by_candidate[fewer].key] + 1} of at most {MAX_STARTS})",
            True,
        )
    return None


def _tie_matters(rec: Recommendation) -> bool:
    """Whether the runner-up the data cannot tell from the choice could be more than
    ``SEPARATION_MARGIN`` faster (below that, either is a good pick)."""
    if not rec.tied:
        return False
    row = next(r for r in rec.candidates if r.candidate == rec.tied[0])
    return -row.shortfall_low_tokens_per_s > SEPARATION_MARGIN * rec.tokens_per_s


def _ties(
    analysis: StudyAnalysis | None, configs: Sequence[MeasuredConfig], noise: Mapping[str, RunNoise]
) -> tuple[str, ...]:
    """Cells whose leaders the data could not separate, and how many starts each would take."""
    if analysis is None:
        return ()
    out = []
    for rec in analysis.recommendations:
        measured = [c for c in rec.tied if any(r.candidate == c and r.measured_tokens_per_s for r in rec.candidates)]
        if not measured or not _tie_matters(rec):
            continue
        other = next(r for r in rec.candidates if r.candidate == measured[0])
        difference = 1.0 - other.tokens_per_s / rec.tokens_per_s
        line = (
            f"{_cell((rec.workload, rec.concurrency))}: {rec.choice.short_label} and "
            f"{', '.join(c.short_label for c in measured)} are tied (predicted {100 * difference:.1f}% apart)"
        )
        run = noise.get(rec.workload)
        if run is not None:
            starts = run.separating_starts(difference)
            line += (
                f"; with run-to-run noise {100 * run.relative_sd:.1f}%, about {starts} server "
                f"start{'s' if starts > 1 else ''} of each would separate a difference that size"
            )
        out.append(line)
    return tuple(out)


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
