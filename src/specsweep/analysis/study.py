"""A whole study's measurements turned into a decision: fits, throughput models, recommendations.

Input: the configurations a study measured (MeasuredConfig, read from its storage by the
tuning layer). Per workload:
- one acceptance fit per drafter (method + draft sampling + any other opened field), from the
  trial that drafted the most positions with it, its levels' counts summed (acceptance at
  position i does not depend on how many positions follow it, nor on the batch); a drafter
  with no per-position counters but a mean acceptance length over a known number of drafts
  gets the geometric fit of analysis/aggregate.py from its longest draft length;
- one throughput model from every trial's levels (step time against k per concurrency and
  drafter, docs/analysis.md);
- per concurrency level, the recommended k and drafter with its interval and gains;
- when the best k of the objective's drafter differs across levels, a vLLM
  ``num_speculative_tokens_per_batch_size`` table.
Pure: no storage, no I/O. The report and the CLI render what this returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from specsweep.analysis.aggregate import fit_aggregate_acceptance
from specsweep.analysis.context_mix import drafter_templates, mix_snippets
from specsweep.analysis.drafters import Candidate, Drafter, candidate_of, drafter_of
from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.analysis.latency import itl_limit
from specsweep.analysis.noise import RunNoise, noise_of
from specsweep.analysis.positions import lend_positions
from specsweep.analysis.rates import RatePrediction, RateSample, predict_throughput, sample_rates
from specsweep.analysis.recommendation import Recommendation, recommend_from_sample
from specsweep.analysis.snippet_plan import SnippetPlan, plan_snippet
from specsweep.analysis.start_effect import SharedStart
from specsweep.analysis.throughput import ThroughputModel, family_observations, fit_throughput_model, study_start_sd
from specsweep.config import DRAFT_SAMPLE_METHODS
from specsweep.errors import FitError
from specsweep.types import (
    CapturedWidths,
    LevelFigures,
    MeasuredConfig,
    NoisePriors,
    SpeculativeConfig,
    StudySettings,
)
from specsweep.workload import parse_context_variant


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterAcceptance:
    """The acceptance fit of one drafter on one workload, and the trial it came from."""

    workload: str
    drafter: Drafter
    trial: int
    fit: AcceptanceFit


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadModel:
    """What a study's measurements say about one workload: acceptance per drafter, step time per
    (concurrency, drafter). The search decides on it and the report draws it: one model for both."""

    workload: str
    acceptance: tuple[DrafterAcceptance, ...]
    throughput: ThroughputModel | None  # None: no level of this workload was measured
    noise: RunNoise | None = None  # the run-to-run noise the throughput model was fitted with (None: unknown)

    @property
    def fits(self) -> dict[Drafter, AcceptanceFit]:
        return {a.drafter: a.fit for a in self.acceptance}


def model_workload(
    configs: Sequence[MeasuredConfig],
    workload: str,
    *,
    k_max: int,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
    noise_prior: NoisePriors | None = None,
    captured_widths: CapturedWidths = CapturedWidths(),
    shared_start: SharedStart | None = None,
) -> WorkloadModel:
    """The acceptance fits and the step model of one workload, from the feasible configurations;
    the start effect is drawn toward the engine's ``noise_prior`` (analysis/noise.py), and steps
    are padded to the ``captured_widths`` the server said it captured graphs for."""
    feasible = [c for c in configs if c.feasible]
    acceptance = drafter_acceptance(feasible, workload, k_max=k_max, confidence=confidence, draws=draws, seed=seed)
    # one fit over the workload at every context level it was measured at, read at its own
    observations = family_observations(feasible, workload)
    context = parse_context_variant(workload)[1] or 0
    if not any(o.context_tokens == context for o in observations):
        return WorkloadModel(workload=workload, acceptance=tuple(acceptance), throughput=None)
    throughput = fit_throughput_model(
        observations,
        noise_prior=noise_prior,
        captured_widths=captured_widths,
        context_tokens=context,
        shared_start=shared_start,
    )
    noise = noise_of(throughput, workload, noise_prior)
    return WorkloadModel(workload=workload, acceptance=tuple(acceptance), throughput=throughput, noise=noise)


def study_k_max(configs: Sequence[MeasuredConfig], k_max: int | None) -> int:
    """The longest draft the analysis considers: the searched range's, or the longest measured."""
    largest = max((c.spec.num_speculative_tokens or 0 for c in configs if c.spec is not None), default=0)
    return max(k_max or 0, largest, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadPredictions:
    """Predicted rate against k for every drafter at one concurrency (the throughput figure)."""

    workload: str
    concurrency: int
    rows: tuple[RatePrediction, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyAnalysis:
    """Everything the report shows, from stored measurements only."""

    workloads: tuple[str, ...]
    concurrency_levels: tuple[int, ...]
    objective_concurrency: int
    k_max: int
    acceptance: tuple[DrafterAcceptance, ...]
    models: dict[str, ThroughputModel]
    predictions: tuple[WorkloadPredictions, ...]
    recommendations: tuple[Recommendation, ...]
    snippets: tuple[SnippetPlan, ...]
    notes: tuple[str, ...]
    # each cell's joint rate draws, which its recommendation read (the context mix reads them too)
    samples: dict[tuple[str, int], RateSample] = field(default_factory=dict, repr=False)

    def recommendation(self, workload: str, concurrency: int) -> Recommendation | None:
        return next((r for r in self.recommendations if r.workload == workload and r.concurrency == concurrency), None)

    def snippet(self, workload: str) -> SnippetPlan | None:
        return next((s for s in self.snippets if s.workload == workload), None)


def analyze_study(
    configs: Sequence[MeasuredConfig],
    *,
    workloads: Sequence[str],
    concurrency_levels: Sequence[int],
    objective_concurrency: int,
    k_min: int = 1,
    k_max: int | None = None,
    baseline: SpeculativeConfig | None = None,
    max_num_seqs: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
    noise_prior: NoisePriors | None = None,
    tolerance: float = 0.01,
    table_refusal: Callable[[SpeculativeConfig], str | None] | None = None,
    max_itl_p99_s: float | None = None,
    idle: Collection[Candidate] = (),
    captured_widths: CapturedWidths = CapturedWidths(),
) -> StudyAnalysis:
    """Fit, model and recommend for every workload and concurrency level a study measured.

    Recommendations stay inside the searched space: draft lengths ``k_min``..``k_max`` of the
    measured drafters, or speculation off where it was measured. ``max_num_seqs`` bounds the
    per-batch-size table (None: unknown, see analysis/snippet_plan.py); ``table_refusal`` says why
    the engine cannot take one with a spec config (None: it can)."""
    measured = [c for c in configs if c.feasible]
    if not measured:
        raise FitError("the study has no successfully measured configuration to analyse; run more trials.")
    k_max = study_k_max(measured, k_max)
    notes: list[str] = []
    acceptance: list[DrafterAcceptance] = []
    models: dict[str, ThroughputModel] = {}
    predictions: list[WorkloadPredictions] = []
    recommendations: list[Recommendation] = []
    samples: dict[tuple[str, int], RateSample] = {}
    snippets: list[SnippetPlan] = []
    shared = study_start_sd(measured, workloads, noise_prior=noise_prior, captured_widths=captured_widths)
    for workload in workloads:
        fitted = model_workload(
            measured, workload, k_max=k_max, confidence=confidence, draws=draws, seed=seed, noise_prior=noise_prior,
            captured_widths=captured_widths, shared_start=shared,
        )  # fmt: skip
        acceptance.extend(fitted.acceptance)
        model = fitted.throughput
        levels = [b for b in concurrency_levels if model is not None and b in model.concurrency_levels]
        if model is None or not levels:
            notes.append(f"{workload}: no level was measured successfully; nothing to recommend.")
            continue
        models[workload] = model
        by_drafter = fitted.fits
        unfitted = {o.drafter for o in model.observations if o.drafter is not None} - set(by_drafter)
        for drafter in sorted(unfitted):
            notes.append(
                f"{workload}: {drafter.label} has no per-position acceptance counts, so only its measured "
                "points are shown; it is not a candidate of the model."
            )
        base = candidate_of(baseline, objective_concurrency) if baseline is not None else None
        mine: list[Recommendation] = []
        for level in levels:
            rows = predict_throughput(
                model, by_drafter, concurrency=level, k_max=k_max, confidence=confidence, draws=draws, seed=seed
            )
            # an idle candidate the engine runs as speculation off: no point of its own
            rows = tuple(row for row in rows if row.candidate not in idle)
            predictions.append(WorkloadPredictions(workload=workload, concurrency=level, rows=rows))
            limit = itl_limit(measured, workload, level, max_itl_p99_s) if max_itl_p99_s is not None else None
            sample = sample_rates(
                model, by_drafter, concurrency=level, k_min=k_min, k_max=k_max, draws=draws, seed=seed
            )
            samples[workload, level] = sample
            rec = recommend_from_sample(
                sample, partial(model.measured_tokens_per_s, concurrency=level, workload=workload),
                workload=workload, baseline=base, confidence=confidence, tolerance=tolerance, limit=limit,
                idle=idle, cells=len(workloads) * len(concurrency_levels), seed=seed,
            )  # fmt: skip
            mine.append(rec)
        recommendations.extend(mine)
        templates = drafter_templates(measured)
        snippets.append(plan_snippet(workload, mine, templates, max_num_seqs=max_num_seqs, table_refusal=table_refusal))
        target = objective_concurrency if objective_concurrency in levels else levels[0]
        top = next(r for r in mine if r.concurrency == target)
        if not top.speculation_off and top.choice.num_speculative_tokens >= k_max:
            notes.append(
                f"{workload}: the best k is the largest one considered ({k_max}); widen "
                "search.num_speculative_tokens to see whether a longer draft pays."
            )
    return StudyAnalysis(
        workloads=tuple(workloads),
        concurrency_levels=tuple(concurrency_levels),
        objective_concurrency=objective_concurrency,
        k_max=k_max,
        acceptance=tuple(acceptance),
        models=models,
        predictions=tuple(predictions),
        recommendations=tuple(recommendations),
        snippets=tuple(snippets),
        notes=tuple(notes),
        samples=samples,
    )


def analyze_with_settings(
    configs: Sequence[MeasuredConfig],
    settings: StudySettings,
    *,
    seed: int = 0,
    table_refusal: Callable[[SpeculativeConfig], str | None] | None = None,
    idle: Collection[Candidate] = (),
) -> StudyAnalysis:
    """:func:`analyze_study` of a study's measured configurations as its settings ask: the search
    decides on, and the report draws, this one analysis (``table_refusal``: the engine's, for
    the paste); a workload with context levels pastes over its context mix (analysis/context_mix.py)."""
    analysis = analyze_study(
        configs,
        workloads=settings.workloads,
        concurrency_levels=settings.concurrency_levels,
        objective_concurrency=settings.objective_concurrency,
        k_min=settings.k_range[0] if settings.k_range else 1,
        k_max=settings.k_max,
        baseline=None if settings.baseline is None else settings.baseline.spec,
        max_num_seqs=settings.max_num_seqs,
        seed=seed,
        noise_prior=settings.noise_prior,
        tolerance=settings.tolerance,
        table_refusal=table_refusal,
        max_itl_p99_s=settings.max_itl_p99_s,
        idle=idle,
        captured_widths=settings.captured_widths,
    )
    mixed = mix_snippets(
        analysis.recommendations, analysis.samples, analysis.snippets, configs, settings.workload_weights,
        tolerance=settings.tolerance, max_num_seqs=settings.max_num_seqs, table_refusal=table_refusal, idle=idle,
    )  # fmt: skip
    return replace(analysis, snippets=mixed)


def drafter_acceptance(
    configs: Sequence[MeasuredConfig], workload: str, *, k_max: int, confidence: float, draws: int, seed: int
) -> list[DrafterAcceptance]:
    """Per drafter, the acceptance fit of one workload: from the trial that drafted the most
    positions, its levels' counts summed; drafters without per-position counters get the
    aggregate geometric fit. The search and the report both fit acceptance here."""
    best: dict[Drafter, tuple[int, MeasuredConfig]] = {}
    for config in configs:
        drafter = drafter_of(config.spec)
        if drafter is None or config.spec is None or config.spec.num_speculative_tokens_per_batch_size:
            continue
        rows = [r for r in config.results.get(workload, {}).values() if r.accepted_per_position]
        if not rows:
            continue
        depth = len(rows[0].accepted_per_position or ())
        if drafter not in best or depth > best[drafter][0]:
            best[drafter] = (depth, config)
    out = _aggregate_fits(configs, workload, set(best), k_max=k_max, confidence=confidence, draws=draws, seed=seed)
    for drafter, (depth, config) in sorted(best.items()):  # Drafters sort by method, then draft sampling
        rows = [r for r in config.results[workload].values() if len(r.accepted_per_position or ()) == depth]
        drafts = sum(float(r.num_drafts or 0.0) for r in rows)
        counts = [sum(float((r.accepted_per_position or ())[i]) for r in rows) for i in range(depth)]
        try:
            fit = fit_acceptance(
                num_drafts=drafts, accepted_per_position=counts, k_max=k_max, confidence=confidence, draws=draws,
                seed=seed,
            )  # fmt: skip
        except FitError:
            continue
        out.append(DrafterAcceptance(workload=workload, drafter=drafter, trial=config.trial, fit=fit))
    return lend_between_samplings(out)


def lend_between_samplings(fits: list[DrafterAcceptance]) -> list[DrafterAcceptance]:
    """Each drafter's positions past its own K from its other draft sampling where that one was
    measured further (analysis/positions.py: one shape, a shift per draft sampling)."""
    by_drafter = {a.drafter: a.fit for a in fits if a.fit.measured_positions}
    out = []
    for a in fits:
        sampling = next(m for m in DRAFT_SAMPLE_METHODS if m != a.drafter.draft_sample_method)
        lender = by_drafter.get(Drafter(method=a.drafter.method, draft_sample_method=sampling))
        lent = a.fit if lender is None or not a.fit.measured_positions else lend_positions(a.fit, lender)
        out.append(replace(a, fit=lent))
    return out


def _aggregate_fits(
    configs: Sequence[MeasuredConfig], workload: str, covered: set[Drafter], **args: Any
) -> list[DrafterAcceptance]:
    """Geometric fits for drafters measured without per-position counters (only a mean
    acceptance length over a known number of drafts), from their longest draft length."""

    def rows_of(config: MeasuredConfig) -> list[LevelFigures]:
        rows = config.results.get(workload, {}).values()
        return [r for r in rows if r.num_drafts and r.mean_acceptance_length]

    best: dict[Drafter, tuple[int, MeasuredConfig]] = {}
    for config in configs:
        drafter, spec = drafter_of(config.spec), config.spec
        if drafter is None or spec is None or drafter in covered or spec.num_speculative_tokens_per_batch_size:
            continue
        k = spec.num_speculative_tokens or 0
        if rows_of(config) and (drafter not in best or k > best[drafter][0]):
            best[drafter] = (k, config)
    out = []
    for drafter, (k, config) in best.items():
        rows = rows_of(config)
        drafts = sum(float(r.num_drafts or 0.0) for r in rows)
        accepted = sum(float(r.num_drafts or 0.0) * (float(r.mean_acceptance_length or 1.0) - 1.0) for r in rows)
        try:
            fit = fit_aggregate_acceptance(num_speculative_tokens=k, requests=[(drafts * k, accepted)], **args)
        except FitError:
            continue
        out.append(DrafterAcceptance(workload=workload, drafter=drafter, trial=config.trial, fit=fit))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRate:
    """One configuration's measured rate in one cell: the mean over its server starts."""

    key: str
    config: MeasuredConfig  # its first measurement (spec, boot facts)
    tokens_per_s: float


def measured_rates(configs: Sequence[MeasuredConfig], workload: str, concurrency: int) -> list[MeasuredRate]:
    """Every feasible configuration measured at ``concurrency`` for ``workload``, repeats averaged,
    fastest first."""
    groups: dict[str, list[MeasuredConfig]] = {}
    for config in configs:
        if config.feasible and config.rate(workload, concurrency):
            groups.setdefault(config.key, []).append(config)
    out = [
        MeasuredRate(
            key=key,
            config=group[0],
            tokens_per_s=sum(c.rate(workload, concurrency) or 0.0 for c in group) / len(group),
        )
        for key, group in groups.items()
    ]
    return sorted(out, key=lambda r: -r.tokens_per_s)
