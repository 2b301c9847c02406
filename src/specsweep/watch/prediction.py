"""What a rig predicts for served traffic: net tok/s of every k and per-batch-size table, weighted by
the concurrency the server ran at, and the recommendation.

At each batch size B the server ran, the traffic's rate under draft length k is the rig's formula
for a workload (rigs/workload.py): R(k, B) = B M / (c + (M - 1) T(k, B) / E(k)), with the
traffic's acceptance E(k), its mean completion tokens M, and the rig's request overhead c. The
rig measured T and c at a few concurrency levels; between two of them both are interpolated
linearly in B (step time grows about linearly with the batch at a fixed k), beyond the largest
they are extrapolated along the last two (said), and with one level only they are held flat
(said). The noise of an interpolated step time is the rig's own (its pooled relative sd).

A configuration's rate over a window is sum_B w_B R(k_B, B), w_B the seconds batch size B held per
second of the window (idle seconds give nothing under every configuration). The same draws
(analysis/rates.py: acceptance draws times step-time draws, one seed for every B) run through
every B, so differences between configurations are paired. Several windows combine the same way,
each weighted by its length, each with its own acceptance.

The choice is what the one rule that picks (analysis/value.pick) takes from the paired draws: the
least expected loss against the tolerance, as a study's recommendation and paste. A per-batch-size
table runs at each batch size what the rule picks there, and joins the single k's as one more
configuration the rule chooses among. Those the data cannot tell from the choice (their paired
difference's interval reaches 0) are named as tied.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.fits import AcceptanceFit
from specsweep.analysis.positions import band, point_per_position
from specsweep.analysis.rates import RateSample, sample_rates
from specsweep.analysis.value import pick
from specsweep.config import TOLERANCE
from specsweep.errors import FitError
from specsweep.rigs.model import LevelTiming, Rig, fit_rig
from specsweep.rigs.workload import WorkloadTiming, workload_acceptance_scale, workload_model
from specsweep.types import RunNoisePrior
from specsweep.workload import parse_context_variant

LEVEL_COMPLETION_TOKENS = 600.0  # any M works for a derived level: its step time is what it carries
CONTEXT_WORTH_SAYING = 1024  # served prompts this much longer than the rig's own are said, where it cannot read them
UNREAD_CONTEXT = "served prompts average"  # how that note starts (watch names the study that measures them)


def concurrency_source(rig: Rig, concurrency: int) -> str:
    """How the rig knows batch size B: "measured", "interpolated", "extrapolated" or "held flat"."""
    levels = rig.concurrency_levels
    if concurrency in levels:
        return "measured"
    if len(levels) == 1:
        return "held flat"
    return "interpolated" if levels[0] < concurrency < levels[-1] else "extrapolated"


def rig_at_concurrency(rig: Rig, concurrency: int) -> Rig:
    """The rig's levels carried to batch size B (module doc), at each context level it measured;
    the rig itself where it measured B."""
    levels = rig.concurrency_levels
    if concurrency in levels:
        return rig
    if len(levels) == 1:
        low = high = levels[0]
    else:
        above = [b for b in levels if b > concurrency]
        high = above[0] if above and above[0] != levels[0] else (levels[1] if above else levels[-1])
        low = levels[levels.index(high) - 1]
    share = 0.0 if high == low else (concurrency - low) / (high - low)
    derived = []
    keys = {(lv.drafter, lv.num_speculative_tokens, lv.context_tokens) for lv in rig.levels}
    for drafter, k, context in sorted(
        keys, key=lambda key: (key[0] is not None, key[0] or Drafter(method=""), key[1], key[2])
    ):
        low_end, high_end = _level_point(rig, drafter, k, low, context), _level_point(rig, drafter, k, high, context)
        if low_end is None or high_end is None:
            continue
        (t0, c0, q0, n0), (t1, c1, q1, n1) = low_end, high_end
        step = max(t0 + (t1 - t0) * share, 1e-9)
        overhead = max(c0 + (c1 - c0) * share, 0.0)
        span = step * (LEVEL_COMPLETION_TOKENS - 1.0)
        drafted = None if drafter is None or q0 is None or q1 is None else min(max(q0 + (q1 - q0) * share, 0.0), 1.0)
        derived.append(
            LevelTiming(
                num_speculative_tokens=k, concurrency=concurrency, drafter=drafter,
                output_tokens_per_s=concurrency * LEVEL_COMPLETION_TOKENS / (overhead + span),
                tokens_per_step=1.0, completion_tokens=LEVEL_COMPLETION_TOKENS, decode_span_s=span,
                prompt_tokens=0.0, requests=n0 + n1, workload="",
                draft_share=drafted, context_tokens=context,
            )
        )  # fmt: skip
    if not derived:
        raise FitError(f"the rig has no draft length measured at both concurrency {low} and {high}.")
    return fit_rig(derived, identity=rig.identity, shape=rig.shape)


def _level_point(
    rig: Rig, drafter: Drafter | None, k: int, concurrency: int, context: int = 0
) -> tuple[float, float, float | None, int] | None:
    """(step time, overhead, draft share, requests) of the rig at (drafter, k, B, context), None if unmeasured."""
    mine = [lv for lv in rig.levels if lv.drafter == drafter and lv.num_speculative_tokens == k]
    mine = [lv for lv in mine if lv.concurrency == concurrency and lv.context_tokens == context]
    if not mine:
        return None
    requests = sum(lv.requests for lv in mine)
    overhead = sum(lv.request_overhead_s * lv.requests for lv in mine) / requests
    share = None if drafter is None else rig.draft_share(drafter, k, concurrency)
    candidate = OFF if drafter is None or not k else Candidate(drafter=drafter, num_speculative_tokens=k)
    model = replace(rig.model, context_tokens=context)  # the one fit, read at this context
    return model.step_time_s(candidate, concurrency)[0], overhead, share, requests


def _plain(levels: list[LevelTiming]) -> list[LevelTiming]:
    """The levels at their workloads' own prompts, where there are any: traffic is read there (the
    step model at context 0), and a context level's overhead is its long prompt's prefill."""
    return [lv for lv in levels if not lv.context_tokens] or levels


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficPrediction:
    """Rates of every candidate at each batch size the traffic ran at, and how long each held."""

    samples: dict[int, RateSample]  # batch size -> joint draws
    weights: dict[int, float]  # batch size -> seconds it held per second of the span
    candidates: tuple[Candidate, ...]  # common to every batch size, off first when the rig has it
    sources: dict[int, str]  # batch size -> how the rig knows it (concurrency_source)
    context_tokens: int = 0  # the context the rig's step model was read at


def predict_traffic(
    rig: Rig,
    drafter: Drafter,
    fit: AcceptanceFit,
    *,
    weights: Mapping[int, float],
    completion_tokens: float,
    running: Candidate | None,
    draft_share: float | None = None,
    k_max: int,
    draws: int = 400,
    seed: int = 0,
    context_tokens: int = 0,
) -> TrafficPrediction:
    """Joint draws of every candidate's rate at each batch size in ``weights`` (B >= 1 only), the
    rig's step model read at ``context_tokens`` (served_context)."""
    noise = RunNoisePrior(
        relative_sd=rig.model.posterior.start_sd, df=max(rig.model.posterior.df, 1), source="the rig's own starts"
    )
    points = {drafter: point_per_position(fit)}
    samples: dict[int, RateSample] = {}
    for batch in sorted(b for b, w in weights.items() if b >= 1 and w > 0):
        at_b = rig_at_concurrency(rig, batch)
        overhead = [lv.request_overhead_s for lv in _plain([lv for lv in at_b.levels if lv.concurrency == batch])]
        timing = WorkloadTiming(
            workload="traffic",
            overhead_s={batch: sum(overhead) / len(overhead)},
            completion_tokens={batch: completion_tokens},
            measured={} if running is None else {batch: (running, 0.0)},
            draft_share={} if draft_share is None else {batch: draft_share},
            context_tokens=context_tokens,
        )
        model = workload_model(at_b, points, timing, run_noise=noise)
        scale = workload_acceptance_scale(at_b, drafter, timing, batch, k_max)
        samples[batch] = sample_rates(
            model, {drafter: fit}, concurrency=batch, k_max=k_max, draws=draws, seed=seed,
            acceptance_scale={drafter: scale} if scale else None,
        )  # fmt: skip
    if not samples:
        raise FitError("the server ran no request in this window: nothing to predict.")
    common = [c for c in next(iter(samples.values())).candidates if all(c in s.candidates for s in samples.values())]
    return TrafficPrediction(
        samples=samples,
        weights={b: float(weights[b]) for b in samples},
        candidates=tuple(common),
        sources={b: concurrency_source(rig, b) for b in samples},
        context_tokens=context_tokens,
    )


def served_context(prompt_tokens: float | None, requests: float | None, rig: Rig) -> tuple[int, str | None]:
    """The context level the traffic's steps read, as the rig's step model counts it (beyond its own
    workloads' prompts), and a note: served prompts of ``prompt_tokens`` over ``requests`` finished.
    A rig that measured no context level is read at its own prompts (0), and the note says so where
    the traffic's prompts are a context level longer than the rig's."""
    if not prompt_tokens or not requests or requests < 1:
        return 0, None
    own = [  # the rig's workloads as they are: a context level's prompts are that level long
        w["prompt_tokens"]
        for name, w in rig.shape.workloads.items()
        if w.get("prompt_tokens") and parse_context_variant(name)[1] is None
    ]
    beyond = max(round(prompt_tokens / requests - (sum(own) / len(own) if own else 0.0)), 0)
    if not rig.context_levels:
        if beyond < CONTEXT_WORTH_SAYING:
            return 0, None
        return 0, (
            f"{UNREAD_CONTEXT} {prompt_tokens / requests:,.0f} tokens, {beyond:,} beyond the rig's own; the rig "
            "measured no context level, so its step times are read at its own prompts (a study with "
            f"--context {max(round(beyond / 1024), 1)}k measures one there, and its rig reads the served context)"
        )
    said = f"the rig's step model is read at the served context: {beyond:,} tokens beyond its own prompts"
    return beyond, said if beyond else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRate:
    """One configuration over the traffic: what it runs at each batch size, and its predicted rate."""

    k_by_batch: dict[int, int]  # batch size -> k (0: speculation off)
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    extrapolated: bool = False  # runs a k past the positions the counters measured

    @property
    def single(self) -> bool:
        return len(set(self.k_by_batch.values())) <= 1

    @property
    def label(self) -> str:
        if self.single:
            k = next(iter(self.k_by_batch.values()), 0)
            return "speculation off" if k == 0 else f"k={k}"
        return "per batch size " + ", ".join(f"{b}: k={k}" for b, k in sorted(self.k_by_batch.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficRecommendation:
    """The configuration to run for the traffic, and what it gains over the running one."""

    choice: ConfigRate
    running: ConfigRate | None
    gain: float | None  # over the running configuration, as a fraction
    gain_low: float | None
    gain_high: float | None
    rates: tuple[ConfigRate, ...]  # every single k (off first) and the table, if any
    tied: tuple[ConfigRate, ...]
    weights: dict[int, float]  # batch size -> share of the traffic's busy time
    confidence: float
    worth_measuring: ConfigRate | None = None  # an extrapolated k predicted above the choice


@dataclass(frozen=True, slots=True, kw_only=True)
class _Combined:
    """Weighted points and draws per batch size, one column per candidate."""

    candidates: tuple[Candidate, ...]
    weight: dict[int, float]
    points: dict[int, np.ndarray]  # (candidates,)
    draws: dict[int, np.ndarray]  # (draws, candidates)

    def column(self, pick: Callable[[int], Candidate]) -> tuple[float, np.ndarray]:
        """(point, draws) of the configuration that runs ``pick(B)`` at each batch size, summed over B."""
        point = 0.0
        draws: np.ndarray | None = None
        for batch in self.points:
            j = self.candidates.index(pick(batch))
            point += float(self.points[batch][j])
            draws = self.draws[batch][:, j] if draws is None else draws + self.draws[batch][:, j]
        assert draws is not None
        return point, draws


def _combine(predictions: Sequence[tuple[float, TrafficPrediction]]) -> _Combined:
    """Every prediction's draws at each batch size, weighted by the window's length and the batch's time."""
    candidates = predictions[0][1].candidates
    for _, p in predictions[1:]:
        candidates = tuple(c for c in candidates if c in p.candidates)
    if not candidates:
        raise FitError("no configuration is predicted in every window: the windows' draft lengths differ.")
    span = sum(w for w, _ in predictions) or 1.0
    weight: dict[int, float] = {}
    points: dict[int, np.ndarray] = {}
    draws: dict[int, np.ndarray] = {}
    for window_weight, prediction in predictions:
        for batch, sample in prediction.samples.items():
            w = window_weight / span * prediction.weights[batch]
            index = [sample.candidates.index(c) for c in candidates]
            weight[batch] = weight.get(batch, 0.0) + w
            points[batch] = points.get(batch, 0.0) + sample.tokens_per_s[index] * w
            draws[batch] = draws.get(batch, 0.0) + sample.draws[:, index] * w
    return _Combined(candidates=candidates, weight=weight, points=points, draws=draws)


def _everywhere(candidate: Candidate) -> Callable[[int], Candidate]:
    """The pick of a configuration that runs ``candidate`` at every batch size."""
    return lambda _batch: candidate


def _rate(
    k_by_batch: dict[int, int], column: tuple[float, np.ndarray], confidence: float, measured_k: int | None
) -> ConfigRate:
    low, high = band(column[1], np.array(column[0]), confidence)
    return ConfigRate(
        k_by_batch=dict(sorted(k_by_batch.items())),
        tokens_per_s=column[0],
        tokens_per_s_low=float(low),
        tokens_per_s_high=float(high),
        extrapolated=measured_k is not None and max(k_by_batch.values(), default=0) > measured_k,
    )


def recommend_for_traffic(
    predictions: Sequence[tuple[float, TrafficPrediction]],
    *,
    running_k_at: Callable[[int], int] | None = None,
    measured_k: int | None = None,
    allow_table: bool = True,
    confidence: float = 0.95,
    tolerance: float = TOLERANCE,
) -> TrafficRecommendation:
    """The best configuration over one or more windows' predictions, each with its weight (its length).

    ``running_k_at``: the k the running configuration uses at batch size B (0: off).
    ``measured_k``: the positions the counters measured. As a study pastes only what it measured,
    the choice runs no k past them; a longer k predicted higher from the decay model's
    extrapolation is named (``worth_measuring``): running at it for a while measures it."""
    combined = _combine(predictions)
    candidates = combined.candidates
    columns = [combined.column(_everywhere(c)) for c in candidates]
    rates = [_rate({b: c.num_speculative_tokens for b in combined.points}, col, confidence, measured_k)
             for c, col in zip(candidates, columns, strict=True)]  # fmt: skip
    allowed = [j for j, r in enumerate(rates) if not r.extrapolated] or list(range(len(rates)))
    j_best, _ = pick(np.column_stack([col[1] for col in columns]), allowed, tolerance)
    best = candidates[j_best]
    picks = {b: best for b in combined.points}
    if allow_table:
        for batch in combined.points:
            picks[batch] = candidates[pick(combined.draws[batch], allowed, tolerance)[0]]
    if any(c != best for c in picks.values()):
        columns.append(combined.column(lambda b: picks[b]))
        rates.append(
            _rate({b: c.num_speculative_tokens for b, c in picks.items()}, columns[-1], confidence, measured_k)
        )
        allowed.append(len(rates) - 1)
    chosen, _ = pick(np.column_stack([col[1] for col in columns]), allowed, tolerance)
    tied = []
    for j, other in enumerate(columns):
        if j == chosen:
            continue
        low, _ = band(columns[chosen][1] - other[1], np.array(columns[chosen][0] - other[0]), confidence)
        if float(low) <= 0:
            tied.append(rates[j])
    beyond = [r for r in rates if r.extrapolated and r.tokens_per_s > rates[chosen].tokens_per_s]
    running = gain = gain_low = gain_high = None
    if running_k_at is not None:
        by_k = {c.num_speculative_tokens: c for c in candidates}
        ks = {b: running_k_at(b) for b in combined.points}
        if all(k in by_k for k in ks.values()):
            column = combined.column(lambda b: by_k[ks[b]])
            running = _rate(ks, column, confidence, measured_k)
            gain = float(columns[chosen][0] / column[0] - 1.0)
            low, high = band(columns[chosen][1] / column[1] - 1.0, np.array(gain), confidence)
            gain_low, gain_high = float(low), float(high)
    total = sum(combined.weight.values())
    return TrafficRecommendation(
        choice=rates[chosen], running=running, gain=gain, gain_low=gain_low, gain_high=gain_high,
        rates=tuple(rates), tied=tuple(sorted(tied, key=lambda r: -r.tokens_per_s)),
        weights={b: w / total for b, w in sorted(combined.weight.items())} if total else {}, confidence=confidence,
        worth_measuring=max(beyond, key=lambda r: r.tokens_per_s) if beyond else None,
    )  # fmt: skip
