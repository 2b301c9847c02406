"""``study --rig``: a study that reuses a known rig and starts the server only where the rig cannot answer.

One server start measures every workload at the largest k of the search range (acceptance at
every smaller k follows from it). Further starts only for:
- a drafter the rig has not measured: its smallest k too, for a step-time line of two points;
- speculation off at a concurrency level the rig has no off point for;
- ``check``: the predicted optimum at the objective's concurrency, measured to compare.
A k beyond the rig's range is covered by the largest-k start, which adds its step time.
The rig must match the study's server config (engine, flags) and, once a server runs, its
version and model; any difference is refused with the field named. Context levels
(``measure.context``) are answered from the rig's one step model read at each level, so only a
rig that measured some context level can answer them (rigs/model.check_rig_context).
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from specsweep.analysis.drafters import Candidate, Drafter, candidate_of, configuration_label, drafter_of
from specsweep.config import StudyConfig
from specsweep.errors import ConfigError
from specsweep.rigs.file import RIG_FILE, check_identity, template_server_args, write_rig
from specsweep.rigs.model import (
    LevelTiming,
    Rig,
    RigIdentity,
    check_rig_context,
    context_label,
    decode_steps,
    fit_rig,
)
from specsweep.rigs.stored import WorkloadOnRig, study_level_timings
from specsweep.rigs.workload import (
    RigRecommendation,
    acceptance_from_levels,
    recommend_with_rig,
    workload_timing,
)
from specsweep.tuning.events import Note, StudyEvent
from specsweep.tuning.records import TrialRecord, read_trials
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import StudyPaths
from specsweep.tuning.workloads import study_workloads
from specsweep.types import Configuration, EventCallback


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTrial:
    configuration: Configuration
    reason: str

    @property
    def candidate(self) -> Candidate:
        return candidate_of(self.configuration.spec)


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
    starts: int  # server starts this run
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
    top = space.configuration({"num_speculative_tokens": high, "draft_sample_method": method})
    drafter = drafter_of(top.spec)
    assert drafter is not None
    known = rig.draft_lengths(drafter)
    reason = f"every workload's acceptance at the largest k ({high}); smaller k follow from it"
    if known and high > max(known):
        reason += f"; also its step time, beyond the rig's k={max(known)}"
    plan = [PlannedTrial(configuration=top, reason=reason)]
    if not known and low < high:
        plan.append(
            PlannedTrial(
                configuration=space.configuration({"num_speculative_tokens": low, "draft_sample_method": method}),
                reason=f"the rig has no {drafter.label}: a second k for its step time",
            )
        )
    if config.search.no_speculation and not all(rig.has_off(b) for b in config.measure.concurrency):
        off = space.configuration(space.params_for(None))
        plan.append(PlannedTrial(configuration=off, reason="speculation off: the rig has no off point"))
    return tuple(plan), drafter


def run_rig_study(
    config: StudyConfig,
    paths: StudyPaths,
    rig: Rig,
    *,
    check: bool = False,
    resume: bool = False,
    on_event: EventCallback[StudyEvent] | None = None,
    worker: str | None = None,
) -> RigStudyOutcome:
    """Measure what the rig cannot answer, then recommend per workload and concurrency from the rig."""
    context_note = check_rig_context(rig, config.measure.context, what=f"study {config.name!r}")
    check_config_against_rig(rig, config)
    emit = on_event or (lambda event: None)
    # Only the planned configurations run: nothing is queued when the study is created.
    runner = StudyRunner(config, paths, resume=resume, on_event=on_event, worker=worker, queue_initial=False)
    plan, drafter = plan_trials(rig, runner, config)
    for item in plan:
        emit(Note(text=f"start planned: {item.candidate.short_label}: {item.reason}"))
    starts = 0
    unchecked: tuple[str, ...] = ()
    for number, item in enumerate(plan):
        starts += runner.measure(item.configuration).started_server
        if number == 0:
            unchecked = _check_running_server(rig, read_trials(runner.study))
    trials = read_trials(runner.study, (optuna.trial.TrialState.COMPLETE,))
    merged, levels, notes = _merge(rig, trials, paths)
    if context_note:
        notes.insert(0, context_note.removesuffix(".") + ", besides this study's own levels there.")
    results = _recommend(merged, trials, levels, drafter, config)
    result_check = None
    if check and results:
        target = next(
            (r for r in results[0].recommendations if r.recommendation.concurrency == config.objective.concurrency),
            results[0].recommendations[0],
        )
        k = target.recommendation.choice.num_speculative_tokens
        params = {
            "num_speculative_tokens": k,
            "draft_sample_method": plan[0].configuration.params["draft_sample_method"],
        }
        if k == 0:
            params = runner.space.params_for(None)
        optimum = runner.space.configuration(params)
        measured = _measured_rates(read_trials(runner.study), optimum)
        if measured is None:
            emit(Note(text=f"checking the predicted optimum: {configuration_label(optimum, short=True)}"))
            starts += runner.measure(optimum).started_server
            measured = _measured_rates(read_trials(runner.study), optimum) or {}
        rows = tuple(
            (res.workload, level, _predicted(item, k), measured.get((res.workload, level)))
            for res in results
            for item in res.recommendations
            if (level := item.recommendation.concurrency)
        )
        result_check = CheckResult(num_speculative_tokens=k, rows=rows)
    write_rig(paths.folder / RIG_FILE, merged)
    return RigStudyOutcome(
        study=runner.study, rig=merged, results=results, plan=plan, starts=starts, unchecked=unchecked,
        check=result_check, notes=tuple(notes),
    )  # fmt: skip


def _check_running_server(rig: Rig, trials: list[TrialRecord]) -> tuple[str, ...]:
    """Version and model as the first server reported them, against the rig's."""
    for trial in trials:
        if trial.server is not None:
            seen = RigIdentity(
                engine=rig.identity.engine,
                engine_version=trial.server.engine_version,
                model=trial.server.model,
                server_facts={k: v for k, v in trial.server.facts.items() if v is not None},
            )
            unchecked = check_identity(rig.identity, seen, other_name="study's server")
            return tuple(f for f in unchecked if f != "server_args")  # checked against the config already
    raise ConfigError("the study's first server did not start, so the rig could not be checked; see the trial log.")


def _merge(rig: Rig, trials: list[TrialRecord], paths: StudyPaths) -> tuple[Rig, list[LevelTiming], list[str]]:
    """The rig plus this study's points where the rig had none (same k, level, drafter and context)."""
    levels = study_level_timings(trials, paths.folder)
    covered = {(lv.num_speculative_tokens, lv.concurrency, lv.drafter, lv.context_tokens) for lv in rig.levels}
    new = [
        lv for lv in levels if (lv.num_speculative_tokens, lv.concurrency, lv.drafter, lv.context_tokens) not in covered
    ]
    notes = [
        f"added to the rig: k={lv.num_speculative_tokens} at concurrency {lv.concurrency}"
        + (f", context {context_label(lv.context_tokens)}" if lv.context_tokens else "")
        + f" ({'off' if lv.drafter is None else lv.drafter.method})"
        for lv in new
    ]
    merged = fit_rig([*rig.levels, *new], identity=rig.identity, shape=rig.shape) if new else rig
    return merged, levels, notes


def _recommend(
    rig: Rig, trials: list[TrialRecord], levels: list[LevelTiming], drafter: Drafter, config: StudyConfig
) -> tuple[WorkloadOnRig, ...]:
    """Per workload: acceptance from the largest-k trial's counters, overhead from its levels."""
    high = config.search.num_speculative_tokens[1]
    by_number = {t.number: t for t in trials}
    out = []
    for workload in study_workloads(config):  # the plain workloads, then each at every context level
        at_top = [
            lv
            for lv in levels
            if lv.workload == workload and lv.drafter == drafter and lv.num_speculative_tokens == high
        ]
        if not at_top or at_top[0].trial not in by_number:
            continue
        rows = by_number[at_top[0].trial].results.get(workload, {})
        by_level = {lv.concurrency: lv for lv in at_top}
        counts = [
            (decode_steps(r.num_drafts or 0.0, by_level.get(b)), r.accepted_per_position or ()) for b, r in rows.items()
        ]
        fit = acceptance_from_levels(counts, k_max=high, seed=config.seed)
        timing = workload_timing(workload, at_top)
        recs = recommend_with_rig(rig, {drafter: fit}, timing, k_max=high, seed=config.seed)
        out.append(WorkloadOnRig(workload=workload, drafter=drafter, fit=fit, timing=timing, recommendations=recs))
    return tuple(out)


def _measured_rates(trials: list[TrialRecord], configuration: Configuration) -> dict[tuple[str, int], float] | None:
    k = configuration.num_speculative_tokens
    for trial in trials:
        if trial.measured and trial.num_speculative_tokens == k:
            return {
                (w, b): row.output_tokens_per_s
                for w, levels in trial.results.items()
                for b, row in levels.items()
                if row.output_tokens_per_s
            }
    return None


def _predicted(item: RigRecommendation, k: int) -> float:
    rec = item.recommendation
    for row in rec.candidates:
        if row.candidate.num_speculative_tokens == k:
            return row.tokens_per_s
    return rec.tokens_per_s
