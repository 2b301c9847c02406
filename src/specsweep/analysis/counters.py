"""Differences of cumulative server counters over a measured window, and what they imply.

vLLM's and llama.cpp's spec-decode counters have the same shape under different prefixes
(``vllm:`` and ``llamacpp:``). Several vLLM engines (data parallel) each publish a series:
they are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

from specsweep.analysis.acceptance import conditional_from_unconditional
from specsweep.types import MetricsSnapshot

PREFIXES = ("vllm:", "llamacpp:")


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterDelta:
    """Counter growth between two snapshots (None: the server does not publish it)."""

    prefix: str
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


def detect_prefix(snapshot: MetricsSnapshot) -> str | None:
    """Which engine's metric names the snapshot uses, if any."""
    for prefix in PREFIXES:
        if any(name.startswith(prefix) for name in snapshot.samples):
            return prefix
    return None


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, prefix: str) -> CounterDelta:
    """after - before for the counters specsweep reads, summed over engines."""

    def grow(name: str) -> float | None:
        a, b = after.total(prefix + name), before.total(prefix + name)
        if a is None:
            return None
        return a - (b or 0.0)

    per_pos_name = prefix + "spec_decode_num_accepted_tokens_per_pos_total"
    positions: dict[int, float] = {}
    for labels, value in after.values(per_pos_name):
        positions[int(labels.get("position", "0"))] = positions.get(int(labels.get("position", "0")), 0.0) + value
    for labels, value in before.values(per_pos_name):
        position = int(labels.get("position", "0"))
        positions[position] = positions.get(position, 0.0) - value
    per_position = tuple(positions[i] for i in sorted(positions)) if positions else None
    engines = {labels.get("engine", "0") for labels, _ in after.values(prefix + "generation_tokens_total")}
    return CounterDelta(
        prefix=prefix,
        window_s=after.taken_at - before.taken_at,
        generation_tokens=grow("generation_tokens_total"),
        prompt_tokens=grow("prompt_tokens_total"),
        num_drafts=grow("spec_decode_num_drafts_total"),
        num_draft_tokens=grow("spec_decode_num_draft_tokens_total"),
        num_accepted_tokens=grow("spec_decode_num_accepted_tokens_total"),
        accepted_per_position=per_position,
        engines=max(1, len(engines)),
    )


def summarize_acceptance(delta: CounterDelta) -> AcceptanceSummary | None:
    """S_i = per_pos[i-1] / num_drafts and the rest; None when no drafts were counted."""
    if not delta.num_drafts or delta.num_drafts <= 0:
        return None
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
