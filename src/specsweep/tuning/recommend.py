"""A study's stored trials as analysis input, the model-based analysis, and the best measured.

``analyze_stored_study`` reads the study's measured configurations and settings from its
optuna storage and runs analysis.study on them: fits, throughput model and the recommended k
per workload and concurrency (what ``report``, ``recommend`` and the end of ``study`` show).
``pick_best`` is the plain measured ranking beside it: among completed, feasible trials (each
configuration counted once) the measured aggregate output tok/s decides, with the gain over
speculation off and over the baseline (the configuration run today) when both were measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import optuna

from specsweep.analysis.study import StudyAnalysis, analyze_study
from specsweep.engines.registry import validate_stored_spec
from specsweep.errors import ConfigError
from specsweep.tuning.space import OFF
from specsweep.tuning.storage import open_storage, shown
from specsweep.types import MeasuredConfig


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


def measured_configs(study: optuna.Study) -> list[MeasuredConfig]:
    """Every configuration the study measured itself (reused duplicates left out)."""
    out = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = trial.user_attrs
        if "reused_from" in attrs or "results" not in attrs:
            continue
        spec_json = attrs.get("spec")
        spec = None if spec_json is None else validate_stored_spec(json.loads(spec_json))
        out.append(
            MeasuredConfig(
                trial=trial.number,
                key=attrs.get("key", OFF),
                spec=spec,
                objective=float(trial.value or 0.0),
                feasible=all(c <= 0 for c in attrs.get("constraints", [0.0])),
                results=attrs["results"],
                boot=attrs.get("boot", {}),
                startup_s=attrs.get("startup_s"),
            )
        )
    return out


def pick_best(
    configs: list[MeasuredConfig], *, workload: str, concurrency: int, baseline_key: str | None
) -> Pick | None:
    """The feasible configuration with the highest measured rate for a workload at a concurrency."""
    rated = [(c.rate(workload, concurrency), c) for c in configs if c.feasible]
    rated = [(rate, c) for rate, c in rated if rate is not None]
    if not rated:
        return None
    rated.sort(key=lambda item: item[0], reverse=True)
    best_rate, best = rated[0]
    by_key = {c.key: r for r, c in rated}
    gap = 1.0 - rated[1][0] / best_rate if len(rated) > 1 and best_rate > 0 else None
    return Pick(
        workload=workload,
        concurrency=concurrency,
        best=best,
        rate=best_rate,
        off_rate=by_key.get(OFF),
        baseline_rate=by_key.get(baseline_key) if baseline_key else None,
        runner_up_gap=gap,
    )


def best_overall(configs: list[MeasuredConfig]) -> MeasuredConfig | None:
    """The feasible configuration with the best objective (weighted over workloads)."""
    feasible = [c for c in configs if c.feasible]
    return max(feasible, key=lambda c: c.objective) if feasible else None


def study_settings(study: optuna.Study, configs: list[MeasuredConfig]) -> dict:
    """What the study was asked to do, from its attributes (older studies: from its trials)."""
    attrs = study.user_attrs
    workloads = list(attrs.get("workloads") or sorted({w for c in configs for w in c.results}))
    levels = attrs.get("concurrency") or sorted(
        {int(level) for c in configs for r in c.results.values() for level in r}
    )
    k_range = attrs.get("num_speculative_tokens_range")
    baseline_key = attrs.get("baseline_key")
    baseline = None
    if baseline_key and baseline_key != OFF:
        baseline = validate_stored_spec(json.loads(baseline_key))
    return {
        "workloads": workloads,
        "concurrency_levels": [int(x) for x in levels],
        "objective_concurrency": int(attrs.get("objective_concurrency") or min(int(x) for x in levels)),
        "k_max": int(k_range[1]) if k_range else None,
        "baseline": baseline,
        "engine": attrs.get("engine", "vllm"),
        "temperature": attrs.get("temperature"),
    }


def analyze_stored_study(study: optuna.Study, *, seed: int = 0) -> tuple[StudyAnalysis, list[MeasuredConfig], dict]:
    """The model-based analysis of a stored study, with the configurations and settings behind it."""
    configs = measured_configs(study)
    settings = study_settings(study, configs)
    analysis = analyze_study(
        configs,
        workloads=settings["workloads"],
        concurrency_levels=settings["concurrency_levels"],
        objective_concurrency=settings["objective_concurrency"],
        k_max=settings["k_max"],
        baseline=settings["baseline"],
        seed=seed,
    )
    return analysis, configs, settings


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
    if name is None:
        if folder is not None and Path(folder).name in names:
            name = Path(folder).name
        elif len(names) == 1:
            name = names[0]  # a copied or renamed folder holds the one study it was made for
        else:
            raise ConfigError(
                f"{shown(storage)} holds {len(names)} studies ({', '.join(names) or 'none'}); pass --study-name."
            )
    try:
        return optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise ConfigError(
            f"there is no study {name!r} in {shown(storage)} (studies there: {', '.join(names) or 'none'}); "
            "pass --study-name."
        ) from None
