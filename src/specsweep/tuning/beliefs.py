"""What a study knows of each cell before its next decision: the one model of every workload, and
joint draws of each runnable configuration's rate per (workload, concurrency)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from specsweep.analysis.drafters import Candidate
from specsweep.analysis.noise import RunNoise
from specsweep.analysis.rates import RateSample, sample_rates
from specsweep.analysis.study import WorkloadModel, measured_rates, model_workload, study_k_max
from specsweep.analysis.throughput import study_start_sd
from specsweep.analysis.value import CellBelief
from specsweep.errors import FitError
from specsweep.types import CapturedWidths, MeasuredConfig, StudySettings

DRAWS = 400  # joint rate draws per cell the values are computed on


def cell_beliefs(
    models: Mapping[str, WorkloadModel],
    configs: Sequence[MeasuredConfig],
    candidates: Mapping[str, Candidate],
    failed: Collection[str],
    settings: StudySettings,
    noise: Mapping[str, RunNoise],
) -> list[CellBelief]:
    """What the study knows of every cell: joint draws of each runnable configuration's rate
    (``candidates``: by configuration key; ``failed``: keys not to be started again)."""
    runnable = {c for key, c in candidates.items() if key not in failed}
    mean_weight = sum(settings.workload_weights.values()) / len(settings.workload_weights)
    k_min = settings.k_range[0] if settings.k_range else 1
    out = []
    for index, (workload, weight) in enumerate(settings.workload_weights.items()):
        model = models.get(workload)
        if model is None or model.throughput is None:
            continue
        for level in settings.concurrency_levels:
            if level not in model.throughput.concurrency_levels:
                continue
            try:
                sample = sample_rates(
                    model.throughput, model.fits, concurrency=level, k_min=k_min, draws=DRAWS,
                    seed=1000 * index + level,
                )  # fmt: skip
            except FitError:
                continue
            sample = _restrict(sample, runnable)
            if not sample.candidates:
                continue
            measured = frozenset(candidates[r.key] for r in measured_rates(configs, workload, level)
                                 if r.key in candidates)  # fmt: skip
            out.append(
                CellBelief(
                    workload=workload, concurrency=level, weight=weight / mean_weight, sample=sample, measured=measured,
                    noise=noise[workload].relative_sd if workload in noise else 0.02,
                )
            )  # fmt: skip
    return out


def _restrict(sample: RateSample, keep: Collection[Candidate]) -> RateSample:
    """The sample's columns of the configurations in ``keep``."""
    columns = [j for j, c in enumerate(sample.candidates) if c in keep]
    return RateSample(
        concurrency=sample.concurrency,
        candidates=tuple(sample.candidates[j] for j in columns),
        tokens_per_step=sample.tokens_per_step[columns],
        step_time_s=sample.step_time_s[columns],
        step_time_source=tuple(sample.step_time_source[j] for j in columns),
        tokens_per_s=sample.tokens_per_s[columns],
        draws=sample.draws[:, columns],
    )


def model_search(
    configs: Sequence[MeasuredConfig],
    workloads: Mapping[str, float],
    *,
    k_max: int,
    noise_prior: Any = None,
    captured_widths: CapturedWidths = CapturedWidths(),
) -> dict[str, WorkloadModel]:
    """The report's models of every workload."""
    k_max = study_k_max(configs, k_max)
    shared = study_start_sd(configs, workloads, noise_prior=noise_prior, captured_widths=captured_widths)
    out = {}
    for name in workloads:
        try:
            out[name] = model_workload(
                configs,
                name,
                k_max=k_max,
                noise_prior=noise_prior,
                captured_widths=captured_widths,
                shared_start=shared,
            )
        except FitError:
            continue
    return out
