"""The recommendation from a study's measured trials: best config per workload and concurrency.

Among completed, feasible trials (each configuration counted once), the measured aggregate
output tok/s decides; the gain is reported against speculation off and against the baseline
(the configuration run today) when the study measured them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import optuna

from specsweep.engines.vllm import validate_speculative_config
from specsweep.tuning.space import OFF
from specsweep.types import SpeculativeConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredConfig:
    """One measured configuration of a study."""

    trial: int
    key: str
    spec: SpeculativeConfig | None
    objective: float
    feasible: bool
    results: dict[str, Any]  # workload -> concurrency (str) -> figures
    boot: dict[str, Any]  # boot facts read from the server's log
    startup_s: float | None

    def rate(self, workload: str, concurrency: int) -> float | None:
        row = self.results.get(workload, {}).get(str(concurrency))
        return None if row is None else row.get("output_tokens_per_s")


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
        spec = None if spec_json is None else validate_speculative_config(json.loads(spec_json))
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
