"""Model-guided search: which configuration to restart the server with next, or that no start is worth it.

Every decision is derived from the study's trials alone (their typed records), so ``--resume``
and several workers sharing one storage continue where the stored trials leave off. The study
loop enqueues the decision as an optuna trial. Every cell the study reports, each (workload,
concurrency level), counts.

Order of decisions (docs/search.md), one small function each:

1. speculation off, when the space has it (the floor every drafter's step time is above);
2. the first drafter of each draft method (draft sampling and opened fields set drafters of one
   method apart) at its largest draft length that has not failed: for chain drafters one run at
   the largest k measures the acceptance of every smaller k;
3. each other drafter of a measured method at the longest k any cell is predicted best at, with
   its measured sibling's acceptance standing in for its own: its counters then measure every
   position a pick is expected to need, and the start is likely one of the picks (a start at its
   largest k would measure positions the picks do not run); the positions past it are the decay
   fit's extrapolation, which the values below weigh;
4. the start worth most: every untried configuration and every measured one (a repeat) is
   valued by the user's loss it is expected to remove, summed over the cells
   (analysis/value.py), against its cost: this study's mean boot plus its measuring time (the
   study's mean measuring time, scaled by how much slower or faster it is predicted to stream).
   A start is worth it when it is expected to buy ``START_PRICE`` of the tolerance of the cells'
   summed rate for a start of the study's mean cost, in proportion to its own cost; the start
   that buys most per minute goes next;
5. stop when none is worth it, and never after as many starts as there are configurations to
   measure (the grid's, less any the engine says can never draft).

Before each start the study says which start it is, the most it will make (the cap),
how many it expects (the starts made, this one, and each other start worth its price now) and
the time those leave at the study's mean start: "start 4 of at most 11, about 6 expected".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from specsweep.analysis.drafters import Candidate, Drafter, candidate_of, drafter_of
from specsweep.analysis.noise import RunNoise
from specsweep.analysis.study import WorkloadModel
from specsweep.analysis.value import (
    CellBelief,
    StartValue,
    cell_loss,
    start_values,
)
from specsweep.tuning.beliefs import cell_beliefs, model_search
from specsweep.tuning.budget import Budget, minutes, start_budget
from specsweep.tuning.records import TrialRecord
from specsweep.tuning.search_words import Leaders, buy, buy_reason, ties
from specsweep.tuning.space import Space
from specsweep.types import OFF_KEY, Configuration, StudySettings

MAX_STARTS = 3  # server starts of one configuration, repeats included
# A start of the study's mean cost must be expected to buy this share of the tolerance (0.2 of 1%:
# 0.2% of the cells' summed rate). Checked by bench/sweep_efficiency.py and bench/time_to_answer.py.
START_PRICE = 0.2


class Phase(StrEnum):
    """Why a configuration was chosen (stored with its trial; the words the console prints)."""

    OFF = "speculation off"
    LARGEST_K = "largest k"
    SIBLING = "other draft sampling"  # a measured method's other drafter, at the longest k a cell wants
    EVERY_K = "every k"  # chosen by studies stored before the one step model (a lookup drafter's every k)
    WORTH = "worth it"  # its expected gain is worth its cost
    WAIT = "wait"  # another worker is measuring what is needed next
    STOP = "stop"


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchDecision:
    """The next configuration to measure, or None with the reason to stop."""

    configuration: Configuration | None
    phase: Phase
    reason: str
    repeat: bool  # measured before: measure it again (not a duplicate to reuse)
    budget: Budget
    value: StartValue | None = None  # what the start is expected to buy (phase WORTH)
    price_share: float | None = None  # what a start had to buy to be worth its cost, as a share of the cells' rate
    noise: Mapping[str, RunNoise] | None = None  # per workload
    models: Mapping[str, WorkloadModel] | None = None  # what the decision was made on
    ties: tuple[Leaders, ...] = ()  # at a stop: leaders within the tolerance of each other
    picks: Mapping[tuple[str, int], Candidate] | None = None  # per cell, what the study would paste now


@dataclass(frozen=True, slots=True, kw_only=True)
class _State:
    """The trials as the decisions read them."""

    configs: dict[str, Configuration]  # by key: what a start could measure
    candidates: dict[str, Candidate]  # by key: what the model predicts for each of them
    measured: list[TrialRecord]
    starts: dict[str, int]  # key -> server starts that measured it
    failed: set[str]  # failed in this run, never measured: not to be tried
    blocked: set[str]  # failed in this run or running elsewhere: not to be measured again now
    untried: list[Configuration]
    running: set[str]
    budget: Budget


def decide_next(
    trials: Sequence[TrialRecord],
    space: Space,
    settings: StudySettings,
    *,
    exclude: Collection[str] = (),
) -> SearchDecision:
    """The next configuration to measure, from the study's trials (see the module doc).

    ``exclude``: keys not to choose, e.g. the ones that failed in this run (a failure stored
    by an earlier run is tried again, as the study loop does for every sampler).
    """
    state = _state(trials, space, exclude)
    for step in (_speculation_off, _largest_k):
        decision = step(state)
        if decision is not None:
            return decision
    return _worth_most(state, settings)


def _state(trials: Sequence[TrialRecord], space: Space, exclude: Collection[str]) -> _State:
    configs = _space_configs(space)
    candidates = {key: candidate_of(c.spec) for key, c in configs.items()}
    measured = [t for t in trials if t.measured]
    measured_keys = {t.key for t in measured}
    running = {t.key for t in trials if t.running and t.key is not None}
    failed = set(exclude) - measured_keys
    untried = [c for c in configs.values() if c.key not in measured_keys | failed | running]
    starts: dict[str, int] = {}
    for t in measured:
        starts[t.key or OFF_KEY] = starts.get(t.key or OFF_KEY, 0) + 1
    return _State(
        configs=configs,
        candidates=candidates,
        measured=measured,
        starts=starts,
        failed=failed,
        blocked=set(exclude) | running,
        untried=untried,
        running=running,
        budget=start_budget(trials, len(configs)),
    )


def _decision(state: _State, config: Configuration | None, phase: Phase, reason: str, **extra: Any) -> SearchDecision:
    return SearchDecision(
        configuration=config,
        phase=phase,
        reason=reason,
        repeat=extra.pop("repeat", False),
        budget=extra.pop("budget", state.budget),
        **extra,
    )


def _speculation_off(state: _State) -> SearchDecision | None:
    off = state.configs.get(OFF_KEY)
    if off is None or off not in state.untried:
        return None
    return _decision(state, off, Phase.OFF, "the floor of every drafter's step time")


def _largest_k(state: _State) -> SearchDecision | None:
    """Each drafter at its largest draft length not failed; a wait or a stop when no drafter can be modelled."""
    by_drafter: dict[Drafter, list[Configuration]] = {}
    for key, c in state.configs.items():
        drafter = state.candidates[key].drafter
        if drafter is not None and key not in state.failed:
            by_drafter.setdefault(drafter, []).append(c)
    first_of_method: dict[str, Drafter] = {}
    for drafter in sorted(by_drafter):
        first_of_method.setdefault(drafter.method, drafter)
    for drafter, group in by_drafter.items():
        if first_of_method[drafter.method] != drafter:
            continue  # measured where its sibling's picks are (_other_sampling)
        k = max(state.candidates[c.key].num_speculative_tokens for c in group)
        largest = next(c for c in group if state.candidates[c.key].num_speculative_tokens == k)
        done = any(drafter_of(t.spec) == drafter and t.num_speculative_tokens >= k for t in state.measured)
        if largest in state.untried and not done:
            reason = f"the largest draft length of {drafter.label}: its run gives the acceptance of every shorter draft"
            return _decision(state, largest, Phase.LARGEST_K, reason)
    if any(t.num_speculative_tokens for t in state.measured):
        return None
    if any(state.candidates[key].drafter is not None for key in state.running if key in state.candidates):
        # Another worker is measuring a drafter's largest k: its acceptance curve is what every
        # further choice needs, so wait for it instead of guessing.
        return _decision(
            state, None, Phase.WAIT, "waiting for another worker's largest-k trial: its acceptance is needed next"
        )
    if not state.untried:
        return _decision(state, None, Phase.STOP, "every configuration of the space was measured or failed")
    return _decision(state, None, Phase.STOP, "no drafter could be measured (every one failed)")


def _worth_most(state: _State, settings: StudySettings) -> SearchDecision:
    """The start whose expected gain is worth most per minute, if any is worth its cost."""
    mconfigs = [t.measured_config() for t in state.measured]
    cand = state.candidates
    k_max = max(c.num_speculative_tokens for c in cand.values())
    models = model_search(
        mconfigs, settings.workload_weights, k_max=k_max, noise_prior=settings.noise_prior,
        captured_widths=settings.captured_widths,
    )  # fmt: skip
    noise = {w: m.noise for w, m in models.items() if m.noise is not None}
    extra: dict[str, Any] = {"noise": noise, "models": models}
    if not any(m.fits for m in models.values()):
        if state.untried:
            # Without a model (e.g. no acceptance counters), the largest untried k.
            fallback = max(state.untried, key=lambda c: (not cand[c.key].off, cand[c.key].num_speculative_tokens))
            reason = "no prediction possible (no measured drafter reported acceptance counts); the largest untried k"
            return _decision(state, fallback, Phase.LARGEST_K, reason, **extra)
        return _decision(state, None, Phase.STOP, "every configuration of the space was measured or failed", **extra)
    cells = cell_beliefs(models, mconfigs, state.candidates, state.failed, settings, noise)
    sibling = _other_sampling(state, cells)
    if sibling is not None:
        return _decision(state, sibling[0], Phase.SIBLING, sibling[1], **extra)
    options = _options(state)
    values = {v.candidate: v for v in start_values(cells, [cand[c.key] for c in options], tolerance=settings.tolerance)}
    costs = _costs(cells, options, cand, state.budget)
    mean_cost = state.budget.start_s or 1.0  # untimed: every cost is 1.0 too
    price = {c.key: settings.tolerance * START_PRICE * costs[c.key] / mean_cost for c in options}
    worth = [c for c in options if values[cand[c.key]].share >= price[c.key]]
    wanted = len({c.key for c in worth})
    budget = replace(state.budget, expected=min(state.budget.cap, state.budget.starts + wanted))
    picks = {(c.workload, c.concurrency): p for c in cells if (p := cell_loss(c, settings.tolerance).pick)}
    extra.update(budget=budget, ties=ties(cells, settings.tolerance, values), picks=picks)
    if worth and budget.starts < budget.cap:
        chosen = max(worth, key=lambda c: values[cand[c.key]].share / (costs[c.key] or 1.0))
        value = values[cand[chosen.key]]
        again = chosen.key in state.starts
        reason = buy_reason(value, again, costs[chosen.key] if budget.start_s else None, budget.modelled)
        return _decision(
            state, chosen, Phase.WORTH, reason, repeat=again, value=value, price_share=price[chosen.key], **extra
        )
    top = max(options, key=lambda c: values[cand[c.key]].share / price[c.key], default=None)
    if worth:
        reason = f"as many server starts as there are configurations to measure ({budget.cap}) were made"
    elif top is None or values[cand[top.key]].tokens_per_s <= 0:
        reason = "no start could change what the study pastes by more than the tolerance"
    else:
        value = values[cand[top.key]]
        reason = (
            f"no start is worth its time: the closest, {cand[top.key].short_label}"
            f"{' again' if top.key in state.starts else ''}, would buy {buy(value)}, "
            f"{100 * value.share:.2f}% in all, where "
            + (f"a start of {minutes(costs[top.key], budget.modelled)}" if budget.start_s else "a start")
            + f" must buy {100 * price[top.key]:.2f}%"
        )
    return _decision(state, None, Phase.STOP, reason, **extra)


def _other_sampling(state: _State, cells: Sequence[CellBelief]) -> tuple[Configuration, str] | None:
    """A drafter not measured yet whose method was: its first start, at the longest k at which a
    cell's best predicted rate among its measured siblings' candidates lies (its own acceptance
    is not known, theirs stands in for it), or its shortest k where every cell is best off."""
    measured = {drafter_of(t.spec) for t in state.measured if t.num_speculative_tokens}
    methods = {d.method for d in measured if d is not None}
    for drafter in sorted({c.drafter for c in state.candidates.values() if c.drafter is not None}):
        if drafter in measured or drafter.method not in methods:
            continue
        group = [c for c in state.untried if state.candidates[c.key].drafter == drafter]
        if not group or any(
            state.candidates[key].drafter == drafter for key in state.running if key in state.candidates
        ):
            continue
        wanted = 0
        for cell in cells:
            rates = {c: float(r) for c, r in zip(cell.sample.candidates, cell.sample.tokens_per_s, strict=True)}
            best = max(rates, key=rates.__getitem__, default=None)
            if best is not None and best.drafter is not None and best.drafter.method == drafter.method:
                wanted = max(wanted, best.num_speculative_tokens)

        def k_of(c: Configuration) -> int:
            return state.candidates[c.key].num_speculative_tokens

        chosen = min(group, key=lambda c: (abs(k_of(c) - wanted), -k_of(c))) if wanted else min(group, key=k_of)
        reason = (
            f"the first start of {drafter.label}: at k={k_of(chosen)}, the longest k a cell is predicted best at "
            f"with its sibling's acceptance, so its counters measure what the picks run"
            if wanted
            else f"the first start of {drafter.label}: at its shortest k, as every cell is predicted best off"
        )
        return chosen, reason
    return None


def _costs(
    cells: Sequence[CellBelief], options: Sequence[Configuration], candidates: Mapping[str, Candidate], budget: Budget
) -> dict[str, float]:
    """Each option's expected start: the study's mean boot, and its mean measuring time scaled by
    how much slower the option is predicted to stream than what the study measured (seconds; 1
    each before any start was timed: then every start costs the same)."""
    if budget.boot_s is None or budget.measure_s is None:
        return {c.key: 1.0 for c in options}
    out = {}
    for option in options:
        ratios = []
        for cell in cells:
            j = cell.column(candidates[option.key])
            measured = [i for i, c in enumerate(cell.sample.candidates) if c in cell.measured]
            if j is not None and measured and cell.sample.tokens_per_s[j] > 0:
                ratios.append(float(cell.sample.tokens_per_s[measured].mean() / cell.sample.tokens_per_s[j]))
        slower = sum(ratios) / len(ratios) if ratios else 1.0
        out[option.key] = budget.boot_s + budget.measure_s * slower
    return out


def _options(state: _State) -> list[Configuration]:
    """What a start could measure: untried configurations, and measured ones not started enough."""
    again = [
        c
        for key, c in state.configs.items()
        if key in state.starts and state.starts[key] < MAX_STARTS and key not in state.blocked
    ]
    return [*state.untried, *again]


def _space_configs(space: Space) -> dict[str, Configuration]:
    """The configurations a start could measure, by key. One the engine says can never draft runs
    as speculation off, so a start of it would buy nothing off's own does not (Space.notes says so)."""
    return {c.key: c for c in space.configurations() if c.spec is None or not space.never_drafts(c.spec)}
