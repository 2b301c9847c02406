"""The traffic a server served, per window of time, from its counters and gauges alone.

A window sums the intervals (measurement/series.py) that end inside it:

- counter growth as a CounterDelta (measurement/counters.py): acceptance S_i = per_pos[i-1] / drafts;
- the running draft length k0: the per-position series the server publishes (vLLM and llama.cpp
  publish positions 0..k-1 from the start), else draft tokens / drafts;
- the concurrency it ran at: each sample of the running-requests gauge stands for the time since
  the previous sample, per label set (each is a batch of its own); the window's concurrency is
  how many seconds each batch size held. A gauge sample is an instant: bursts shorter than the
  sampling interval are seen in proportion to their length only on average;
- the generated-token rate: generation-counter growth over the window's length.

Acceptance of a window: per-position counts fitted with the decay models (analysis/fits.py)
when the server publishes them; otherwise the mean acceptance length at k0 with the aggregate
(geometric) fit of analysis/aggregate.py, one (drafted, accepted) pair per interval so the
interval spread gives the band; SGLang's accept-length gauge (no counters) at a k0 the user
names, totals only.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specsweep.analysis.aggregate import fit_aggregate_acceptance
from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.measurement.counters import CounterDelta
from specsweep.measurement.series import Interval, SeriesNames


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedWindow:
    """What the server did in one window of time."""

    start: float  # seconds on the snapshots' clock (unix time for Prometheus and live polls)
    end: float
    delta: CounterDelta
    finished_requests: float | None  # None: not published
    running_k: int | None  # the draft length it ran (None: no drafting seen)
    concurrency_s: dict[int, float]  # running batch size -> seconds it held, summed over label sets
    waiting_mean: float | None  # time-weighted mean of the waiting gauge (all label sets summed)
    accept_length: float | None  # SGLang's gauge, weighted by generated tokens
    resets: int  # server restarts seen (generation counter series that restarted)
    label_sets: int  # label sets of the running gauge (batches that ran side by side)
    intervals: tuple[Interval, ...]
    covered_s: float = 0.0  # the length of the intervals counted (they may start before the window)
    notes: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def generation_tokens_per_s(self) -> float | None:
        """Generation-counter growth over the time its intervals cover."""
        tokens = self.delta.generation_tokens
        return None if tokens is None or self.covered_s <= 0 else tokens / self.covered_s

    @property
    def observed_s(self) -> float:
        return sum(self.concurrency_s.values())

    def concurrency_shares(self) -> dict[int, float]:
        """Batch size -> share of observed time (0 included: idle)."""
        total = self.observed_s
        return {b: s / total for b, s in sorted(self.concurrency_s.items())} if total else {}

    @property
    def mean_concurrency(self) -> float | None:
        total = self.observed_s
        return sum(b * s for b, s in self.concurrency_s.items()) / total if total else None

    @property
    def mean_completion_tokens(self) -> float | None:
        """Generated tokens per finished request (requests span windows: a long window evens it out)."""
        tokens, done = self.delta.generation_tokens, self.finished_requests
        return tokens / done if tokens and done and done >= 1 else None


def split_windows(
    intervals: Sequence[Interval], *, start: float, end: float, window_s: float, names: SeriesNames
) -> list[ServedWindow]:
    """Windows of ``window_s`` from ``start`` (the last one ends at ``end``), each from the intervals
    ending inside it."""
    if window_s <= 0 or end <= start:
        return []
    count = max(1, math.ceil((end - start) / window_s - 1e-9))
    out = []
    for index in range(count):
        lo, hi = start + index * window_s, min(end, start + (index + 1) * window_s)
        mine = [iv for iv in intervals if lo < iv.end <= hi or (index == 0 and iv.end == lo)]
        if mine or index + 1 < count:
            out.append(summarize_window(mine, start=lo, end=hi, names=names))
    return out


def summarize_window(intervals: Sequence[Interval], *, start: float, end: float, names: SeriesNames) -> ServedWindow:
    """One window from its intervals: intervals at another draft length than the last are left out of
    the acceptance counts (the server was restarted with another k) and said."""
    c = names.counters
    notes: list[str] = []
    depths = [iv.positions for iv in intervals if iv.per_position or iv.positions]
    running_k = depths[-1] if depths else None
    counted = [iv for iv in intervals if running_k is None or iv.positions in (running_k, 0)]
    if len(counted) < len(intervals):
        other = sorted({iv.positions for iv in intervals} - {running_k, 0})
        notes.append(
            f"the server published {', '.join(map(str, other))} draft positions earlier in this window and "
            f"{running_k} at its end (restarted with another k): acceptance counts only the intervals at k={running_k}"
        )

    def grow(name: str | None, rows: Sequence[Interval] = intervals) -> float | None:
        if name is None or not any(name in iv.growth for iv in rows):
            return None
        return sum(iv.growth.get(name, 0.0) for iv in rows)

    depth = max((len(iv.per_position) for iv in counted), default=0)
    per_position = tuple(sum(iv.per_position[i] for iv in counted if len(iv.per_position) > i) for i in range(depth))
    delta = CounterDelta(
        window_s=end - start,
        generation_tokens=grow(c.generation_tokens),
        prompt_tokens=grow(c.prompt_tokens),
        num_drafts=grow(c.num_drafts, counted),
        num_draft_tokens=grow(c.num_draft_tokens, counted),
        num_accepted_tokens=grow(c.num_accepted_tokens, counted),
        accepted_per_position=per_position or None,
        engines=max((len(iv.gauges.get(names.running or "", ())) for iv in intervals), default=1) or 1,
    )
    if running_k is None and delta.num_drafts and delta.num_draft_tokens:
        running_k = round(delta.num_draft_tokens / delta.num_drafts)
    concurrency: dict[int, float] = {}
    waiting = weight = 0.0
    lengths: list[tuple[float, float]] = []
    for iv in intervals:
        for value in iv.gauges.get(names.running or "", ()):
            batch = max(0, round(value))
            concurrency[batch] = concurrency.get(batch, 0.0) + iv.duration_s
        queued = iv.gauges.get(names.waiting or "")
        if queued:
            waiting += sum(queued) * iv.duration_s
            weight += iv.duration_s
        gauge = iv.gauges.get(names.accept_length or "")
        if gauge:
            lengths.append((sum(gauge) / len(gauge), iv.growth.get(c.generation_tokens, 0.0)))
    produced = sum(w for _, w in lengths)
    return ServedWindow(
        start=start,
        end=end,
        delta=delta,
        finished_requests=grow(names.finished_requests),
        running_k=running_k,
        concurrency_s=concurrency,
        waiting_mean=waiting / weight if weight else None,
        accept_length=sum(v * w for v, w in lengths) / produced if produced else None,
        resets=sum(iv.resets for iv in intervals),
        label_sets=max((len(iv.gauges.get(names.running or "", ())) for iv in intervals), default=0),
        intervals=tuple(counted),
        covered_s=sum(iv.duration_s for iv in intervals),
        notes=tuple(notes),
    )


def merge_windows(windows: Sequence[ServedWindow], names: SeriesNames) -> ServedWindow:
    """The whole span as one window (for the summary over every window)."""
    intervals = [iv for w in windows for iv in w.intervals]
    merged = summarize_window(intervals, start=windows[0].start, end=windows[-1].end, names=names)
    notes = tuple(dict.fromkeys(n for w in windows for n in w.notes))
    return ServedWindow(**{**{f: getattr(merged, f) for f in ServedWindow.__dataclass_fields__}, "notes": notes})


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowAcceptance:
    """A window's acceptance fit and how it was obtained."""

    fit: AcceptanceFit
    source: str  # "per_position", "aggregate" (mean acceptance length) or "gauge" (SGLang's accept length)
    running_k: int
    steps: float  # decode steps the fit counts (drafts, or every decode step for a sometimes-drafter)
    notes: tuple[str, ...] = field(default_factory=tuple)


def window_acceptance(
    window: ServedWindow,
    names: SeriesNames,
    *,
    k_max: int,
    running_k: int | None = None,
    every_step: bool = False,
    seed: int = 0,
) -> WindowAcceptance | None:
    """The window's acceptance (None when it counted no drafts). ``running_k`` is the user's
    when the server does not say it (SGLang). ``every_step``: the drafter drafts at some steps
    only (n-gram lookup): S_i are then per decode step, with every step in the denominator."""
    delta = window.delta
    k0 = window.running_k or running_k
    if delta.accepted_per_position and delta.num_drafts and delta.num_drafts > 0 and k0:
        counts = list(delta.accepted_per_position[:k0])
        steps = float(delta.num_drafts)
        notes: list[str] = []
        if every_step:
            decode = _decode_steps(window)
            if decode is not None and decode > steps:
                steps = decode
            else:
                notes.append("the finished-request counter is missing: S_i are per drafting step, not per decode step")
        effect = design_effect_of(window, names)
        fit = fit_acceptance(
            num_drafts=steps, accepted_per_position=counts, k_max=max(k_max, k0), design_effect=effect, seed=seed
        )
        return WindowAcceptance(fit=fit, source="per_position", running_k=k0, steps=steps, notes=tuple(notes))
    if delta.num_drafts and delta.num_draft_tokens and delta.num_accepted_tokens is not None and k0:
        drafted_name = names.counters.num_draft_tokens or ""
        accepted_name = names.counters.num_accepted_tokens or ""
        pairs = [(iv.growth.get(drafted_name, 0.0), iv.growth.get(accepted_name, 0.0)) for iv in window.intervals]
        pairs = [(d, a) for d, a in pairs if d > 0] or [(delta.num_draft_tokens, delta.num_accepted_tokens)]
        fit = fit_aggregate_acceptance(num_speculative_tokens=k0, requests=pairs, k_max=max(k_max, k0), seed=seed)
        return WindowAcceptance(fit=fit, source="aggregate", running_k=k0, steps=float(delta.num_drafts))
    if window.accept_length is not None and running_k and delta.generation_tokens:
        steps = delta.generation_tokens / window.accept_length
        accepted = (window.accept_length - 1.0) * steps
        fit = fit_aggregate_acceptance(
            num_speculative_tokens=running_k, requests=[(running_k * steps, min(accepted, running_k * steps))],
            k_max=max(k_max, running_k), seed=seed,
        )  # fmt: skip
        return WindowAcceptance(fit=fit, source="gauge", running_k=running_k, steps=steps)
    return None


def _decode_steps(window: ServedWindow) -> float | None:
    """Every decode step: each finished request's tokens after its first, less the accepted drafts."""
    delta, done = window.delta, window.finished_requests
    if not delta.generation_tokens or done is None or delta.num_accepted_tokens is None:
        return None
    return delta.generation_tokens - done - delta.num_accepted_tokens


MIN_BLOCKS = 8


def design_effect_of(window: ServedWindow, names: SeriesNames) -> float:
    """How many drafted steps count as one independent step: the dispersion of the first position's
    acceptance across blocks of consecutive intervals, beyond what binomial chance gives.

    Steps of one request share its text (a window mixes easy and hard requests), so acceptance
    varies more from block to block than independent steps would: Pearson's chi-square over
    blocks, divided by its degrees of freedom, estimates the variance inflation. Blocks shorter
    than a request are correlated with their neighbours, so blocks of 1, 2, 4, ... intervals are
    tried and the largest inflation kept among those with at least MIN_BLOCKS blocks. At least 1;
    1 when there are too few intervals to tell."""
    drafts_name = names.counters.num_drafts or ""
    pairs = [
        (iv.growth.get(drafts_name, 0.0), iv.per_position[0] if iv.per_position else 0.0) for iv in window.intervals
    ]
    pairs = [(n, x) for n, x in pairs if n > 0]
    total_n = sum(n for n, _ in pairs)
    if not total_n:
        return 1.0
    rate = sum(x for _, x in pairs) / total_n
    if not 0.0 < rate < 1.0:
        return 1.0
    best, size = 1.0, 1
    while len(pairs) // size >= MIN_BLOCKS:
        blocks = [pairs[i : i + size] for i in range(0, len(pairs) - size + 1, size)]
        sums = [(sum(n for n, _ in b), sum(x for _, x in b)) for b in blocks]
        chi2 = sum((x - n * rate) ** 2 / (n * rate * (1.0 - rate)) for n, x in sums if n > 0)
        best = max(best, chi2 / (len(sums) - 1))
        size *= 2
    return best
