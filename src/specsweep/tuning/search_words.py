"""What the search says of its decisions, in the words the console prints: what a start is
expected to buy, and the leaders of each cell (within the tolerance, or rivals that could be
faster). The decisions themselves: tuning/strategy.py; the numbers: analysis/value.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specsweep.analysis.drafters import Candidate
from specsweep.analysis.value import (
    CellBelief,
    StartValue,
    cell_loss,
    could_be_faster,
    leader_confidence,
    within_tolerance,
)
from specsweep.tuning.budget import minutes


def buy(value: StartValue) -> str:
    """ "0.41 tok/s (prose at 1 +0.83%, prose at 4 +0.03%)": in tok/s, and per cell as a share of its rate."""
    where = ", ".join(f"{w} at {b} +{100 * share:.2f}%" for w, b, _, share in value.by_cell[:3])
    more = f" and {len(value.by_cell) - 3} more" if len(value.by_cell) > 3 else ""
    return f"{value.tokens_per_s:.2f} tok/s ({where or 'nothing'}{more})"


def buy_reason(value: StartValue, again: bool, cost_s: float | None, modelled: bool) -> str:
    """ "k=2 probabilistic: expected to buy 1.20 tok/s (technical at 4 +1.71%) for about 6.1 min"."""
    what = f"{value.candidate.short_label}{' again' if again else ''}"
    cost = f" for about {minutes(cost_s, modelled)}" if cost_s is not None else ""
    return f"{what}: expected to buy {buy(value)}{cost}"


def chance(p: float) -> str:
    """A probability in words a user reads at a glance: whole percent, and never "0%" for a chance that exists."""
    return "<1%" if 0 < p < 0.005 else f"{100 * p:.0f}%"


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaders:
    """What a stop says of one cell's leaders: ``short`` fits the console's one line, ``line`` says
    it in full (how far at the 95% upper end, how likely, what a start of it would buy)."""

    short: str
    line: str

    def __str__(self) -> str:
        return self.line


def ties(cells: Sequence[CellBelief], tolerance: float, values: Mapping[Candidate, StartValue]) -> tuple[Leaders, ...]:
    """Per cell: measured rivals no more than the tolerance apart from the pick (either is fine),
    and rivals that could be more than the tolerance faster, with what a start of each would buy;
    each at the confidence that holds over every cell at once (value.leader_confidence)."""
    confidence = leader_confidence(len(cells))
    out = []
    for cell in cells:
        pick = cell_loss(cell, tolerance).pick
        if pick is None:
            continue
        where = f"{cell.workload} at concurrency {cell.concurrency}"
        short_where = f"{cell.workload} at {cell.concurrency}"
        rivals = within_tolerance(cell, pick, tolerance, confidence)
        if rivals:
            names = ", ".join(c.short_label for c in rivals)
            said = f"{pick.short_label} and {names} are within {100 * tolerance:g}% of each other: either is fine"
            short = f"{short_where}: {pick.short_label}, {names} within {100 * tolerance:g}%: either is fine"
            out.append(Leaders(short=short, line=f"{where}: {said}"))
        for rival in could_be_faster(cell, pick, tolerance, confidence)[:2]:
            value = values.get(rival.candidate)
            buys = f"; a start of it is expected to buy {100 * value.share:.2f}%" if value is not None else ""
            faster = (
                f"{rival.candidate.short_label} could be up to {100 * rival.most:.1f}% faster than {pick.short_label}"
            )
            likely = f"{chance(rival.chance)} likely to be more than {100 * tolerance:g}% faster"
            out.append(
                Leaders(
                    short=f"{short_where}: {rival.candidate.short_label} up to {100 * rival.most:.1f}% faster "
                    f"({chance(rival.chance)} likely >{100 * tolerance:g}%)",
                    line=f"{where}: {faster} ({100 * confidence:.4g}% upper end; {likely}){buys}",
                )
            )
    return tuple(out)
