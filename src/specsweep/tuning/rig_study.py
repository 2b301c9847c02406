"""``study --rig``: a study that reuses a known rig and restarts only where the rig cannot answer.

One server start measures every workload at the largest k of the search range (acceptance at
every smaller k follows from it). Further starts only for:
- a drafter the rig has not measured: its smallest k too, for a step-time line of two points;
- speculation off at a concurrency level the rig has no off point for;
- ``check``: the predicted optimum at the objective's concurrency, measured to compare.
A k beyond the rig's range is covered by the largest-k start, which adds its step time.
The rig must match the study's server config (engine, flags) and, once a server runs, its
version and model; any difference is refused with the field named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import optuna

from specsweep.analysis.rig import (
    LevelTiming,
    Rig,
    RigIdentity,
    check_identity,
    fit_rig,
    recommend_with_rig,
    workload_timing,
)
from specsweep.analysis.study import drafter_of
from specsweep.analysis.throughput import Drafter
from specsweep.config import StudyConfig
from specsweep.errors import ConfigError
from specsweep.tuning.rig import (
    RIG_FILE,
    WorkloadOnRig,
    acceptance_from_levels,
    decode_steps,
    study_level_timings,
    template_server_args,
    write_rig,
)
from specsweep.tuning.study import StudyPaths, StudyRunner

EventCallback = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTrial:
    params: dict[str, Any]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """The predicted optimum measured: predicted and measured aggregate tok/s per workload and level."""

    num_speculative_tokens: int
    rows: tuple[tuple[str, int, float, float | None], ...]  # workload, concurrency, predicted, measured


@dataclass(frozen=True, slots=True, kw_only=True)
class RigStudyOutcome:
    study: optuna.Study
    rig: Rig  # the rig with this study's new points
    results: tuple[WorkloadOnRig, ...]
    plan: tuple[PlannedTrial, ...]
    server_starts: int
    unchecked: tuple[str, ...]
    check: CheckResult | None
    notes: tuple[str, ...]


def check_config_against_rig(rig: Rig, config: StudyConfig) -> tuple[str, ...]:
    """Refuse a rig whose engine or flags differ from the study's server config; fields left to check."""
    mine = RigIdentity(engine=config.server.engine, server_args=template_server_args(config.server))
    return check_identity(rig.identity, mine, other_name="study's server")


def plan_trials(rig: Rig, runner: StudyRunner, config: StudyConfig) -> tuple[tuple[PlannedTrial, ...], Drafter]:
    space = runner.space
    low, high = config.search.num_speculative_tokens
    method = space.draft_sample_methods[0]
    top = {"num_speculative_tokens": high, "draft_sample_method": method}
    spec = space.config_from_params(top)
    drafter = drafter_of(spec)
    assert drafter is not None
    known = rig.draft_lengths(drafter)
    reason = f"every workload's acceptance at the largest k ({high}); smaller k follow from it"
    if known and high > max(known):
        reason += f"; also its step time, beyond the rig's k={max(known)}"
    plan = [PlannedTrial(params=top, reason=reason)]
    if not known and low < high:
        plan.append(
            PlannedTrial(
                params={"num_speculative_tokens": low, "draft_sample_method": method},
                reason=f"the rig has no {drafter.method} ({drafter.draft_sample_method}): a second k for its step time",
            )
        )
    if config.search.no_speculation and not all(rig.has_off(b) for b in config.measure.concurrency):
        plan.append(PlannedTrial(params=space.params_for(None), reason="speculation off: the rig has no off point"))
    return tuple(plan), drafter


def run_rig_study(
    config: StudyConfig,
    paths: StudyPaths,
    rig: Rig,
    *,
    check: bool = False,
    resume: bool = False,
    on_event: EventCallback | None = None,
    worker: str | None = None,
) -> RigStudyOutcome:
    """Measure what the rig cannot answer, then recommend per workload and concurrency from the rig."""
    check_config_against_rig(rig, config)
    emit = on_event or (lambda kind, data: None)
    # Only the planned trials run: no grid, no baseline or off trial queued on creation.
    quiet = replace(config, sampler="random", search=replace(config.search, baseline=None, no_speculation=False))
    runner = StudyRunner(quiet, paths, resume=resume, on_event=on_event, worker=worker)
    plan, drafter = plan_trials(rig, runner, config)
    for item in plan:
        emit("note", {"text": f"restart planned: {_describe(item.params)}: {item.reason}"})
        runner.study.enqueue_trial(item.params, skip_if_exists=True)
    starts = runner.run(max_trials=1).restarts
    unchecked = _check_running_server(rig, runner.study)
    if len(plan) > 1:
        starts += runner.run(max_trials=len(plan) - 1).restarts
    merged, levels, notes = _merge(rig, runner, paths, config)
    results = _recommend(merged, runner.study, levels, drafter, config)
    result_check = None
    if check and results:
        target = next(
            (r for r in results[0].recommendations if r.recommendation.concurrency == config.objective.concurrency),
            results[0].recommendations[0],
        )
        k = target.recommendation.choice.num_speculative_tokens
        params = {"num_speculative_tokens": k, "draft_sample_method": plan[0].params["draft_sample_method"]}
        if k == 0:
            params = runner.space.params_for(None)
        measured = _measured_rates(runner.study, params)
        if measured is None:
            emit("note", {"text": f"checking the predicted optimum: {_describe(params)}"})
            runner.study.enqueue_trial(params)
            starts += runner.run(max_trials=1).restarts
            measured = _measured_rates(runner.study, params) or {}
        rows = tuple(
            (res.workload, level, _predicted(item, k), measured.get((res.workload, level)))
            for res in results
            for item in res.recommendations
            if (level := item.recommendation.concurrency)
        )
        result_check = CheckResult(num_speculative_tokens=k, rows=rows)
    write_rig(paths.folder / RIG_FILE, merged)
    return RigStudyOutcome(
        study=runner.study, rig=merged, results=results, plan=plan, server_starts=starts, unchecked=unchecked,
        check=result_check, notes=tuple(notes),
    )  # fmt: skip


def _describe(params: dict[str, Any]) -> str:
    k = int(params.get("num_speculative_tokens") or 0)
    return "speculation off" if not k else f"k={k}"


def _check_running_server(rig: Rig, study: optuna.Study) -> tuple[str, ...]:
    """Version and model as the first server reported them, against the rig's."""
    for trial in study.get_trials(deepcopy=False):
        server = trial.user_attrs.get("server")
        if server:
            seen = RigIdentity(
                engine=rig.identity.engine,
                engine_version=server.get("engine_version"),
                model=server.get("model"),
                server_facts={k: v for k, v in (server.get("facts") or {}).items() if v is not None},
            )
            unchecked = check_identity(rig.identity, seen, other_name="study's server")
            return tuple(f for f in unchecked if f != "server_args")  # checked against the config already
    raise ConfigError("the study's first server did not start, so the rig could not be checked; see the trial log.")


def _merge(
    rig: Rig, runner: StudyRunner, paths: StudyPaths, config: StudyConfig
) -> tuple[Rig, list[LevelTiming], list[str]]:
    """The rig plus this study's points where the rig had none (same k, level and drafter)."""
    levels = study_level_timings(runner.study, paths.folder, time_scale=_time_scale(runner.study))
    covered = {(lv.num_speculative_tokens, lv.concurrency, lv.drafter) for lv in rig.levels}
    new = [lv for lv in levels if (lv.num_speculative_tokens, lv.concurrency, lv.drafter) not in covered]
    notes = [
        f"added to the rig: k={lv.num_speculative_tokens} at concurrency {lv.concurrency}"
        f" ({'off' if lv.drafter is None else lv.drafter.method})"
        for lv in new
    ]
    merged = fit_rig([*rig.levels, *new], identity=rig.identity, shape=rig.shape) if new else rig
    return merged, levels, notes


def _time_scale(study: optuna.Study) -> float:
    for trial in study.get_trials(deepcopy=False):
        server = trial.user_attrs.get("server")
        if server:
            return float(server.get("time_scale") or 1.0)
    return 1.0


def _recommend(
    rig: Rig, study: optuna.Study, levels: list[LevelTiming], drafter: Drafter, config: StudyConfig
) -> tuple[WorkloadOnRig, ...]:
    """Per workload: acceptance from the largest-k trial's counters, overhead from its levels."""
    high = config.search.num_speculative_tokens[1]
    out = []
    for workload in config.workloads:
        at_top = [
            lv
            for lv in levels
            if lv.workload == workload and lv.drafter == drafter and lv.num_speculative_tokens == high
        ]
        if not at_top:
            continue
        rows = study.trials[at_top[0].trial].user_attrs.get("results", {}).get(workload, {})
        by_level = {lv.concurrency: lv for lv in at_top}
        counts = [
            (decode_steps(r.get("num_drafts") or 0.0, by_level.get(int(b))), r.get("accepted_per_position") or ())
            for b, r in rows.items()
        ]
        fit = acceptance_from_levels(counts, k_max=high, seed=config.seed)
        timing = workload_timing(workload, at_top)
        recs = recommend_with_rig(rig, {drafter: fit}, timing, k_max=high, seed=config.seed)
        out.append(WorkloadOnRig(workload=workload, drafter=drafter, fit=fit, timing=timing, recommendations=recs))
    return tuple(out)


def _measured_rates(study: optuna.Study, params: dict[str, Any]) -> dict[tuple[str, int], float] | None:
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if int(trial.params.get("num_speculative_tokens", -1)) == int(params["num_speculative_tokens"]):
            results = trial.user_attrs.get("results", {})
            return {
                (w, int(b)): row["output_tokens_per_s"]
                for w, levels in results.items()
                for b, row in levels.items()
                if row.get("output_tokens_per_s")
            }
    return None


def _predicted(item, k: int) -> float:
    rec = item.recommendation
    for row in rec.candidates:
        if row.candidate.num_speculative_tokens == k:
            return row.tokens_per_s
    return rec.tokens_per_s
