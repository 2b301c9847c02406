"""Run-to-run noise: how much one configuration's measured rate moves from one server start to the next.

It is a part of the one step model (analysis/step_model.py), not an estimate beside it: the
start effect sigma_start, shared by every level of one start, fitted with the rest of the model
and drawn toward the engine's usual noise (a ``RunNoisePrior``) as far as the study's own starts
do not outweigh it, together with the level's own error from its requests' spread
(``StepPosterior.run_sd``). The search, adaptive stopping and the report read this one figure.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specsweep.analysis.step_model import CellKey
from specsweep.analysis.throughput import ThroughputModel, family_observations, fit_throughput_model, study_start_sd
from specsweep.types import CapturedWidths, MeasuredConfig, NoisePriors, RunNoisePrior


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNoise:
    """One workload's run-to-run relative sd, and what it rests on."""

    workload: str
    relative_sd: float  # of one start's measured rate: the start effect and the level's own error
    start_sd: float  # the start effect alone
    starts: int  # server starts the model saw
    repeated: int  # configurations measured in more than one start
    df: int  # levels beyond the model's parameters
    prior: RunNoisePrior | None = None

    @property
    def basis(self) -> str:
        """What the estimate rests on, in words."""
        text = f"the step model over {self.starts} start{'s' if self.starts != 1 else ''}"
        if self.repeated:
            text += f", {self.repeated} configuration{'s' if self.repeated > 1 else ''} measured in more than one"
        if self.prior is not None:
            text += f", drawn toward the engine's usual {100 * self.prior.relative_sd:.0f}% ({self.prior.source})"
        return text


def noise_of(model: ThroughputModel, workload: str, prior: NoisePriors | None = None) -> RunNoise:
    """The run-to-run noise the step model found (``prior``: the engine's, whose start part it names)."""
    posterior = model.posterior
    starts_of: dict[CellKey, set[int]] = {}
    for o in posterior.observations:
        starts_of.setdefault(o.cell.key, set()).add(o.start)
    return RunNoise(
        workload=workload,
        relative_sd=posterior.run_sd,
        start_sd=posterior.start_sd,
        starts=len({o.start for o in posterior.observations}),
        repeated=len({key[1:4] for key, starts in starts_of.items() if len(starts) > 1}),
        df=posterior.df,
        prior=None if prior is None else prior.start,
    )


def run_to_run_noise(
    configs: Sequence[MeasuredConfig],
    workload: str,
    prior: NoisePriors | None = None,
    *,
    workloads: Iterable[str] = (),
    captured_widths: CapturedWidths = CapturedWidths(),
) -> RunNoise | None:
    """The run-to-run noise of ``workload`` from the step model of its feasible configurations
    (None: nothing measured), its start spread the one the study's ``workloads`` share, as the
    search and the report read it (throughput.study_start_sd), with the widths the server captured."""
    feasible = [c for c in configs if c.feasible]
    observations = family_observations(feasible, workload)
    if not observations:
        return None
    shared = study_start_sd(feasible, {workload, *workloads}, noise_prior=prior, captured_widths=captured_widths)
    model = fit_throughput_model(observations, noise_prior=prior, captured_widths=captured_widths, shared_start=shared)
    return noise_of(model, workload, prior)
