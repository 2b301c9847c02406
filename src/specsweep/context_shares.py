"""Context levels and their shares, from the lengths of the user's own traffic.

``study --context-from PATH`` (``measure.context_from``) measures the context levels the user
serves rather than levels named by hand: PATH gives a weighted sample of context lengths in
tokens (each prompt of a workload file, counted by ``workload.count_tokens``, weight 1; or each
window of what ``specsweep watch`` saw, its served prompt tokens per finished request, weighted
by the finished requests), and ``shares_from_lengths`` turns it into levels and shares:

- a length within ``OWN_MARGIN`` tokens of the study's workloads' own prompts (their mean,
  ``context_prompts.own_tokens``) belongs to the plain workload;
- the longer ones are cut into at most ``MOST_LEVELS`` parts at the weighted quantiles of their
  lengths (terciles; ties stay in one part, so a narrow long part gives fewer), each part's
  level its weighted median rounded to a whole ``LEVEL_UNIT`` (and at least one); neighbouring
  parts whose levels are less than ``LEVEL_RATIO`` apart are one level, at their joint median (a
  step reads the context linearly, so the model reads between levels: 14k, 16k and 17k would
  cost three levels' measuring for what one says);
- each part's share is its fraction of the sample's weight, the plain part's too: they sum to 1.

docs/workloads.md states the rule with a worked example. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specsweep.workload import Workload, count_tokens

OWN_MARGIN = 1024  # lengths this close to the workloads' own prompts are the plain workload's
LEVEL_UNIT = 1024  # a level is a whole number of these (a "k")
MOST_LEVELS = 3
LEVEL_RATIO = 1.5  # neighbouring levels closer than this factor are measured as one


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextShares:
    """The context levels a sample of lengths implies, each with its share of the weight."""

    levels: tuple[int, ...]  # in tokens, shortest first, each a whole LEVEL_UNIT
    shares: tuple[float, ...]  # one per level
    own_share: float  # the plain workload's: 1 - sum(shares)
    own_tokens: float  # the workloads' own prompts the plain part is measured from
    count: int  # the sample's entries (prompts, or windows)

    @property
    def note(self) -> str | None:
        """Why there are no levels, in one line (None: there are)."""
        if self.levels:
            return None
        if not self.count:
            return "no lengths to go by: no context level"
        return (
            f"every length is within {OWN_MARGIN:,} tokens of the workloads' own prompts "
            f"({self.own_tokens:,.0f} tokens): no context level"
        )


def prompt_lengths(workload: Workload) -> list[tuple[float, float]]:
    """A workload's prompts as a sample: each prompt's tokens as specsweep counts them, weight 1."""
    return [(float(count_tokens(p.text())), 1.0) for p in workload.prompts]


def shares_from_lengths(sample: Iterable[tuple[float, float]], own_tokens: float) -> ContextShares:
    """Levels and shares from (length in tokens, weight) pairs (see the module doc); entries of
    weight 0 or less count for nothing."""
    points = [(float(x), float(w)) for x, w in sample if w > 0 and math.isfinite(x) and math.isfinite(w)]
    total = sum(w for _, w in points)
    if total <= 0:
        return ContextShares(levels=(), shares=(), own_share=1.0, own_tokens=own_tokens, count=0)
    long = _grouped([(x, w) for x, w in points if x > own_tokens + OWN_MARGIN])
    joined: list[list[tuple[float, float]]] = []  # shortest first
    for part in _parts(long):
        if joined and _level(part) < LEVEL_RATIO * _level(joined[-1]):
            joined[-1] = joined[-1] + part
        else:
            joined.append(part)
    parts = [(_level(part), sum(w for _, w in part)) for part in joined]
    shares = tuple(w / total for _, w in parts)
    return ContextShares(
        levels=tuple(level for level, _ in parts),
        shares=shares,
        own_share=max(0.0, 1.0 - sum(shares)),
        own_tokens=own_tokens,
        count=len(points),
    )


def _level(part: Sequence[tuple[float, float]]) -> int:
    """A part's level: its weighted median rounded to a whole LEVEL_UNIT, at least one."""
    return max(1, math.floor(_median(part) / LEVEL_UNIT + 0.5)) * LEVEL_UNIT


def length_summary(sample: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """The weighted p50, p90 and the longest of a sample's lengths (None: an empty sample)."""
    points = _grouped([(x, w) for x, w in sample if w > 0])
    if not points:
        return None
    return _quantile(points, 0.5), _quantile(points, 0.9), points[-1][0]


def _grouped(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Equal lengths as one point (their weights summed), shortest first."""
    out: dict[float, float] = {}
    for x, w in points:
        out[x] = out.get(x, 0.0) + w
    return sorted(out.items())


def _quantile(points: Sequence[tuple[float, float]], fraction: float) -> float:
    """The shortest length whose cumulative weight reaches ``fraction`` of the whole."""
    total = sum(w for _, w in points)
    cumulative = 0.0
    for x, w in points:
        cumulative += w
        if cumulative >= fraction * total * (1 - 1e-12):
            return x
    return points[-1][0]


def _parts(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The long lengths cut at their weighted quantiles (1/3, 2/3); empty parts dropped."""
    if not points:
        return []
    cuts = [_quantile(points, i / MOST_LEVELS) for i in range(1, MOST_LEVELS)]
    parts: list[list[tuple[float, float]]] = [[] for _ in range(MOST_LEVELS)]
    for x, w in points:
        parts[sum(x > cut for cut in cuts)].append((x, w))
    return [p for p in parts if p]


def _median(points: Sequence[tuple[float, float]]) -> float:
    """The weighted median: where the cumulative weight passes half, or the midpoint of the two
    lengths either side of it where it lands on half exactly."""
    total = sum(w for _, w in points)
    cumulative = 0.0
    for i, (x, w) in enumerate(points):
        cumulative += w
        if math.isclose(cumulative, total / 2, rel_tol=1e-12) and i + 1 < len(points):
            return (x + points[i + 1][0]) / 2
        if cumulative > total / 2:
            return x
    return points[-1][0]
