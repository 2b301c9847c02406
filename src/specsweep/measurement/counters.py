"""Differences of cumulative server counters over a measured window, and what they imply.

vLLM's and llama.cpp's spec-decode counters have the same shape under different names (the
engine modules name them). Several vLLM engines (data parallel) each publish a series: they are
summed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specsweep.errors import MetricsError
from specsweep.measurement.acceptance import conditional_from_unconditional
from specsweep.types import CounterNames, MetricsSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterDelta:
    """Counter growth between two snapshots (None: the server does not publish it)."""

    window_s: float
    generation_tokens: float | None
    prompt_tokens: float | None
    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    accepted_per_position: tuple[float, ...] | None
    engines: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptanceSummary:
    """Acceptance over a window: S_i, p_i, mean acceptance length, draft acceptance rate."""

    per_position: tuple[float, ...]
    conditional: tuple[float, ...]
    mean_acceptance_length: float
    draft_acceptance_rate: float
    num_drafts: int


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, names: CounterNames) -> CounterDelta:
    """after - before for the counters specsweep reads, summed over engines."""

    def grow(name: str | None) -> float | None:
        if name is None:
            return None
        a, b = after.total(name), before.total(name)
        if a is None:
            return None
        return a - (b or 0.0)

    per_pos_name = names.accepted_per_position or ""
    positions: dict[int, float] = {}
    for snapshot, sign in ((after, 1.0), (before, -1.0)):
        for labels, value in snapshot.values(per_pos_name):
            position = position_label(labels.get("position", "0"), per_pos_name)
            positions[position] = positions.get(position, 0.0) + sign * value
    per_position = tuple(positions[i] for i in sorted(positions)) if positions else None
    engines = {labels.get("engine", "0") for labels, _ in after.values(names.generation_tokens)}
    return CounterDelta(
        window_s=after.taken_at - before.taken_at,
        generation_tokens=grow(names.generation_tokens),
        prompt_tokens=grow(names.prompt_tokens),
        num_drafts=grow(names.num_drafts),
        num_draft_tokens=grow(names.num_draft_tokens),
        num_accepted_tokens=grow(names.num_accepted_tokens),
        accepted_per_position=per_position,
        engines=max(1, len(engines)),
    )


def position_label(label: str, name: str) -> int:
    """A per-position counter's ``position`` label as a number; MetricsError when it is not one."""
    if not (label.isascii() and label.isdigit()):
        raise MetricsError(
            f"/metrics: {name} has position label {label[:20]!r}, not a whole number; "
            "is the endpoint the engine's own /metrics?"
        )
    return int(label)


def summarize_acceptance(delta: CounterDelta) -> AcceptanceSummary | None:
    """S_i = per_pos[i-1] / num_drafts and the rest; None when no drafts were counted."""
    if not delta.num_drafts or not math.isfinite(delta.num_drafts) or delta.num_drafts <= 0:
        return None  # no drafts, or a counter that is NaN or infinite: no acceptance to report
    drafts = delta.num_drafts
    per_position = tuple(count / drafts for count in delta.accepted_per_position or ())
    accepted = delta.num_accepted_tokens or 0.0
    drafted = delta.num_draft_tokens or 0.0
    return AcceptanceSummary(
        per_position=per_position,
        conditional=tuple(conditional_from_unconditional(per_position)),
        mean_acceptance_length=1.0 + accepted / drafts,
        draft_acceptance_rate=accepted / drafted if drafted else 0.0,
        num_drafts=int(drafts),
    )
