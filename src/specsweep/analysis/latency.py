"""A latency target the recommendation keeps to: inter-token latency p99 within a limit.

A configuration's ITL p99 is measured per workload and level (measurement/levels.py). Candidates
the study never measured have none, so the rule rests on the step time: a longer draft makes
every verification step longer, and with it the gap between streamed chunks. Per drafter, k is
kept up to the longest draft measured within the limit and below the shortest measured over it;
speculation off is kept unless it was measured over it. Repeats of a configuration are averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specsweep.analysis.drafters import OFF, Candidate, Drafter, candidate_of
from specsweep.types import MeasuredConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyLimit:
    """Which candidates keep ITL p99 within ``limit_s`` for one workload at one concurrency."""

    limit_s: float
    longest: dict[Drafter, int] = field(default_factory=dict)  # per drafter, the longest k kept
    off_kept: bool = True
    over: tuple[str, ...] = ()  # measured configurations over the limit, as "k=3 probabilistic 95 ms"

    def allows(self, candidate: Candidate) -> bool:
        if candidate.off or candidate.drafter is None:
            return self.off_kept
        return candidate.num_speculative_tokens <= self.longest.get(candidate.drafter, 0)

    def describe(self) -> str:
        """What the limit keeps and what it leaves out, for the recommendation's reason."""
        kept = [f"{d.label} up to k={k}" for d, k in sorted(self.longest.items()) if k]
        kept += ["speculation off"] if self.off_kept else []
        over = f"; measured over it: {', '.join(self.over)}" if self.over else ""
        return f"ITL p99 <= {1000 * self.limit_s:g} ms keeps {', '.join(kept) or 'nothing measured'}{over}"


def itl_limit(configs: Sequence[MeasuredConfig], workload: str, concurrency: int, limit_s: float) -> LatencyLimit:
    """The candidates a target of ITL p99 <= ``limit_s`` keeps for ``workload`` at ``concurrency``."""
    measured: dict[Candidate, list[float]] = {}
    for config in configs:
        row = config.level(workload, concurrency)
        if config.feasible and row is not None and row.itl_p99_s is not None:
            measured.setdefault(candidate_of(config.spec, concurrency), []).append(row.itl_p99_s)
    mean = {candidate: sum(values) / len(values) for candidate, values in measured.items()}
    ordered = sorted(mean.items(), key=lambda item: (item[0].drafter is not None, item[0].num_speculative_tokens))
    over = [f"{c.label} {1000 * p99:.0f} ms" for c, p99 in ordered if p99 > limit_s]
    longest: dict[Drafter, int] = {}
    for drafter in {c.drafter for c in mean if c.drafter is not None}:
        within = [c.num_speculative_tokens for c, p99 in mean.items() if c.drafter == drafter and p99 <= limit_s]
        beyond = [c.num_speculative_tokens for c, p99 in mean.items() if c.drafter == drafter and p99 > limit_s]
        keep = max(within, default=0)
        longest[drafter] = min(keep, min(beyond, default=keep + 1) - 1)
    off = mean.get(OFF)
    return LatencyLimit(limit_s=limit_s, longest=longest, off_kept=off is None or off <= limit_s, over=tuple(over))
