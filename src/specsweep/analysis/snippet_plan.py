"""The configuration to paste for one workload: the recommendation of every concurrency level.

Per level the recommended candidate where it was measured there, else (an untested
extrapolation, named beside it) the level's best measured one. One spec config runs one drafter:
where levels want different ones, the one whose per-level best costs least over all levels, each
level's cost named (docs/analysis.md). vLLM's ``num_speculative_tokens_per_batch_size`` (or
SGLang's adaptive config) then carries each level's k (0: off) up to the server's ``max_num_seqs``.

A paste for another engine than the one measured (``recommend --format sglang`` of a vLLM study)
is chosen from what that engine runs: SGLang drafts with the draft's top token, as llama.cpp's
eagle3, dflash and dspark do, so where the study measured a drafter both ways, its probabilistic
drafting is no candidate of the paste (tuning/stored.py); where it measured only probabilistic
drafting, the paste keeps that k and says in a note (:func:`unmeasured_lines`) that what the
engine runs was never measured.

Where the engine cannot take a per-batch-size choice for the drafter (llama.cpp always; SGLang
but for EAGLE and EAGLE3), the paste runs one k at every level: the one whose predicted shortfall,
summed over the levels, is least among the draft lengths the study measured; each level that
gives way is named with its cost. Nothing is dropped silently.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.recommendation import CandidateRate, Recommendation, batch_size_table
from specsweep.types import BatchSizeRange, SpeculativeConfig

# Batch sizes a table covers when the server's max_num_seqs is not known: the largest of vLLM's
# defaults, so no batch size the server may run falls back to the table's base k.
UNKNOWN_MAX_NUM_SEQS = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class SnippetPlan:
    """The spec config to paste for one workload and what it runs at each measured level."""

    workload: str
    spec: SpeculativeConfig | None  # None: speculation off at every level
    choice_by_concurrency: dict[int, Candidate]  # what the paste runs at each measured level
    table: tuple[BatchSizeRange, ...]
    max_batch: int  # the table's last batch size
    max_batch_known: bool  # False: the server's max_num_seqs was not known
    given_up: tuple[str, ...]  # levels where the paste cannot run the recommendation, and what it costs
    untested: tuple[str, ...]  # recommendations never measured: shown, not pasted
    unmeasured: tuple[str, ...] = ()  # for another engine: drafting it runs that the study never measured

    @property
    def notes(self) -> tuple[str, ...]:
        """What the paste departs from, and why: one line each."""
        return self.unmeasured + self.given_up + self.untested

    @property
    def k_by_concurrency(self) -> dict[int, int]:
        return {b: c.num_speculative_tokens for b, c in self.choice_by_concurrency.items()}


def plan_snippet(
    workload: str,
    recommendations: Sequence[Recommendation],
    templates: Mapping[Drafter, SpeculativeConfig],
    *,
    max_num_seqs: int | None,
    table_refusal: Callable[[SpeculativeConfig], str | None] | None = None,
) -> SnippetPlan:
    """The paste for one workload from its per-level recommendations (see the module doc).

    ``table_refusal``: why the engine cannot run a per-batch-size choice with a spec config
    (None: it can; a None callable: every config can, as on vLLM)."""
    picks: dict[int, CandidateRate] = {}
    untested: list[str] = []
    for rec in recommendations:
        best = own_pick(rec)
        picks[rec.concurrency] = best
        if rec.measured or best.measured_tokens_per_s is None:
            continue
        untested.append(
            f"at concurrency {rec.concurrency} the model predicts {rec.choice.label} at {rec.tokens_per_s:.1f} tok/s, "
            f"{100 * (rec.tokens_per_s / best.tokens_per_s - 1):+.1f}% over {best.candidate.label}, but it was "
            "never measured: an untested extrapolation, not pasted (measure it to confirm)"
        )
    drafters = {
        row.candidate.drafter for row in picks.values() if not row.candidate.off and row.candidate.drafter is not None
    }
    choice = {b: row.candidate for b, row in picks.items()}
    max_batch = max_num_seqs or UNKNOWN_MAX_NUM_SEQS
    plan = SnippetPlan(
        workload=workload, spec=None, choice_by_concurrency=choice, table=(), max_batch=max_batch,
        max_batch_known=max_num_seqs is not None, given_up=(), untested=tuple(untested),
    )  # fmt: skip
    if not drafters:
        return plan
    by_rec = {rec.concurrency: rec for rec in recommendations}
    options = {
        d: _runs_with(d, picks, by_rec) for d in sorted(drafters, key=lambda d: (d not in templates, d.method, d))
    }
    drafter = min(options, key=lambda d: (d not in templates, sum(cost for _, cost in options[d].values())))
    runs = options[drafter]
    given_up = [
        f"at concurrency {b} the recommendation is {picks[b].candidate.label}; the paste runs {row.candidate.label} "
        f"there, predicted {100 * cost:.1f}% slower (one spec config runs one drafter)"
        + ("; the study cannot tell the two apart (tied)" if row.candidate in by_rec[b].tied else "")
        for b, (row, cost) in sorted(runs.items())
        if row.candidate != picks[b].candidate
    ]
    k_by_level = {b: row.candidate.num_speculative_tokens for b, (row, _) in runs.items()}
    refusal = table_refusal(templates[drafter]) if table_refusal is not None and drafter in templates else None
    if refusal is not None and len(set(k_by_level.values())) > 1:
        single, lines = _one_k(drafter, runs, by_rec, refusal)
        choice = {b: row.candidate for b, row in single.items()}
        k = max(c.num_speculative_tokens for c in choice.values())
        spec = (
            None
            if k == 0
            else replace(templates[drafter], num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None)
        )
        return replace(plan, spec=spec, choice_by_concurrency=choice, given_up=tuple(given_up + lines))
    k = max(k_by_level.values())
    table = batch_size_table(k_by_level, max_batch=max_batch) if len(set(k_by_level.values())) > 1 else ()
    spec = replace(templates[drafter], num_speculative_tokens=k, num_speculative_tokens_per_batch_size=table or None)
    choice = {b: row.candidate for b, (row, _) in runs.items()}
    return replace(plan, spec=spec, choice_by_concurrency=choice, table=table, given_up=tuple(given_up))


def unmeasured_lines(
    plan: SnippetPlan, engine: str, unrun: Collection[Drafter], greedy_ks: Mapping[Drafter, Collection[int]]
) -> tuple[str, ...]:
    """What a paste for ``engine`` rests on, per drafter the study measured with sampled drafting
    that ``engine`` runs with the draft's top token (``unrun``): where its greedy drafting (the top
    token) was measured too (``greedy_ks``: at which k), the paste was chosen from that; where not
    and the paste runs it, its k comes from drafting ``engine`` does not run."""
    pasted = {c.drafter for c in plan.choice_by_concurrency.values() if not c.off}
    lines = []
    for d in sorted(unrun):
        head = f"{engine} drafts {d.method} with the draft's top token"
        if d in greedy_ks:
            ks = ", ".join(str(k) for k in sorted(greedy_ks[d]))
            lines.append(
                f"{head}: this paste is chosen from the study's greedy drafting of it (measured at k = {ks}), not "
                f"its {d.draft_sample_method} drafting"
            )
        elif d in pasted:
            lines.append(
                f"{head}, which this study never measured: this k comes from {d.draft_sample_method} drafting; "
                f'measure {d.method} with draft_sample_method "greedy" to choose its k for {engine}'
            )
    return tuple(lines)


def own_pick(rec: Recommendation) -> CandidateRate:
    """What one cell's own paste would run: its pick where measured, else its best measured candidate."""
    rows = {row.candidate: row for row in rec.candidates}
    measured = [row for row in rec.candidates if row.measured_tokens_per_s is not None]
    if rec.measured or not measured:
        return rows[rec.choice]
    return max(measured, key=lambda row: row.tokens_per_s)


def _runs_with(
    drafter: Drafter, picks: Mapping[int, CandidateRate], recs: Mapping[int, Recommendation]
) -> dict[int, tuple[CandidateRate, float]]:
    """Per level, what a paste running ``drafter`` runs there (its best measured k, or off), and its
    predicted shortfall against the level's pick, as a fraction."""
    out = {}
    for level, pick in picks.items():
        if pick.candidate.drafter == drafter or pick.candidate.off:
            out[level] = (pick, 0.0)
            continue
        runnable = [row for row in recs[level].candidates if row.candidate.off or row.candidate.drafter == drafter]
        mine = [row for row in runnable if row.measured_tokens_per_s is not None] or runnable
        best = max(mine, key=lambda row: row.tokens_per_s)
        out[level] = (best, max(0.0, 1.0 - best.tokens_per_s / pick.tokens_per_s))
    return out


def _one_k(
    drafter: Drafter,
    runs: Mapping[int, tuple[CandidateRate, float]],
    recs: Mapping[int, Recommendation],
    refusal: str,
) -> tuple[dict[int, CandidateRate], list[str]]:
    """One draft length (or speculation off) for every level: of the lengths measured at some
    level, the one whose predicted shortfall against each level's own run, summed, is least; and
    a line per level that gives way, with what it costs."""
    wanted = {level: row for level, (row, _) in runs.items()}
    options: dict[int, dict[int, CandidateRate]] = {}
    for level in wanted:
        for row in recs[level].candidates:
            if row.candidate.off or row.candidate.drafter == drafter:
                options.setdefault(row.candidate.num_speculative_tokens, {})[level] = row
    measured = {k for k, rows in options.items() if any(r.measured_tokens_per_s is not None for r in rows.values())}
    usable = [k for k in sorted(options) if k in measured and set(options[k]) == set(wanted)]
    usable = usable or [k for k in sorted(options) if set(options[k]) == set(wanted)]

    def cost(k: int) -> float:
        return sum(max(0.0, 1.0 - options[k][b].tokens_per_s / wanted[b].tokens_per_s) for b in wanted)

    k = min(usable, key=lambda k: (round(cost(k), 9), k))
    chosen = options[k]
    lines = []
    for level in sorted(wanted):
        want, got = wanted[level], chosen[level]
        if got.candidate == want.candidate:
            continue
        shortfall = max(0.0, 1.0 - got.tokens_per_s / want.tokens_per_s)
        figures = f"{got.tokens_per_s:.1f} against {want.tokens_per_s:.1f} tok/s predicted"
        if want.measured_tokens_per_s is not None and got.measured_tokens_per_s is not None:
            figures += f"; measured {got.measured_tokens_per_s:.1f} against {want.measured_tokens_per_s:.1f}"
        lines.append(
            f"at concurrency {level} the recommendation is {want.candidate.label}; {refusal}, so the paste runs "
            f"{got.candidate.label} there, predicted {100 * shortfall:.1f}% slower ({figures})"
        )
    return chosen, lines
