"""What a study stores of each trial, typed: the trial record and its per-level figures.

This module is the only code that reads or writes a trial's optuna ``user_attrs``; the trial
files beside the study (``trials/trial-NNNN.json``, the full measurement of one trial) are
tuning/trial_files.py's, the study's own attributes tuning/study_settings.py's. Everything else works on
:class:`TrialRecord` and :class:`LevelFigures`.

The stored form keeps concurrency levels as strings (JSON object keys) and tuples as lists;
studies written by earlier versions read the same way (absent fields are None or empty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

import optuna

from specsweep.measurement.levels import acceptance_by_subcategory, level_drafted_share
from specsweep.measurement.stopping import estimate_rate, request_rows
from specsweep.runtime.identity import ServerIdentity
from specsweep.runtime.measure import Measurement
from specsweep.runtime.run_owner import RunOwner
from specsweep.types import BootFacts, Configuration, LevelFigures, MeasuredConfig, RequestRecord, SpeculativeConfig


class TrialOutcome(StrEnum):
    """What asking the study to run one configuration came to."""

    MEASURED = "measured"  # the server ran it and the trial has a value
    FAILED = "failed"  # the server did not start, crashed, or nothing was measured
    INVALID = "invalid"  # the parameters make no spec config the engine takes
    SKIPPED = "skipped"  # already measured, failed in this run, or measured by another worker

    @property
    def started_server(self) -> bool:
        """Whether a server was started for it (a measured or failed trial; not an invalid or skipped one)."""
        return self in (TrialOutcome.MEASURED, TrialOutcome.FAILED)


def level_figures(
    measurement: Measurement, *, subcategories: Mapping[str, str] | None = None
) -> dict[int, LevelFigures]:
    """The figures a study keeps of each measured level, by concurrency, in the rig's units (the
    measurement's). ``subcategories``: the workload's prompt ids -> subcategory, for acceptance
    per subcategory.
    """
    out: dict[int, LevelFigures] = {}
    for level in measurement.levels:
        s = level.summary
        acceptance = s.acceptance
        decode = s.decode_tokens_per_s_per_stream
        counts = level.delta.accepted_per_position if level.delta and acceptance else None
        out[s.concurrency] = LevelFigures(
            concurrency=s.concurrency,
            # at full concurrency when known: the ramp-down tail of a closed loop is not the server's
            output_tokens_per_s=s.saturated_output_tokens_per_s or s.output_tokens_per_s,
            whole_level_output_tokens_per_s=s.output_tokens_per_s,
            decode_tokens_per_s_p50=decode.p50 if decode else None,
            ttft_p95_s=s.ttft_s.p95 if s.ttft_s else None,
            errors=s.errors,
            requests=s.requests,
            server_generation_tokens_per_s=s.server_generation_tokens_per_s,
            per_position=tuple(acceptance.per_position) if acceptance else None,
            accepted_per_position=tuple(counts) if counts else None,
            num_drafts=acceptance.num_drafts if acceptance else None,
            mean_acceptance_length=acceptance.mean_acceptance_length if acceptance else None,
            notes=tuple(level.notes),
            relative_se=_precision(level.records, s.concurrency),
            tpot_p50_s=s.tpot.p50_s if s.tpot else None,
            tpot_p99_s=s.tpot.p99_s if s.tpot else None,
            itl_p50_s=s.itl.p50_s if s.itl else None,
            itl_p99_s=s.itl.p99_s if s.itl else None,
            by_subcategory=(acceptance_by_subcategory(level.records, subcategories) or None) if subcategories else None,
            drafted_share=level_drafted_share(level.records, s),
            prompt_tokens_mean=_prompt_tokens_mean(level.records),
            by_request=request_rows(level.records) or None,
            prefill_tokens_per_s=s.prefill_tokens_per_s.mean if s.prefill_tokens_per_s else None,
        )
    return out


def _prompt_tokens_mean(records: Sequence[RequestRecord]) -> float | None:
    """The mean prompt tokens the server counted (usage.prompt_tokens) over a level's answered requests."""
    counted = [r.prompt_tokens for r in records if r.ok and r.prompt_tokens is not None]
    return sum(counted) / len(counted) if counted else None


def _precision(records: Sequence[RequestRecord], concurrency: int) -> float | None:
    """A level's own relative standard error from its requests' spread: of its step time, or of its
    rate where that is the smaller (measurement/stopping.py), what the step-time model is fitted on."""
    estimate = estimate_rate(records, concurrency)
    return None if estimate is None else min(estimate.step_time_relative_se, estimate.relative_se)


def _level_to_stored(level: LevelFigures) -> dict[str, Any]:
    row = {f.name: getattr(level, f.name) for f in fields(level) if f.name != "concurrency"}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}


def _level_from_stored(concurrency: int, row: dict[str, Any]) -> LevelFigures:
    def floats(name: str) -> tuple[float, ...] | None:
        value = row.get(name)
        return None if value is None else tuple(float(x) for x in value)

    return LevelFigures(
        concurrency=concurrency,
        output_tokens_per_s=row.get("output_tokens_per_s"),
        # "wall_clock_output_tokens_per_s" in trial files stored before the clock had its own word
        whole_level_output_tokens_per_s=row.get(
            "whole_level_output_tokens_per_s", row.get("wall_clock_output_tokens_per_s")
        ),
        decode_tokens_per_s_p50=row.get("decode_tokens_per_s_p50"),
        ttft_p95_s=row.get("ttft_p95_s"),
        errors=int(row.get("errors") or 0),
        requests=int(row.get("requests") or 0),
        server_generation_tokens_per_s=row.get("server_generation_tokens_per_s"),
        per_position=floats("per_position"),
        accepted_per_position=floats("accepted_per_position"),
        num_drafts=row.get("num_drafts"),
        mean_acceptance_length=row.get("mean_acceptance_length"),
        notes=tuple(row.get("notes") or ()),
        relative_se=row.get("relative_se"),
        tpot_p50_s=row.get("tpot_p50_s"),
        tpot_p99_s=row.get("tpot_p99_s"),
        itl_p50_s=row.get("itl_p50_s"),
        itl_p99_s=row.get("itl_p99_s"),
        by_subcategory=row.get("by_subcategory"),
        drafted_share=row.get("drafted_share"),
        prompt_tokens_mean=row.get("prompt_tokens_mean"),
        prefill_tokens_per_s=row.get("prefill_tokens_per_s"),
        by_request=_requests_from_stored(row.get("by_request")),
    )


def _requests_from_stored(stored: Any) -> tuple[tuple[str, float, float | None], ...] | None:
    if not stored:
        return None
    return tuple((str(p), float(rate), None if step is None else float(step)) for p, rate, step in stored)


def results_to_stored(results: dict[str, dict[int, LevelFigures]]) -> dict[str, dict[str, Any]]:
    """Workload -> concurrency -> figures, as the ``results`` attribute keeps them."""
    return {w: {str(b): _level_to_stored(lv) for b, lv in levels.items()} for w, levels in results.items()}


def results_from_stored(stored: dict[str, Any] | None) -> dict[str, dict[int, LevelFigures]]:
    return {
        workload: {int(b): _level_from_stored(int(b), row) for b, row in (levels or {}).items()}
        for workload, levels in (stored or {}).items()
    }


def boot_to_stored(boot: BootFacts) -> dict[str, Any]:
    return {**asdict(boot), "binding_memory_suggestion": boot.binding_memory_suggestion}


def _boot_from_stored(stored: dict[str, Any] | None) -> BootFacts:
    stored = stored or {}
    return BootFacts(
        kv_cache_tokens=stored.get("kv_cache_tokens"),
        max_concurrency=stored.get("max_concurrency"),
        memory_suggestions=tuple(stored.get("memory_suggestions") or ()),
        fp8_default_kernel_warning=bool(stored.get("fp8_default_kernel_warning")),
    )


def spec_from_json(text: str | None) -> SpeculativeConfig | None:
    """A stored spec config (None: speculation off)."""
    return None if text is None else SpeculativeConfig.from_json(text)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One trial of a study as its storage holds it."""

    number: int
    state: optuna.trial.TrialState
    params: dict[str, Any]
    value: float | None
    key: str | None  # the configuration's key as stored (types.Configuration.key); None before the trial claimed one
    spec: SpeculativeConfig | None
    worker: str | None
    results: dict[str, dict[int, LevelFigures]] = field(default_factory=dict)
    constraints: tuple[float, ...] = ()
    boot: BootFacts = field(default_factory=BootFacts)
    startup_s: float | None = None
    first_token_as_off: bool | None = None  # types.MeasuredConfig's
    server: ServerIdentity | None = None  # what the server said it is
    argv: tuple[str, ...] | None = None  # the command line it was started with
    record_file: str | None = None  # the full measurement, relative to the study folder
    fail_reason: str | None = None
    reused_from: int | None = None  # a duplicate configuration: figures copied from this trial
    retries: int = 0
    retry_of: int | None = None
    repeat: bool = False  # measured again on purpose (run-to-run noise, tied leaders), not a duplicate
    times: TrialTimes | None = None  # where its time went (None: studies from before it was kept)
    owner: RunOwner | None = None  # the run that measures it (None: stored before runs were kept)
    heartbeat_at: float | None = None  # when its run last said it was alive (Unix time; local storage)

    @property
    def measured(self) -> bool:
        """Completed with figures of its own (not copied from another trial)."""
        return self.state == optuna.trial.TrialState.COMPLETE and bool(self.results) and self.reused_from is None

    @property
    def running(self) -> bool:
        return self.state == optuna.trial.TrialState.RUNNING

    @property
    def failed(self) -> bool:
        return self.state == optuna.trial.TrialState.FAIL

    @property
    def feasible(self) -> bool:
        return all(c <= 0 for c in self.constraints)

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.spec is None else int(self.spec.num_speculative_tokens or 0)

    def measured_config(self) -> MeasuredConfig:
        return MeasuredConfig(
            trial=self.number,
            configuration=Configuration(spec=self.spec, params=self.params),
            objective=float(self.value or 0.0),
            feasible=self.feasible,
            results=self.results,
            boot=self.boot,
            startup_s=self.startup_s,
            first_token_as_off=self.first_token_as_off,
        )


def read_trial(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    """The typed record of a stored trial."""
    attrs = trial.user_attrs
    argv = attrs.get("argv")
    return TrialRecord(
        number=trial.number,
        state=trial.state,
        params=dict(trial.params),
        value=trial.value if trial.state == optuna.trial.TrialState.COMPLETE else None,
        key=attrs.get("key"),
        spec=spec_from_json(attrs.get("spec")),
        worker=attrs.get("worker"),
        results=results_from_stored(attrs.get("results")),
        constraints=tuple(float(c) for c in attrs.get("constraints", ())),
        boot=_boot_from_stored(attrs.get("boot")),
        startup_s=attrs.get("startup_s"),
        first_token_as_off=attrs.get("first_token_as_off"),
        server=ServerIdentity.from_stored(attrs.get("server")),
        argv=None if argv is None else tuple(argv),
        record_file=attrs.get("record"),
        fail_reason=attrs.get("fail_reason"),
        reused_from=attrs.get("reused_from"),
        retries=int(attrs.get("retries", 0)),
        retry_of=attrs.get("retry_of"),
        repeat=bool(attrs.get("repeat")),
        times=_times_from_stored(attrs.get("times")),
        owner=RunOwner.from_stored(attrs.get("owner")),
        heartbeat_at=attrs.get("heartbeat_at"),
    )


def read_trials(study: optuna.Study, states: tuple[optuna.trial.TrialState, ...] | None = None) -> list[TrialRecord]:
    return [read_trial(t) for t in study.get_trials(deepcopy=False, states=states)]


def measured_configs(study: optuna.Study) -> list[MeasuredConfig]:
    """Every configuration the study measured itself (reused duplicates left out)."""
    return [r.measured_config() for r in read_trials(study, (optuna.trial.TrialState.COMPLETE,)) if r.measured]


# -- writing a trial, step by step as it runs -----------------------------------------------------


def record_claim(trial: optuna.Trial, *, worker: str) -> None:
    trial.set_user_attr("worker", worker)


def record_owner(trial: optuna.Trial, owner: RunOwner) -> None:
    """The run that measures a trial, written as soon as it is asked for."""
    trial.set_user_attr("owner", owner.to_stored())


def record_heartbeat(storage: optuna.storages.BaseStorage, trial_id: int, at: float) -> None:
    """Its run is alive at ``at`` (from the heartbeat thread, which holds the storage, not the trial)."""
    storage.set_trial_user_attr(trial_id, "heartbeat_at", at)


def record_config(trial: optuna.Trial, configuration: Configuration) -> None:
    """The configuration a trial measures; written before the storage is read again (the claim)."""
    trial.set_user_attr("key", configuration.key)
    trial.set_user_attr("spec", None if configuration.spec is None else configuration.spec.to_json())


def record_boot(
    trial: optuna.Trial,
    *,
    argv: tuple[str, ...],
    startup_s: float,
    boot: BootFacts,
    server: ServerIdentity,
    first_token_as_off: bool,
) -> None:
    trial.set_user_attr("argv", list(argv))
    trial.set_user_attr("first_token_as_off", first_token_as_off)
    trial.set_user_attr("startup_s", round(startup_s, 3))
    trial.set_user_attr("boot", boot_to_stored(boot))
    trial.set_user_attr("server", asdict(server))


def record_results(
    trial: optuna.Trial,
    *,
    results: dict[str, dict[int, LevelFigures]],
    constraints: list[float],
    record_file: str | None,
) -> None:
    if record_file is not None:
        trial.set_user_attr("record", record_file)
    trial.set_user_attr("results", results_to_stored(results))
    trial.set_user_attr("constraints", constraints)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialTimes:
    """Where one trial's time went: booting its server and measuring it (the rest of the study's
    time is idle: stopping servers, waiting for memory, deciding). Modelled seconds on the
    emulator (the startup it reports, its measuring time times its time scale)."""

    boot_s: float
    measure_s: float
    modelled: bool = False


def record_times(trial: optuna.Trial, times: TrialTimes) -> None:
    trial.set_user_attr("times", asdict(times))


def _times_from_stored(stored: dict[str, Any] | None) -> TrialTimes | None:
    if not stored:
        return None
    return TrialTimes(
        boot_s=float(stored.get("boot_s") or 0.0),
        measure_s=float(stored.get("measure_s") or 0.0),
        modelled=bool(stored.get("modelled")),
    )


def record_failure(trial: optuna.Trial, reason: str) -> None:
    trial.set_user_attr("fail_reason", reason)


def record_failure_of(study: optuna.Study, number: int, reason: str) -> None:
    """The reason of a trial this run does not hold (one left RUNNING by a run that died)."""
    optuna.trial.Trial(study, study.trials[number]._trial_id).set_user_attr("fail_reason", reason)


def decision_attrs(phase: str, *, repeat: bool = False) -> dict[str, Any]:
    """What a trial is enqueued with: the decision that chose it, whether it measures a
    configuration again on purpose (else a measured configuration is reused, not measured)."""
    return {"phase": str(phase), **({"repeat": True} if repeat else {})}


def is_repeat(trial: optuna.Trial) -> bool:
    """Whether a trial was enqueued to measure its configuration again."""
    return bool(trial.user_attrs.get("repeat"))


def trial_phase(trial: optuna.Trial) -> str | None:
    """The search decision a trial was enqueued for (None: a sampler chose it)."""
    return trial.user_attrs.get("phase")


def record_reuse(trial: optuna.Trial, source: optuna.trial.FrozenTrial) -> None:
    """A trial of a configuration already measured: the source's figures, and where they came from."""
    for name, value in source.user_attrs.items():
        if name not in ("key", "spec", "worker", "owner", "heartbeat_at"):
            trial.set_user_attr(name, value)
    trial.set_user_attr("reused_from", source.number)


def retry_attrs(trial: optuna.trial.FrozenTrial, why: str) -> dict[str, Any] | None:
    """The attributes of a re-queued copy of a trial whose worker died (None: retried enough)."""
    record = read_trial(trial)
    if record.retries >= MAX_RETRIES:
        return None
    return {
        "retries": record.retries + 1,
        "retry_of": record.number,
        "retry_reason": f"worker {record.worker or '?'} {why} during trial {record.number}",
    }


MAX_RETRIES = 2  # a configuration whose workers died this many times is not queued again
