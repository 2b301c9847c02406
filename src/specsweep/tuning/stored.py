"""A stored study: opening it from its folder or storage, its analysis, and its best measured.

``analyze_stored_study`` reads the study's measured configurations and settings from its
optuna storage (tuning/records.py) and runs analysis.study on them: fits, throughput model and
the recommended k per workload and concurrency (what ``report``, ``recommend`` and the end of
``study`` show).
``pick_best`` is the plain measured ranking beside it: among completed, feasible trials (each
configuration counted once) the measured aggregate output tok/s decides, with the gain over
speculation off and over the baseline (the configuration run today) when both were measured.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from specsweep.analysis.drafters import Candidate, Drafter, drafter_of
from specsweep.analysis.snippet_plan import unmeasured_lines
from specsweep.analysis.study import StudyAnalysis, analyze_with_settings, measured_rates
from specsweep.engines.registry import EngineInfo, engine_info, known_engine, measured_speaks_for
from specsweep.errors import ConfigError, FitError
from specsweep.tuning.records import measured_configs, read_trials
from specsweep.tuning.storage import open_storage, redact_password
from specsweep.tuning.study_settings import read_study_settings
from specsweep.types import OFF_KEY, Configuration, MeasuredConfig, SpeculativeConfig, StudySettings


@dataclass(frozen=True, slots=True, kw_only=True)
class Pick:
    """The best measured configuration for one workload at one concurrency."""

    workload: str
    concurrency: int
    best: MeasuredConfig
    rate: float
    off_rate: float | None
    baseline_rate: float | None
    runner_up_gap: float | None  # how much slower the second-best configuration was (fraction)


def pick_best(
    configs: Sequence[MeasuredConfig], *, workload: str, concurrency: int, baseline: Configuration | None
) -> Pick | None:
    """The feasible configuration with the highest measured rate (repeats averaged) for a workload
    at a concurrency."""
    rated = measured_rates(configs, workload, concurrency)
    if not rated:
        return None
    best = rated[0]
    by_key = {r.key: r.tokens_per_s for r in rated}
    gap = 1.0 - rated[1].tokens_per_s / best.tokens_per_s if len(rated) > 1 and best.tokens_per_s > 0 else None
    return Pick(
        workload=workload,
        concurrency=concurrency,
        best=best.config,
        rate=best.tokens_per_s,
        off_rate=by_key.get(OFF_KEY),
        baseline_rate=by_key.get(baseline.key) if baseline is not None else None,
        runner_up_gap=gap,
    )


def nothing_to_compare(configs: list[MeasuredConfig], study: optuna.Study) -> str | None:
    """Why the study cannot recommend yet, when it measured speculation off alone (or nothing):
    a recommendation compares at least one speculative configuration with it. When nothing was
    measured because its trials failed, the last failure is the reason, not a want of trials."""
    if any(c.feasible and c.spec is not None and c.spec.num_speculative_tokens for c in configs):
        return None
    name = study.study_name
    failed = [t.fail_reason for t in read_trials(study) if t.failed and t.fail_reason]
    if not configs and failed:
        return (
            f"study {name} has measured no configuration: its {len(failed)} trial(s) failed, the last: "
            f"{failed[-1].rstrip('.')}; fix that before running it again (a study file changed to fix it is a "
            "new study: give it another --study-name)."
        )
    measured = "only speculation off" if any(c.feasible for c in configs) else "no configuration"
    return (
        f"study {name} has measured {measured}: there is nothing to compare yet; continue it with "
        f"specsweep study --resume --study-name {name} (and the same --config), without --trials or with more."
    )


def best_overall(configs: list[MeasuredConfig]) -> MeasuredConfig | None:
    """The feasible configuration with the best objective (weighted over workloads)."""
    feasible = [c for c in configs if c.feasible]
    return max(feasible, key=lambda c: c.objective) if feasible else None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredAnalysis:
    """The model-based analysis of a stored study, with the configurations and settings behind it."""

    analysis: StudyAnalysis
    configs: list[MeasuredConfig]
    settings: StudySettings


def analyze_stored_study(
    study: optuna.Study,
    *,
    seed: int = 0,
    configs: list[MeasuredConfig] | None = None,
    settings: StudySettings | None = None,
    paste_engine: str | None = None,
    max_itl_p99_s: float | None = None,
) -> StoredAnalysis:
    """Fit, model and recommend from what the study stored (``configs`` and ``settings``: read
    already). The paste is planned for ``paste_engine`` (default: the study's engine): where it
    cannot take a per-batch-size choice, the paste says which levels give way. ``max_itl_p99_s``:
    a latency target in place of the study's own."""
    configs = configs if configs is not None else measured_configs(study)
    too_little = nothing_to_compare(configs, study)
    if too_little is not None:
        raise FitError(too_little)
    settings = settings if settings is not None else read_study_settings(study, configs)
    engine = engine_info(paste_engine or settings.engine)
    if max_itl_p99_s is not None:
        settings = replace(settings, max_itl_p99_s=max_itl_p99_s)
    measured_on = known_engine(settings.engine)  # the server that was measured
    idle = never_drafting(configs, measured_on.never_drafts, settings.k_max) if measured_on is not None else ()
    # The measured server's flags and version decide what a table does, where the paste is for its engine.
    same = measured_speaks_for(settings.engine, engine)
    refusal = engine.table_refusal_on(settings.server_args if same else None, settings.engine_version if same else None)
    analysis = analyze_with_settings(configs, settings, seed=seed, table_refusal=refusal, idle=idle)
    analysis = _pasted_for(engine, analysis, configs, settings, seed=seed, idle=idle, refusal=refusal)
    return StoredAnalysis(analysis=analysis, configs=configs, settings=settings)


# How a paste's notes name an engine.
ENGINE_WORDS = {"sglang": "SGLang", "llama.cpp": "llama.cpp", "vllm": "vLLM", "emulator": "vLLM"}


def _pasted_for(
    engine: EngineInfo,
    analysis: StudyAnalysis,
    configs: Sequence[MeasuredConfig],
    settings: StudySettings,
    *,
    seed: int,
    idle: Collection[Candidate],
    refusal: Callable[[SpeculativeConfig], str | None],
) -> StudyAnalysis:
    """The analysis with each workload's paste chosen from what ``engine`` runs. A drafter the study
    measured with sampled drafting that the engine runs with the draft's top token (SGLang; llama.cpp's
    eagle3, dflash and dspark) is no candidate of the paste where its greedy drafting (the top token)
    was measured too; where it was not, the paste may keep it, and its notes say so."""
    feasible = [c for c in configs if c.feasible]
    unrun = {d for c in feasible if c.spec and not engine.runs_as_measured(c.spec) and (d := drafter_of(c.spec))}
    if not unrun:
        return analysis
    greedy_ks: dict[Drafter, set[int]] = {}
    for c in feasible:
        sibling = next((d for d in unrun if replace(d, draft_sample_method="greedy") == drafter_of(c.spec)), None)
        if sibling is not None and c.spec is not None and c.spec.num_speculative_tokens:
            greedy_ks.setdefault(sibling, set()).add(c.spec.num_speculative_tokens)
    snippets = analysis.snippets
    if greedy_ks:  # what the engine runs was measured: the paste is chosen from that alone
        left_out = {
            Candidate(drafter=d, num_speculative_tokens=k) for d in greedy_ks for k in range(1, analysis.k_max + 1)
        }
        snippets = analyze_with_settings(
            configs, settings, seed=seed, table_refusal=refusal, idle={*idle, *left_out}
        ).snippets
    words = ENGINE_WORDS.get(engine.name, engine.name)
    return replace(
        analysis,
        snippets=tuple(replace(plan, unmeasured=unmeasured_lines(plan, words, unrun, greedy_ks)) for plan in snippets),
    )


def load_stored_study(folder: Path | None, *, storage: str | None = None, name: str | None = None) -> optuna.Study:
    """A study from its folder (studies/NAME/study.db) or from a storage URL and a name."""
    if storage is None:
        if folder is None:
            raise ConfigError(
                "name a study folder (e.g. studies/emulator-technical) or pass --storage and --study-name."
            )
        database = Path(folder) / "study.db"
        if not database.is_file():
            raise ConfigError(
                f"{folder} holds no study.db; pass the study's folder, or --storage URL --study-name NAME."
            )
        storage = f"sqlite:///{database.as_posix()}"
    opened = open_storage(storage, heartbeat_s=None)
    names = [s.study_name for s in optuna.get_all_study_summaries(opened)]
    if not names:
        raise ConfigError(
            f"{redact_password(storage)} holds no study (nothing was ever measured into it): run specsweep study "
            "to make one, and pass its folder."
        )
    if name is None:
        if folder is not None and Path(folder).name in names:
            name = Path(folder).name
        elif len(names) == 1:
            name = names[0]  # a copied or renamed folder holds the one study it was made for
        else:
            found = ", ".join(names) or "none"
            raise ConfigError(f"{redact_password(storage)} holds {len(names)} studies ({found}); pass --study-name.")
    try:
        return optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise ConfigError(
            f"there is no study {name!r} in {redact_password(storage)} (studies there: {', '.join(names) or 'none'}); "
            "pass --study-name."
        ) from None


def never_drafting(
    configs: Sequence[MeasuredConfig], never_drafts: Callable[[SpeculativeConfig], str | None], k_max: int | None
) -> frozenset[Candidate]:
    """Each measured drafter's draft lengths up to ``k_max`` that the engine runs as speculation off."""
    out = set()
    for config in configs:
        if config.spec is None or not config.spec.num_speculative_tokens:
            continue
        top = max(k_max or 0, config.spec.num_speculative_tokens)
        for k in range(1, top + 1):
            spec = replace(config.spec, num_speculative_tokens=k)
            if never_drafts(spec):
                out.add(Candidate(drafter=drafter_of(spec), num_speculative_tokens=k))
    return frozenset(out)
