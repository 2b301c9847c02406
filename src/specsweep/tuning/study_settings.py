"""What a study was asked to do, as its optuna storage keeps it (the study's own attributes).

The only code that reads or writes a study's ``user_attrs``; studies from before an attribute
existed read it from their trials.
"""

from __future__ import annotations

from dataclasses import replace

import optuna

from specsweep.engines.registry import known_engine, server_args_without_spec
from specsweep.runtime.identity import ServerIdentity
from specsweep.tuning.records import measured_configs
from specsweep.types import CapturedWidths, Configuration, MeasuredConfig, NoisePriors, StudySettings


def write_study_settings(study: optuna.Study, settings: StudySettings) -> None:
    attrs = {
        "config_source": settings.config_source,
        "engine": settings.engine,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "objective_concurrency": settings.objective_concurrency,
        "workloads": dict(settings.workload_weights),
        "concurrency": list(settings.concurrency_levels),
        "num_speculative_tokens_range": list(settings.k_range) if settings.k_range else None,
        "max_num_seqs": settings.max_num_seqs,
        "tolerance": settings.tolerance,
        "max_itl_p99_s": settings.max_itl_p99_s,
        "captured_widths": settings.captured_widths.to_stored(),
    }
    for name, value in attrs.items():
        study.set_user_attr(name, value)
    if settings.baseline is not None:
        study.set_user_attr("baseline_key", settings.baseline.key)


def read_study_settings(study: optuna.Study, configs: list[MeasuredConfig] | None = None) -> StudySettings:
    """The settings a study was created with (studies without them: inferred from its trials)."""
    attrs = study.user_attrs
    configs = configs if configs is not None else measured_configs(study)
    stored = attrs.get("workloads") or sorted({w for c in configs for w in c.results})
    weights = dict(stored) if isinstance(stored, dict) else dict.fromkeys(stored, 1.0)
    levels = attrs.get("concurrency") or sorted({b for c in configs for r in c.results.values() for b in r})
    k_range = attrs.get("num_speculative_tokens_range")
    baseline_key = attrs.get("baseline_key")
    flags = attrs.get("engine_flags")
    return StudySettings(
        workload_weights=weights,
        concurrency_levels=tuple(int(b) for b in levels),
        objective_concurrency=int(attrs.get("objective_concurrency") or min(int(b) for b in levels)),
        k_range=(int(k_range[0]), int(k_range[1])) if k_range else None,
        baseline=None if baseline_key is None else Configuration.from_key(baseline_key),
        engine=str(attrs.get("engine", "vllm")),
        temperature=attrs.get("temperature"),
        max_tokens=attrs.get("max_tokens"),
        config_source=attrs.get("config_source"),
        max_num_seqs=attrs.get("max_num_seqs"),
        tolerance=float(attrs.get("tolerance") or 0.01),
        noise_prior=_engine_noise(str(attrs.get("engine", "vllm"))),
        engine_version=_engine_version(study),
        server_args=_server_args(study, str(attrs.get("engine", "vllm"))),
        engine_flags=frozenset(flags) if flags else None,
        max_itl_p99_s=attrs.get("max_itl_p99_s"),
        captured_widths=stored_captured_widths(study),
    )


def _engine_noise(engine: str) -> NoisePriors | None:
    """What the study's engine's measurements usually stray by (None: an engine this version does not know)."""
    known = known_engine(engine)
    return known.noise if known is not None else None


def write_engine_flags(study: optuna.Study, flags: frozenset[str] | None) -> None:
    """Keep the flag names the server binary's --help listed, so the paste speaks that build."""
    if flags:
        study.set_user_attr("engine_flags", sorted(flags))


def _engine_version(study: optuna.Study) -> str | None:
    """The version the study's latest measured server gave (its trials' ``server`` identity)."""
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: -t.number):
        server = trial.user_attrs.get("server")
        if isinstance(server, dict) and server.get("engine_version"):
            return str(server["engine_version"])
    return None


def _server_args(study: optuna.Study, engine: str) -> tuple[str, ...] | None:
    """The flags the study's latest started server ran, spec flags, place and secrets aside: the
    command it was started with, or in attach mode (where the user starts it) the one the server
    gave of itself (SGLang's launch command). None: no trial kept either."""
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: -t.number):
        argv = trial.user_attrs.get("argv")
        if not argv:
            said = ServerIdentity.from_stored(trial.user_attrs.get("server"))
            argv = said.launch_args if said is not None else None
        if isinstance(argv, list | tuple) and argv:
            return server_args_without_spec(engine, [str(a) for a in argv])
    return None


def adopt_max_num_seqs(study: optuna.Study, max_num_seqs: int) -> None:
    """The most sequences the study's server batches, as a started server gave it, unless the study
    has it already (the first server to say it sets it, as the first worker creates the study)."""
    if study.user_attrs.get("max_num_seqs") is None:
        study.set_user_attr("max_num_seqs", max_num_seqs)


def stored_max_num_seqs(study: optuna.Study) -> int | None:
    """The most sequences the study's server batches, as its storage has it (None: no server said yet)."""
    value = study.user_attrs.get("max_num_seqs")
    return int(value) if value is not None else None


def adopt_captured_widths(study: optuna.Study, widths: CapturedWidths) -> None:
    """The verified widths the study's server captured graphs for, as a started server gave them,
    unless the study has them already (the first server to say them sets them)."""
    if (widths or widths.unknown) and not study.user_attrs.get("captured_widths"):
        study.set_user_attr("captured_widths", widths.to_stored())


def stored_captured_widths(study: optuna.Study) -> CapturedWidths:
    """The verified widths the study's server captured graphs for, as its storage has them (empty:
    no server said them yet, or none does)."""
    return CapturedWidths.from_stored(study.user_attrs.get("captured_widths"))


def with_server_facts(settings: StudySettings, study: optuna.Study) -> StudySettings:
    """``settings`` with what the study's started servers said of themselves as its storage has it
    (max_num_seqs, the captured widths); read again only while one of them is not known."""
    if settings.max_num_seqs is not None and settings.captured_widths:
        return settings
    return replace(settings, max_num_seqs=stored_max_num_seqs(study), captured_widths=stored_captured_widths(study))


def write_itl_limit(study: optuna.Study, limit_s: float | None) -> None:
    """A new latency target for an existing study (it only changes what is recommended)."""
    study.set_user_attr("max_itl_p99_s", limit_s)


# What a study measures, by its attribute and the study-file key that sets it: a run that
# continues the study (--resume) must measure with the same ones, or its trials answer another
# question (and optuna refuses a search space whose choices changed).
MEASURED_SETTINGS = {
    "engine": "server.engine",
    "workloads": "[workloads]",
    "temperature": "measure.temperature",
    "max_tokens": "measure.max_tokens",
    "concurrency": "measure.concurrency",
    "objective_concurrency": "objective.concurrency",
    "num_speculative_tokens_range": "search.num_speculative_tokens",
}
# What every worker of a shared study must share (each brings its own [server], and may measure
# at the levels its server takes).
JOINED_SETTINGS = ("workloads", "temperature", "max_tokens", "objective_concurrency")


def _stored_form(settings: StudySettings) -> dict[str, object]:
    """``settings`` as write_study_settings stores them (lists for tuples), for comparison."""
    return {
        "engine": settings.engine,
        "workloads": dict(settings.workload_weights),
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "concurrency": list(settings.concurrency_levels),
        "objective_concurrency": settings.objective_concurrency,
        "num_speculative_tokens_range": list(settings.k_range) if settings.k_range else None,
    }


def changed_settings(
    study: optuna.Study, mine: StudySettings, names: tuple[str, ...] = tuple(MEASURED_SETTINGS)
) -> list[str]:
    """Each of ``names`` the study was created with and ``mine`` sets otherwise, as
    ``key stored (now value)`` with the study file's key; empty when they agree."""
    attrs, now = study.user_attrs, _stored_form(mine)
    return [
        f"{MEASURED_SETTINGS[name]} {attrs[name]!r} (now {now[name]!r})"
        for name in names
        if name in attrs and attrs[name] != now[name]
    ]


def check_joinable(study: optuna.Study, mine: StudySettings) -> str | None:
    """The settings a joining worker measures differently from the study (None: it may join)."""
    changed = changed_settings(study, mine, JOINED_SETTINGS)
    return "has " + "; ".join(changed) if changed else None
