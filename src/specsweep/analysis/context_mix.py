"""A workload across its context levels: its paste over the user's context mix, and each level's
context in tokens.

A study with context levels (``measure.context``) measures each workload W again as ``W@16k``,
``W@64k`` (workload.context_variant_name), and recommends for each (context, concurrency) cell
as for any workload. No released engine takes a k per context (docs/engines.md), so W's paste is
one per-batch-size choice for every context: at each concurrency, the one rule's pick over the
contexts' rate draws mixed draw by draw, weighed as the objective weighs them
(tuning/workloads.py; evenly where the levels weigh 0, and the paste says so). Each context
says what it gives up against its own pick (docs/workloads.md has the rules). The draws are
those the contexts' recommendations read, so the mix adds no fit of its own.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specsweep.analysis.drafters import Candidate, Drafter, drafter_of
from specsweep.analysis.rates import RateSample
from specsweep.analysis.recommendation import Recommendation, recommend_from_sample
from specsweep.analysis.snippet_plan import SnippetPlan, own_pick, plan_snippet
from specsweep.types import MeasuredConfig, SpeculativeConfig
from specsweep.workload import parse_context_variant


def context_members(workloads: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each plain workload measured at a context level -> itself, then its levels, shortest first."""
    names = list(dict.fromkeys(workloads))
    out: dict[str, tuple[str, ...]] = {}
    for name in names:
        if parse_context_variant(name)[1] is not None:
            continue
        levels = sorted(
            (level, other)
            for other in names
            if (parsed := parse_context_variant(other))[0] == name and (level := parsed[1]) is not None
        )
        if levels:
            out[name] = (name, *(other for _, other in levels))
    return out


def mix_weights(members: Sequence[str], workload_weights: Mapping[str, float]) -> tuple[dict[str, float], bool]:
    """Each context's share of the mix (summing to 1), and whether it is the even one: the
    study's weights normalised, or every context alike where the levels weigh nothing."""
    weights = {m: max(0.0, float(workload_weights.get(m, 0.0))) for m in members}
    levels = [m for m in members if parse_context_variant(m)[1] is not None]
    if sum(weights.values()) <= 0.0 or all(weights[m] == 0.0 for m in levels):
        return {m: 1.0 / len(members) for m in members}, True
    total = sum(weights.values())
    return {m: w / total for m, w in weights.items()}, False


def context_tokens(configs: Sequence[MeasuredConfig], workload: str) -> float | None:
    """A workload's context in tokens: a level's own (``W@16k``: 16,384), a plain workload's mean
    prompt tokens as the server counted them over its measured levels (None: not kept)."""
    level = parse_context_variant(workload)[1]
    if level is not None:
        return float(level)
    means = [
        figures.prompt_tokens_mean
        for c in configs
        if c.feasible
        for figures in c.results.get(workload, {}).values()
        if figures.prompt_tokens_mean is not None
    ]
    return sum(means) / len(means) if means else None


def context_label(workload: str, tokens: float | None) -> str:
    """``technical@16k`` for a level; ``technical (402 tokens)`` for the plain workload."""
    if parse_context_variant(workload)[1] is not None or tokens is None:
        return workload
    return f"{workload} ({tokens:,.0f} tokens)"


def drafter_templates(configs: Sequence[MeasuredConfig]) -> dict[Drafter, SpeculativeConfig]:
    """A measured spec config of each drafter: what a paste running that drafter starts from."""
    return {d: c.spec for c in configs if c.feasible and (d := drafter_of(c.spec)) is not None and c.spec is not None}


def mix_recommendation(
    workload: str,
    recommendations: Mapping[str, Recommendation],
    samples: Mapping[str, RateSample],
    weights: Mapping[str, float],
    idle: Collection[Candidate] = (),
    *,
    tolerance: float = 0.01,
    cells: int = 1,
) -> Recommendation:
    """At one concurrency, the pick over the context mix by the one rule: each draw's rate of a
    candidate every context predicts is the weighted mean of the contexts' draws (its measured
    rate likewise, where every context measured it), and the pick is the measured one with the
    least expected loss (recommendation.recommend_from_sample). ``idle``: configurations the
    engine runs as speculation off, no candidates of their own."""
    members = [m for m in recommendations if m in samples]
    if not members:  # no context's draws kept: the first context's pick
        return replace(next(iter(recommendations.values())), workload=workload)
    share = {m: weights.get(m, 0.0) for m in members}
    total = sum(share.values())
    share = {m: (w / total if total > 0 else 1.0 / len(members)) for m, w in share.items()}
    column = {m: {c: j for j, c in enumerate(samples[m].candidates)} for m in members}
    common = [c for c in samples[members[0]].candidates if c not in idle and all(c in column[m] for m in members)]
    if not common:  # no candidate every context predicts (each fitted other drafters): the first context's pick
        return replace(recommendations[members[0]], workload=workload)

    def mixed(values: Callable[[RateSample], np.ndarray]) -> np.ndarray:
        out: np.ndarray = np.sum(
            [share[m] * values(samples[m])[..., [column[m][c] for c in common]] for m in members], axis=0
        )
        return out

    sample = RateSample(
        concurrency=samples[members[0]].concurrency, candidates=tuple(common),
        tokens_per_step=mixed(lambda s: s.tokens_per_step), step_time_s=mixed(lambda s: s.step_time_s),
        step_time_source=("model",) * len(common), tokens_per_s=mixed(lambda s: s.tokens_per_s),
        draws=mixed(lambda s: s.draws),
    )  # fmt: skip
    seen = {m: {row.candidate: row.measured_tokens_per_s for row in recommendations[m].candidates} for m in members}

    def measured(candidate: Candidate) -> float | None:
        values = [seen[m].get(candidate) for m in members]
        return (
            None
            if any(v is None for v in values)
            else sum(share[m] * (v or 0.0) for m, v in zip(members, values, strict=True))
        )

    first = recommendations[members[0]]
    rec = recommend_from_sample(
        sample, measured, workload=workload, confidence=first.confidence, tolerance=tolerance, idle=idle,
        cells=cells, seed=first.seed,
    )  # fmt: skip
    said = ", ".join(f"{m} {100 * share[m]:.0f}%" for m in members)
    return replace(rec, reason=f"over the context mix ({said}): {rec.reason}")


def given_up_line(label: str, runs: Mapping[int, Candidate], recs: Mapping[int, Recommendation]) -> str:
    """What one context gives up under the mix's paste, per concurrency (predicted)."""
    parts = []
    for level, run in sorted(runs.items()):
        rec = recs.get(level)
        if rec is None:
            continue
        own = own_pick(rec)
        got = next((row for row in rec.candidates if row.candidate == run), None)
        if got is None or own.candidate == run:
            parts.append(f"0% at {level}")
            continue
        cost = max(0.0, 1.0 - got.tokens_per_s / own.tokens_per_s) if own.tokens_per_s > 0 else 0.0
        parts.append(f"{100 * cost:.1f}% at {level} ({run.short_label}, its own {own.candidate.short_label})")
    if all(p.startswith("0% ") for p in parts):
        return f"{label} gives up nothing: its own pick at every concurrency"
    return f"{label} gives up, predicted: " + "; ".join(parts)


def mix_snippets(
    recommendations: Sequence[Recommendation],
    samples: Mapping[tuple[str, int], RateSample],
    snippets: Sequence[SnippetPlan],
    configs: Sequence[MeasuredConfig],
    workload_weights: Mapping[str, float],
    *,
    max_num_seqs: int | None,
    table_refusal: Callable[[SpeculativeConfig], str | None] | None = None,
    idle: Collection[Candidate] = (),
    tolerance: float = 0.01,
) -> tuple[SnippetPlan, ...]:
    """Every workload's paste, each plain workload with context levels planned over its context
    mix (see the module doc); the levels' own plans are kept as they are."""
    by_cell = {(r.workload, r.concurrency): r for r in recommendations}
    templates = drafter_templates(configs)
    out = []
    for plan in snippets:
        members = context_members(w for w, _ in by_cell).get(plan.workload)
        if members is None:
            out.append(plan)
            continue
        weights, even = mix_weights(members, workload_weights)
        mixed = []
        for level in sorted({b for w, b in by_cell if w == plan.workload}):
            cells = {m: by_cell[m, level] for m in members if (m, level) in by_cell}
            drawn = {m: samples[m, level] for m in cells if (m, level) in samples}
            mixed.append(
                mix_recommendation(plan.workload, cells, drawn, weights, idle, tolerance=tolerance, cells=len(by_cell))
            )
        mix = plan_snippet(plan.workload, mixed, templates, max_num_seqs=max_num_seqs, table_refusal=table_refusal)
        labels = {m: context_label(m, context_tokens(configs, m)) for m in members}
        said = ", ".join(f"{labels[m]} {100 * weights[m]:.0f}%" for m in members)
        how = "measure.context_weight is 0: weighed evenly" if even else "the study's context_weight or context_shares"
        lines = [
            f"one paste for every context (no engine takes a k per context): per batch size, the k with the "
            f"least expected loss over the context mix of {said} ({how})"
        ]
        for member in members:
            recs = {b: r for (w, b), r in by_cell.items() if w == member}
            lines.append(given_up_line(labels[member], mix.choice_by_concurrency, recs))
        out.append(replace(mix, given_up=tuple(lines) + mix.given_up))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextRow:
    """One context of a workload: its name, its context in tokens and its pick at each concurrency."""

    workload: str  # ``W`` or ``W@16k``
    context_tokens: float | None  # a level's, or the plain workload's mean prompt tokens (None: not kept)
    label: str  # context_label
    picks: dict[int, Recommendation]  # concurrency -> the cell's recommendation


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextGrid:
    """The best k of one workload by context (rows, shortest first) and concurrency (columns)."""

    workload: str
    concurrency_levels: tuple[int, ...]
    rows: tuple[ContextRow, ...]


def context_grids(
    recommendations: Sequence[Recommendation], configs: Sequence[MeasuredConfig]
) -> tuple[ContextGrid, ...]:
    """Each plain workload measured at a context level, as a grid of its cells' recommendations."""
    grids = []
    for workload, members in context_members(dict.fromkeys(r.workload for r in recommendations)).items():
        rows = []
        for member in members:
            tokens = context_tokens(configs, member)
            picks = {r.concurrency: r for r in recommendations if r.workload == member}
            rows.append(
                ContextRow(workload=member, context_tokens=tokens, label=context_label(member, tokens), picks=picks)
            )
        levels = tuple(sorted({b for row in rows for b in row.picks}))
        grids.append(ContextGrid(workload=workload, concurrency_levels=levels, rows=tuple(rows)))
    return tuple(grids)
