"""Net tokens per second against draft length: measured levels in, the one step model out.

An observation is one measured level: aggregate output tok/s at draft length k (0 = speculation
off) and concurrency B, with the tokens per step E measured in the same window. B streams each
emit E tokens per step, so the effective step time is T = B * E / rate. T depends on the server,
the drafter and what the step processes, not on the text (a drafter that looks its drafts up
drafts only where the text matches: its share of drafting steps enters what the step processes).
Every observation of a study, at every concurrency, of every drafter and start, is fitted by the
one step model (analysis/step_model.py); a workload's acceptance then turns T into its rate:
R(k, B) = B * E_w(k) / T(k, B) (analysis/rates.py). A workload measured at context levels
(``W@16k``) is one fit with the workload as it is: its levels differ by the context each sequence
attends over, a covariate of the step (``context_tokens``), and share their starts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter, candidate_of
from specsweep.analysis.start_effect import SharedStart, StartPrefill
from specsweep.analysis.step_fit import fit_step_model, shared_start_sd
from specsweep.analysis.step_model import Cell, StepObservation, StepPosterior
from specsweep.errors import FitError
from specsweep.measurement.paired import Request, paired_errors
from specsweep.types import CapturedWidths, MeasuredConfig, NoisePriors
from specsweep.workload import parse_context_variant


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputObservation:
    """One measured level: rate and tokens per step at (k, concurrency, drafter), and its start."""

    num_speculative_tokens: int  # 0 = speculation off
    concurrency: int
    output_tokens_per_s: float  # aggregate, client side
    tokens_per_step: float = 1.0  # E measured in the same window (1 with speculation off)
    drafter: Drafter | None = None
    workload: str = ""
    weight: float = 1.0  # requests measured
    start: int = 0  # the server start it was measured in (a trial)
    relative_se: float | None = None  # the level's own error from its requests' spread
    drafted_share: float = 1.0  # share of decode steps that drafted (a lookup drafter's counters say it)
    context_tokens: int = 0  # the workload's context level (0: as it is)
    start_prefill: StartPrefill | None = None  # how fast its start prefilled (None: not measured)

    @property
    def step_time_s(self) -> float:
        return self.concurrency * self.tokens_per_step / self.output_tokens_per_s

    @property
    def candidate(self) -> Candidate:
        if self.num_speculative_tokens == 0 or self.drafter is None:
            return OFF
        return Candidate(drafter=self.drafter, num_speculative_tokens=self.num_speculative_tokens)


def study_observations(configs: Sequence[MeasuredConfig], workload: str) -> list[ThroughputObservation]:
    """Every measured level of one workload as a throughput observation (a per-batch-size table
    gives each level the k it ran). The search and the report both build their model from these."""
    base, context = parse_context_variant(workload)[0], parse_context_variant(workload)[1] or 0
    paired = _paired_errors(configs, workload)
    out = []
    for config in configs:
        prefill = start_prefill(config, base)
        for concurrency, row in config.results.get(workload, {}).items():
            rate = row.output_tokens_per_s
            if not rate or rate <= 0:
                continue
            candidate = candidate_of(config.spec, concurrency)
            tokens_per_step, share = 1.0, 1.0
            if not candidate.off:
                share = 1.0 if row.drafted_share is None else row.drafted_share
                length = row.mean_acceptance_length
                if not length and share > 0:
                    continue  # drafted but no acceptance: its step time is unknown
                # the counters' length is per drafting step; the other steps emit one token
                tokens_per_step = 1.0 + share * (float(length or 1.0) - 1.0)
            out.append(
                ThroughputObservation(
                    num_speculative_tokens=candidate.num_speculative_tokens,
                    concurrency=concurrency,
                    output_tokens_per_s=float(rate),
                    tokens_per_step=tokens_per_step,
                    drafter=candidate.drafter,
                    workload=workload,
                    weight=float(row.requests or 1),
                    start=config.trial,
                    relative_se=paired.get((config.trial, concurrency), row.relative_se),
                    drafted_share=share,
                    context_tokens=context,
                    start_prefill=prefill,
                )
            )
    return out


def start_prefill(config: MeasuredConfig, workload: str) -> StartPrefill | None:
    """How fast a start prefilled ``workload`` (as it is, no context level) at one stream, where
    nothing queues before a prefill, and the starts its first token is compared with: every start
    whose first token costs what speculation off's does, or else its configuration's own."""
    row = config.results.get(workload, {}).get(1)
    speed = row.prefill_tokens_per_s if row is not None else None
    if not speed or speed <= 0 or not math.isfinite(speed):
        return None
    return StartPrefill(tokens_per_s=float(speed), alike="" if config.first_token_as_off else config.key)


def _paired_errors(configs: Sequence[MeasuredConfig], workload: str) -> dict[tuple[int, int], float]:
    """Each level's error paired on the prompts it shares with the other levels of its cell group
    (measurement/paired.py), by (trial, concurrency): of its step time, or of its rate where that
    is the smaller or the step times are not all known, as the level's own (tuning/records._precision)."""
    out: dict[tuple[int, int], float] = {}
    for levels in cell_group_requests(configs, workload).values():
        out.update({key: error.level for key, error in paired_errors(levels).items()})
    return out


CellGroup = tuple[int, Drafter | None]  # a concurrency and a drafter (None: speculation off)


def cell_group_requests(
    configs: Sequence[MeasuredConfig], workload: str
) -> dict[CellGroup, dict[tuple[int, int], tuple[Request, ...]]]:
    """The answered requests of every measured level of one workload, by cell group (the levels
    whose errors are paired together) and by (trial, concurrency): what the step model's errors
    and the live stopping rule (tuning/trial.level_targets) pair on."""
    groups: dict[CellGroup, dict[tuple[int, int], tuple[Request, ...]]] = {}
    for config in configs:
        for concurrency, row in config.results.get(workload, {}).items():
            if row.by_request:
                group = (concurrency, candidate_of(config.spec, concurrency).drafter)
                groups.setdefault(group, {})[(config.trial, concurrency)] = row.by_request
    return groups


def family_observations(configs: Sequence[MeasuredConfig], workload: str) -> list[ThroughputObservation]:
    """Every measured level of ``workload`` and of the same workload at every other context level
    it was measured at (``W``, ``W@16k``, ...): what one step model is fitted over."""
    base = parse_context_variant(workload)[0]
    names = sorted({w for c in configs for w in c.results if parse_context_variant(w)[0] == base} | {workload})
    return [o for name in names for o in study_observations(configs, name)]


def cell_of(candidate: Candidate, concurrency: int, context_tokens: int = 0) -> Cell:
    """The step model's cell of a candidate at a concurrency and context level."""
    return Cell(
        concurrency=concurrency,
        num_speculative_tokens=0 if candidate.off else candidate.num_speculative_tokens,
        drafter=None if candidate.off else candidate.drafter,
        context_tokens=context_tokens,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputModel:
    """The one step model of a study's levels, and the observations behind it, read at one context
    level (the workload's: its predictions are at it)."""

    posterior: StepPosterior
    observations: tuple[ThroughputObservation, ...]
    concurrency_levels: tuple[int, ...]  # measured at this context level
    context_tokens: int = 0

    def step_time_s(self, candidate: Candidate, concurrency: int, accepted: float | None = None) -> tuple[float, str]:
        """Point step time of a candidate and where it comes from: "measured" (the model with its
        measured deviation there) or "model" (the physics alone). ``accepted``: the tokens its
        drafting steps accept (StepPosterior.share)."""
        cell = cell_of(candidate, concurrency, self.context_tokens)
        return self.posterior.mean_s(cell, accepted), "measured" if self.posterior.measured(cell) else "model"

    def step_time_draws(
        self,
        candidates: Sequence[Candidate],
        concurrency: int,
        *,
        draws: int,
        rng: np.random.Generator,
        accepted: Sequence[float | None] | None = None,
    ) -> np.ndarray:
        """Joint draws of the step time of each candidate at a concurrency, (draws, len(candidates))."""
        cells = [cell_of(c, concurrency, self.context_tokens) for c in candidates]
        return self.posterior.draws(cells, draws=draws, rng=rng, accepted=accepted)

    def measured_tokens_per_s(self, candidate: Candidate, *, concurrency: int, workload: str) -> float | None:
        """Mean measured rate of one configuration for a workload at a concurrency, if measured."""
        rates = [
            o.output_tokens_per_s
            for o in self.observations
            if o.concurrency == concurrency and o.workload == workload and o.candidate == candidate
        ]
        return float(np.mean(rates)) if rates else None

    def drafted_share(self, candidate: Candidate, concurrency: int, accepted: float | None = None) -> float:
        """The share of a candidate's steps that draft, as the step model has it (1: every step;
        ``accepted``: the tokens its drafting steps accept, StepPosterior.share)."""
        if candidate.off:
            return 0.0
        return self.posterior.share(cell_of(candidate, concurrency, self.context_tokens), accepted)

    @property
    def basis(self) -> str:
        """The fitted model in words, for the report and the console."""
        return describe(self.posterior)

    def to_dict(self) -> dict[str, Any]:
        """The fitted model as results.json keeps it: each part's cost, the noise, the levels."""
        posterior = self.posterior
        return {
            "basis": self.basis,
            "parts_s": dict(zip(part_names(posterior), (float(t) for t in posterior.theta), strict=True)),
            "probabilistic_factor": {
                m: math.exp(float(g))
                for m, g in zip(posterior.sampled_methods, posterior.sampling_factors, strict=True)
            },
            "prefill_slope": posterior.prefill_slope,
            "knee_tokens": posterior.knee,
            "captured_widths": posterior.captured_widths.to_stored(),
            "start_sd": posterior.start_sd,
            "start_sd_df": None if math.isinf(posterior.spread_df) else posterior.spread_df,
            "cell_sd": posterior.cell_sd,
            "run_sd": posterior.run_sd,
            "observations": [asdict(o) for o in self.observations],
        }


def fit_throughput_model(
    observations: Sequence[ThroughputObservation],
    *,
    noise_prior: NoisePriors | None = None,
    captured_widths: CapturedWidths = CapturedWidths(),
    context_tokens: int = 0,
    shared_start: SharedStart | None = None,
) -> ThroughputModel:
    """The one step model from measured rates, read at ``context_tokens`` (the model's own levels
    are those measured there). FitError when nothing is usable."""
    for o in observations:
        values = (o.output_tokens_per_s, o.tokens_per_step, o.weight)
        if o.concurrency < 1 or o.num_speculative_tokens < 0 or not all(math.isfinite(v) and v > 0 for v in values):
            raise FitError(
                f"observation at k={o.num_speculative_tokens}, concurrency {o.concurrency} needs a positive "
                "rate, tokens per step and weight; leave out levels that produced no tokens."
            )
    if not observations:
        raise FitError("no throughput observations: measure at least one configuration.")
    steps = step_observations(observations)
    posterior = _fitted(tuple(steps), noise_prior, captured_widths, shared_start)
    return ThroughputModel(
        posterior=posterior,
        observations=tuple(observations),
        concurrency_levels=tuple(sorted({o.concurrency for o in observations if o.context_tokens == context_tokens})),
        context_tokens=context_tokens,
    )


def step_observations(observations: Sequence[ThroughputObservation]) -> list[StepObservation]:
    """The step model's observations of measured rates."""
    return [
        StepObservation(
            concurrency=o.concurrency,
            num_speculative_tokens=o.num_speculative_tokens,
            drafter=o.drafter,
            step_time_s=o.step_time_s,
            start=o.start,
            relative_se=o.relative_se,
            drafted_share=o.drafted_share,
            context_tokens=o.context_tokens,
            tokens_per_step=o.tokens_per_step,
            start_prefill=o.start_prefill,
        )
        for o in observations
    ]


def study_start_sd(
    configs: Sequence[MeasuredConfig],
    workloads: Iterable[str],
    *,
    noise_prior: NoisePriors | None = None,
    captured_widths: CapturedWidths = CapturedWidths(),
) -> SharedStart | None:
    """sigma_start (and the degrees of freedom it is known on) and the prefill slope once for a study,
    over every workload its starts measured (analysis/step_fit.py ``shared_start_sd``): what each
    workload's step model then holds. None: one workload, or a fit that failed (each workload then
    estimates its own)."""
    bases = sorted({parse_context_variant(w)[0] for w in workloads})
    feasible = [c for c in configs if c.feasible]
    groups = tuple(tuple(step_observations(family_observations(feasible, base))) for base in bases)
    return _shared_start(groups, noise_prior, captured_widths)


@functools.lru_cache(maxsize=16)
def _shared_start(
    groups: tuple[tuple[StepObservation, ...], ...], noise_prior: NoisePriors | None, captured_widths: CapturedWidths
) -> SharedStart | None:
    """The study-wide start spread of these levels, fitted once: the search's decision, the live
    stopping rule's noise of each workload and the report read the same fit."""
    try:
        return shared_start_sd(groups, noise_prior=noise_prior, captured_widths=captured_widths)
    except (FitError, np.linalg.LinAlgError):
        return None


@functools.lru_cache(maxsize=16)
def _fitted(
    steps: tuple[StepObservation, ...],
    noise_prior: NoisePriors | None,
    captured_widths: CapturedWidths,
    shared_start: SharedStart | None = None,
) -> StepPosterior:
    """The step model of these levels, fitted once: every context level of a workload reads the
    same fit (the fit is deterministic and its posterior immutable)."""
    return fit_step_model(steps, noise_prior=noise_prior, captured_widths=captured_widths, shared_start=shared_start)


def part_names(posterior: StepPosterior) -> list[str]:
    """What each cost of the model is per (the order of ``StepPosterior.theta``)."""
    names = ["step", "sequence", "verified token"]
    if posterior.knee is not None:
        names.append(f"verified token past {posterior.knee:g}")
    for method in posterior.methods:
        names += [f"{method} draft position", f"{method} drafting step"]
    if posterior.reads_context:
        names.append("context token read")
        for method in posterior.methods:
            names += [f"{method} context scan", f"{method} context scan per position"]
    return names


def _widths_words(widths: CapturedWidths) -> str:
    if not widths.by_k:
        return str(list(widths.every_k))
    return "; ".join(f"at k={k} {list(w[:6])}{'...' if len(w) > 6 else ''}" for k, w in widths.by_k)


def describe(posterior: StepPosterior) -> str:
    """What the step model found, in one sentence."""
    parts = [f"{1000 * t:.3f} ms a {name}" for name, t in zip(part_names(posterior), posterior.theta, strict=True)]
    for method, gamma in zip(posterior.sampled_methods, posterior.sampling_factors, strict=True):
        parts.append(f"{method} probabilistic steps x{math.exp(gamma):.3f}")
    read = posterior.prefill_slope is not None
    if read:
        parts.append(f"a start's step slower by {posterior.prefill_slope:.2f}x its prefill lag (logs)")
    widths = (
        f"; padded to captured widths {_widths_words(posterior.captured_widths)}" if posterior.captured_widths else ""
    )
    return (
        f"one step model over {len(posterior.observations)} levels of {len({o.start for o in posterior.observations})} "
        f"starts: {', '.join(parts)}{widths}; starts vary by {100 * posterior.start_sd:.1f}%"
        f"{' beyond their prefill lag' if read else ''}, a configuration strays from the model by "
        f"{100 * posterior.cell_sd:.1f}%"
    )
