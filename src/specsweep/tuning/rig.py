"""Rig files: made from a stored study, written beside it, read back, checked against a server.

A study's trials hold every request (trials/trial-NNNN.json); a rig keeps, per measured level,
the decode step time and the request overhead those requests imply (analysis/rig.py), with the
engine, version, model and flags the servers ran with. ``studies/NAME/rig.json`` is written at
the end of every study; ``specsweep rig STUDY_FOLDER`` writes it again from stored data.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from specsweep import __version__
from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.analysis.rig import (
    LevelTiming,
    RequestShape,
    Rig,
    RigIdentity,
    RigRecommendation,
    WorkloadTiming,
    check_identity,
    fit_rig,
    level_timing,
    recommend_with_rig,
    workload_timing,
)
from specsweep.analysis.rig_file import rig_from_dict, rig_to_dict
from specsweep.analysis.study import candidate_of
from specsweep.analysis.throughput import Candidate, Drafter
from specsweep.config import ServerConfig
from specsweep.engines.registry import server_args_without_spec, validate_stored_spec
from specsweep.errors import ConfigError, FitError
from specsweep.runtime.identity import ServerIdentity
from specsweep.runtime.launcher import emulator_argv
from specsweep.runtime.measure import Measurement
from specsweep.runtime.store import measurement_to_dict, write_json_atomic
from specsweep.runtime.trial_server import placeholder_values, render_command
from specsweep.types import SpeculativeConfig

RIG_FILE = "rig.json"


def level_timings(
    measurement: Mapping[str, Any],
    spec: SpeculativeConfig | None,
    *,
    time_scale: float = 1.0,
    trial: int | None = None,
    running: Candidate | None = None,
) -> list[LevelTiming]:
    """Every level of one stored measurement (measurement_to_dict's shape), in modelled units.

    ``running`` names the configuration when no spec config is known (a server measured as it runs)."""
    out = []
    for level in measurement.get("levels", []):
        records = [r for r in level.get("records", []) if r.get("error") is None and r.get("completion_tokens")]
        spans = [
            (r["last_token_s"] - r["ttft_s"]) * time_scale
            for r in records
            if r.get("last_token_s") is not None and r.get("ttft_s") is not None
        ]
        rate = level.get("saturated_output_tokens_per_s") or level.get("output_tokens_per_s")
        acceptance = level.get("acceptance") or {}
        concurrency = int(level["concurrency"])
        candidate = running if running is not None else candidate_of(spec, concurrency)
        per_step = tokens_per_step(acceptance, records)
        timing = level_timing(
            num_speculative_tokens=candidate.num_speculative_tokens,
            concurrency=concurrency,
            drafter=candidate.drafter,
            output_tokens_per_s=None if not rate else rate / time_scale,
            tokens_per_step=per_step,
            completion_tokens=[float(r["completion_tokens"]) for r in records],
            decode_spans_s=spans,
            prompt_tokens=[float(r["prompt_tokens"]) for r in records if r.get("prompt_tokens")],
            workload=str(measurement.get("workload", "")),
            trial=trial,
            draft_share=draft_share(acceptance, records, per_step, level.get("counted_drafts")),
        )
        if timing is not None:
            out.append(timing)
    return out


def tokens_per_step(acceptance: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> float | None:
    """Tokens per decode step over every step, drafted or not.

    The counters' mean acceptance length, 1 + accepted / drafts, is per drafting step. Drafters
    that draft only sometimes (n-gram lookup drafts where the text repeats) leave other steps
    undrafted; each step emits one token plus its accepted drafts, so the requests' M - 1 decode
    tokens took (M - 1) - accepted steps in all.
    """
    length, drafts = acceptance.get("mean_acceptance_length"), acceptance.get("num_drafts")
    if not length or not drafts:
        return None
    accepted = (float(length) - 1.0) * float(drafts)
    decode = sum(float(r["completion_tokens"]) - 1.0 for r in records)
    steps = decode - accepted
    if steps <= 0 or steps < float(drafts) * 0.999:
        return float(length)  # every step drafted (or counts from another window): the counters' own
    return decode / steps


def draft_share(
    acceptance: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    per_step: float | None,
    counted_drafts: float | None,
) -> float | None:
    """Drafts per decode step: 0 when the counters ran and counted none, None when not known."""
    drafts = acceptance.get("num_drafts")
    if not drafts:
        return 0.0 if counted_drafts == 0 else None
    decode = sum(float(r["completion_tokens"]) - 1.0 for r in records)
    if not per_step or decode <= 0:
        return None
    return min(1.0, float(drafts) * per_step / decode)


def measured_timings(measurement: Measurement, running: Candidate, *, time_scale: float) -> list[LevelTiming]:
    """The levels of a measurement just taken, at the running configuration."""
    return level_timings(measurement_to_dict(measurement), None, time_scale=time_scale, running=running)


def template_server_args(server: ServerConfig) -> tuple[str, ...] | None:
    """The flags a study's server config starts every server with (spec part, host and port left out)."""
    if server.mode == "emulator":
        emulator = server.emulator
        argv = emulator_argv(
            host=server.host, port=0, speculative_config=None, profile=emulator.profile,
            time_scale=emulator.time_scale, seed=emulator.seed, extra=list(emulator.extra_args),
        )  # fmt: skip
    elif server.start is None:
        return None  # attach mode: the user starts the server; its flags are not known here
    else:
        values = placeholder_values(host=server.host, port=0, spec=None, spec_args=[], model=server.model, trial=0)
        argv = render_command(server.start, values)
        if isinstance(server.start, str):
            argv = shlex.split(argv[-1])
    return server_args_without_spec(server.engine, argv)


def _identity_from_trials(study: optuna.Study, engine: str) -> tuple[RigIdentity, float]:
    """Engine, version, model and flags from the study's trials (every trial must agree)."""
    seen: dict[str, set] = {"engine_version": set(), "model": set(), "server_args": set()}
    facts: dict[str, Any] = {}
    time_scale = 1.0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        server = trial.user_attrs.get("server")
        if server:
            seen["engine_version"].add(server.get("engine_version"))
            seen["model"].add(server.get("model"))
            facts.update({k: v for k, v in (server.get("facts") or {}).items() if v is not None})
            time_scale = float(server.get("time_scale") or 1.0)
            engine = server.get("engine") or engine
        argv = trial.user_attrs.get("argv")
        if argv:
            seen["server_args"].add(server_args_without_spec(engine, argv))
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
    return identity, time_scale


def study_level_timings(
    study: optuna.Study,
    folder: Path,
    *,
    time_scale: float,
    settings: dict[str, Any] | None = None,
    workloads: Sequence[str] | None = None,
) -> list[LevelTiming]:
    """Every measured level of every completed trial, from the trial records beside the study
    (``settings`` receives the measure settings of the first one)."""
    out: list[LevelTiming] = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = trial.user_attrs
        if "reused_from" in attrs or not attrs.get("record"):
            continue
        path = folder / attrs["record"]
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a copied study folder without its trial records: the trial gives no timing
        spec_json = attrs.get("spec")
        spec = None if spec_json is None else validate_stored_spec(json.loads(spec_json))
        for name, measurement in record.get("workloads", {}).items():
            if workloads is not None and name not in workloads:
                continue
            if settings is not None and not settings:
                settings.update(measurement.get("settings") or {})
            out.extend(level_timings(measurement, spec, time_scale=time_scale, trial=trial.number))
    return out


def build_rig(
    study: optuna.Study, folder: Path, *, server: ServerConfig | None = None, workloads: Sequence[str] | None = None
) -> Rig:
    """The rig of a stored study, from every workload's levels or only those named (FitError when
    no trial gives a timing)."""
    attrs = study.user_attrs
    identity, time_scale = _identity_from_trials(study, str(attrs.get("engine", "vllm")))
    if server is not None:
        args = template_server_args(server)
        identity = RigIdentity(**{**_fields(identity), "server_args": args or identity.server_args})
    settings: dict[str, Any] = {}
    levels = study_level_timings(study, folder, time_scale=time_scale, settings=settings, workloads=workloads)
    if not levels:
        raise FitError(
            f"no trial of the study in {folder} has request records to time (trials/*.json); a rig needs them."
        )
    shape = RequestShape(
        api=str(settings.get("api", "chat")),
        temperature=float(settings.get("temperature", attrs.get("temperature")) or 0.0),
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


def write_rig(path: Path, rig: Rig) -> None:
    write_json_atomic(path, rig_to_dict(rig))


def load_rig(path: Path) -> Rig:
    """A rig file; ConfigError that says what to do when it is missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read rig file {path}: {exc.strerror or exc}; write one with specsweep rig."
        ) from None
    except ValueError as exc:
        raise ConfigError(f"rig file {path} is not JSON ({exc}).") from None
    return rig_from_dict(data, source=str(path))


def server_identity_as_rig(identity: ServerIdentity, *, server_args: Sequence[str] | None) -> RigIdentity:
    """A running server's identity in the rig's terms (its flags only when the user gives them)."""
    engine = identity.engine or "unknown"
    return RigIdentity(
        engine=engine,
        engine_version=identity.engine_version,
        model=identity.model,
        server_args=None if server_args is None else server_args_without_spec(engine, list(server_args)),
        server_facts={k: v for k, v in identity.facts.items() if v is not None},
        specsweep_version=__version__,
    )


def check_server_against_rig(
    rig: Rig, identity: ServerIdentity, *, server_args: Sequence[str] | None
) -> tuple[str, ...]:
    """Refuse a server that is not the rig's (ConfigError naming the difference); the unchecked fields."""
    return check_identity(rig.identity, server_identity_as_rig(identity, server_args=server_args), other_name="server")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOnRig:
    """A workload measured at the running k, and what the rig recommends for it."""

    workload: str
    drafter: Drafter
    fit: AcceptanceFit
    timing: WorkloadTiming
    recommendations: tuple[RigRecommendation, ...]


def acceptance_from_levels(
    levels: Sequence[tuple[float, Sequence[float]]], *, k_max: int, seed: int = 0
) -> AcceptanceFit:
    """One fit from (steps, accepted per position) of several levels (acceptance does not depend on B).

    Pass every decode step as the first number (``decode_steps``), not only the drafting ones:
    S_i is then per step, and E(k) = 1 + S_1 + ... + S_k holds for a drafter that drafts only
    sometimes too (its undrafted steps accept nothing at every position)."""
    usable = [(n, list(c)) for n, c in levels if n and c]
    if not usable:
        raise FitError(
            "the server counted no drafts: it runs with speculation off or publishes no per-position counters; "
            "run it with the largest k you would consider and measure again."
        )
    depth = min(len(c) for _, c in usable)
    drafts = sum(n for n, _ in usable)
    counts = [sum(c[i] for _, c in usable) for i in range(depth)]
    return fit_acceptance(num_drafts=drafts, accepted_per_position=counts, k_max=max(k_max, depth), seed=seed)


def recommend_for_workload(
    rig: Rig, *, workload: str, drafter: Drafter, fit: AcceptanceFit, levels: Sequence[LevelTiming], seed: int = 0
) -> WorkloadOnRig:
    """Recommended k per concurrency for a workload measured at the running configuration."""
    timing = workload_timing(workload, levels)
    recs = recommend_with_rig(rig, {drafter: fit}, timing, k_max=fit.k_max, seed=seed)
    return WorkloadOnRig(workload=workload, drafter=drafter, fit=fit, timing=timing, recommendations=recs)


def rig_drafter(rig: Rig, method: str | None) -> Drafter:
    """The drafter the running server uses: the one named, or the rig's only one."""
    drafters = rig.drafters
    if method is not None:
        chosen = [d for d in drafters if d.method == method or d.method.split(" ", 1)[0] == method]
        if not chosen:
            raise ConfigError(
                f"the rig has no drafter {method!r}; it has: " + ", ".join(d.method for d in drafters) + "."
            )
        return chosen[0]
    if len(drafters) != 1:
        raise ConfigError(
            "the rig has several drafters (" + ", ".join(d.method for d in drafters) + "); name the running one "
            "with --drafter METHOD."
        )
    return drafters[0]


def recommend_for_measurement(
    rig: Rig, measurement: Measurement, identity: ServerIdentity, *, drafter: str | None = None, seed: int = 0
) -> WorkloadOnRig:
    """What the rig recommends for a workload measured on the running server at its current k."""
    chosen = rig_drafter(rig, drafter)
    running_levels = {lv.concurrency: lv for lv in measured_timings(measurement, _placeholder(rig), time_scale=1.0)}
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
    levels = measured_timings(measurement, running, time_scale=identity.time_scale)
    return recommend_for_workload(rig, workload=measurement.workload, drafter=chosen, fit=fit, levels=levels, seed=seed)


def decode_steps(num_drafts: float, level: LevelTiming | None) -> float:
    """Every decode step of a level: its drafting steps, or more when some steps drafted nothing."""
    if level is None or not num_drafts:
        return num_drafts
    return max(num_drafts, level.requests * (level.completion_tokens - 1.0) / level.tokens_per_step)


def _placeholder(rig: Rig) -> Candidate:
    return Candidate(drafter=rig.drafters[0] if rig.drafters else None, num_speculative_tokens=1)
