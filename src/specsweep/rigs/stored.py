"""Rigs from measurements: a stored study's rig, and what a rig recommends for a workload.

A study's trials hold every request (trials/trial-NNNN.json); a rig keeps, per measured level,
the decode step time and the request overhead those requests imply (rigs/model.py), with the
engine, version, model and flags the servers ran with. ``studies/NAME/rig.json`` is written at
the end of every study; ``specsweep rig STUDY_FOLDER`` writes it again from stored data. The
file itself and the identity checks: rigs/file.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from specsweep import __version__
from specsweep.analysis.drafters import Candidate, Drafter, candidate_of, find_drafter
from specsweep.analysis.fits import AcceptanceFit
from specsweep.config import ServerConfig
from specsweep.engines.registry import server_args_without_spec
from specsweep.errors import ConfigError, FitError
from specsweep.measurement.levels import draft_share, tokens_per_step
from specsweep.rigs.file import template_server_args
from specsweep.rigs.model import (
    LevelTiming,
    RequestShape,
    Rig,
    RigIdentity,
    decode_steps,
    fit_rig,
    level_timing,
)
from specsweep.rigs.workload import (
    RigRecommendation,
    WorkloadTiming,
    acceptance_from_levels,
    recommend_with_rig,
    workload_timing,
)
from specsweep.runtime.measure import Measurement
from specsweep.runtime.modelled_time import ServerClock, stored_in_modelled_time
from specsweep.runtime.store import measurement_to_dict
from specsweep.tuning.records import TrialRecord, read_trials
from specsweep.tuning.study_settings import read_study_settings
from specsweep.tuning.trial_files import read_trial_file
from specsweep.types import SpeculativeConfig
from specsweep.workload import parse_context_variant


def level_timings(
    measurement: Mapping[str, Any],
    spec: SpeculativeConfig | None,
    *,
    trial: int | None = None,
    running: Candidate | None = None,
) -> list[LevelTiming]:
    """Every level of one stored measurement (measurement_to_dict's shape, in the rig's units).

    ``running`` names the configuration when no spec config is known (a server measured as it runs).
    A context level's (``W@16k``) levels carry its context."""
    workload = str(measurement.get("workload", ""))
    context = parse_context_variant(workload)[1] or 0
    out = []
    for level in measurement.get("levels", []):
        records = [r for r in level.get("records", []) if r.get("error") is None and r.get("completion_tokens")]
        spans = [
            r["last_token_s"] - r["ttft_s"]
            for r in records
            if r.get("last_token_s") is not None and r.get("ttft_s") is not None
        ]
        rate = level.get("saturated_output_tokens_per_s") or level.get("output_tokens_per_s")
        acceptance = level.get("acceptance") or {}
        concurrency = int(level["concurrency"])
        candidate = running if running is not None else candidate_of(spec, concurrency)
        completion = [float(r["completion_tokens"]) for r in records]
        per_step = tokens_per_step(acceptance.get("mean_acceptance_length"), acceptance.get("num_drafts"), completion)
        timing = level_timing(
            num_speculative_tokens=candidate.num_speculative_tokens,
            concurrency=concurrency,
            drafter=candidate.drafter,
            output_tokens_per_s=rate or None,
            tokens_per_step=per_step,
            completion_tokens=completion,
            decode_spans_s=spans,
            prompt_tokens=[float(r["prompt_tokens"]) for r in records if r.get("prompt_tokens")],
            workload=workload,
            trial=trial,
            draft_share=draft_share(acceptance.get("num_drafts"), completion, per_step, level.get("counted_drafts")),
            context_tokens=context,
        )
        if timing is not None:
            out.append(timing)
    return out


def measured_timings(measurement: Measurement, running: Candidate) -> list[LevelTiming]:
    """The levels of a measurement just taken, at the running configuration."""
    return level_timings(measurement_to_dict(measurement), None, running=running)


def _identity_from_trials(trials: Sequence[TrialRecord], engine: str) -> RigIdentity:
    """Engine, version, model and flags from the study's trials (every trial must agree)."""
    seen: dict[str, set[Any]] = {"engine_version": set(), "model": set(), "server_args": set()}
    facts: dict[str, Any] = {}
    for trial in trials:
        server = trial.server
        if server is not None:
            seen["engine_version"].add(server.engine_version)
            seen["model"].add(server.model)
            facts.update({k: v for k, v in server.facts.items() if v is not None})
            engine = server.engine or engine
        if trial.argv:
            seen["server_args"].add(server_args_without_spec(engine, list(trial.argv)))
    for name, values in seen.items():
        if len(values - {None}) > 1:
            raise ConfigError(
                f"the study's servers did not all run the same {name} ({sorted(map(str, values))}); a rig needs "
                "one setup: split the trials into studies of their own."
            )
    pick = {name: next(iter(values - {None}), None) for name, values in seen.items()}
    identity = RigIdentity(
        engine=engine,
        engine_version=pick["engine_version"],
        model=pick["model"],
        server_args=pick["server_args"],
        server_facts=facts,
        specsweep_version=__version__,
    )
    return identity


def study_level_timings(
    trials: Sequence[TrialRecord],
    folder: Path,
    *,
    settings: dict[str, Any] | None = None,
    workloads: Sequence[str] | None = None,
) -> list[LevelTiming]:
    """Every measured level of every measured trial, from the trial files beside the study
    (``settings`` receives the measure settings of the first one), of the ``workloads`` named
    (None: every one, context levels too: they give the step model its context parts)."""
    out: list[LevelTiming] = []
    for trial in trials:
        if not trial.measured:
            continue
        record = read_trial_file(folder, trial)
        if record is None:
            continue  # a copied study folder without its trial files: the trial gives no timing
        for name, measurement in record.get("workloads", {}).items():
            if workloads is not None and name not in workloads:
                continue
            if settings is not None and not settings:
                settings.update(measurement.get("settings") or {})
            # studies stored before runtime/ undid the emulator's clock kept wall-clock request times
            clock = trial.server.clock if trial.server is not None else ServerClock()
            stored = stored_in_modelled_time(measurement, clock)
            out.extend(level_timings(stored, trial.spec, trial=trial.number))
    return out


def build_rig(
    study: optuna.Study, folder: Path, *, server: ServerConfig | None = None, workloads: Sequence[str] | None = None
) -> Rig:
    """The rig of a stored study, from every workload's levels or only those named (FitError when
    no trial gives a timing)."""
    trials = read_trials(study, (optuna.trial.TrialState.COMPLETE,))
    study_settings = read_study_settings(study)
    identity = _identity_from_trials(trials, study_settings.engine)
    if server is not None:
        args = template_server_args(server)
        identity = RigIdentity(**{**_fields(identity), "server_args": args or identity.server_args})
    settings: dict[str, Any] = {}
    levels = study_level_timings(trials, folder, settings=settings, workloads=workloads)
    if not levels:
        raise FitError(
            f"no trial of the study in {folder} has request records to time (trials/*.json); a rig needs them."
        )
    shape = RequestShape(
        api=str(settings.get("api", "chat")),
        temperature=float(settings.get("temperature", study_settings.temperature) or 0.0),
        max_tokens=int(settings.get("max_tokens") or max(lv.completion_tokens for lv in levels)),
        workloads=_shape_by_workload(levels),
    )
    return fit_rig(levels, identity=identity, shape=shape)


def _fields(identity: RigIdentity) -> dict[str, Any]:
    return {name: getattr(identity, name) for name in RigIdentity.__dataclass_fields__}


def _shape_by_workload(levels: Sequence[LevelTiming]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in sorted({lv.workload for lv in levels}):
        mine = [lv for lv in levels if lv.workload == name]
        out[name] = {
            "prompt_tokens": sum(lv.prompt_tokens for lv in mine) / len(mine),
            "completion_tokens": sum(lv.completion_tokens for lv in mine) / len(mine),
        }
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOnRig:
    """A workload measured at the running k, and what the rig recommends for it."""

    workload: str
    drafter: Drafter
    fit: AcceptanceFit
    timing: WorkloadTiming
    recommendations: tuple[RigRecommendation, ...]


def recommend_for_workload(
    rig: Rig, *, workload: str, drafter: Drafter, fit: AcceptanceFit, levels: Sequence[LevelTiming], seed: int = 0
) -> WorkloadOnRig:
    """Recommended k per concurrency for a workload measured at the running configuration."""
    timing = workload_timing(workload, levels)
    recs = recommend_with_rig(rig, {drafter: fit}, timing, k_max=fit.k_max, seed=seed)
    return WorkloadOnRig(workload=workload, drafter=drafter, fit=fit, timing=timing, recommendations=recs)


def rig_drafter(rig: Rig, name: str | None) -> Drafter:
    """The drafter the running server uses: the one named (label, method or draft sampling), or
    the rig's only one."""
    return find_drafter(rig.drafters, name)


def recommend_for_measurement(
    rig: Rig, measurement: Measurement, *, drafter: str | None = None, seed: int = 0
) -> WorkloadOnRig:
    """What the rig recommends for a workload measured on the running server at its current k."""
    chosen = rig_drafter(rig, drafter)
    running_levels = {lv.concurrency: lv for lv in measured_timings(measurement, _placeholder(rig))}
    counts = [
        (
            decode_steps(level.delta.num_drafts or 0.0, running_levels.get(level.summary.concurrency)),
            level.delta.accepted_per_position or (),
        )
        for level in measurement.levels
        if level.delta is not None
    ]
    depth = max((len(c) for n, c in counts if n), default=0)
    if not depth:
        raise FitError(
            "the server counted no drafts: it runs with speculation off or publishes no per-position counters; "
            "run it with the largest k you would consider and measure again."
        )
    k_top = max(rig.draft_lengths(chosen), default=depth)
    fit = acceptance_from_levels(counts, k_max=max(k_top, depth), seed=seed)
    running = Candidate(drafter=chosen, num_speculative_tokens=depth)
    levels = measured_timings(measurement, running)
    return recommend_for_workload(rig, workload=measurement.workload, drafter=chosen, fit=fit, levels=levels, seed=seed)


def _placeholder(rig: Rig) -> Candidate:
    return Candidate(drafter=rig.drafters[0] if rig.drafters else None, num_speculative_tokens=1)
