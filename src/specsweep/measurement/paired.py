"""A level's error paired on the prompts it shares with other levels.

Every level of a workload sends the same prompts in the same order, so much of the spread of its
requests' rates is the prompts' own spread (a long answer decodes at another rate than a short
one, a repetitive text is looked up better), shared by every level that sent them. That part
moves every configuration together and cancels when two are compared; a level's error from its
requests' spread alone (measurement/stopping.estimate_rate without other levels) counts it as
the level's own.

Here the levels of one cell group (one workload at one concurrency, one drafter) are fitted
together on the log scale, each request's value the level's effect plus its prompt's effect plus
an error: ``log v[l, p] = a[l] + b[p] + e``, with e of sd s (the residual sum of squares over its
degrees of freedom, pooled over the group) and the prompts' effects of variance s_b^2 (their
fitted spread less the share of s in it, never below 0). A level's value is the mean over the
prompts it sent, P of them, while the group's levels sent N prompts between them (those sent by
more than one level); what it is compared at is the group's mix. Its relative standard error is therefore

    se^2 = s^2 / P + s_b^2 (1 / P - 1 / N)

(the second part: the mix of the prompts it did not send, zero for a level that sent them all),
never below ``MIN_REQUEST_SD`` / sqrt(P) as the unpaired one. A prompt one level alone sent, or
a group with no degree of freedom left, says nothing of the error: a level that shares no prompt
keeps its own estimate (None here).

The step model's levels (analysis/throughput.py) and the live stopping rule
(measurement/stopping.py) both read their errors here.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)

MIN_REQUEST_SD = 0.02  # relative sd of one request's rate assumed at least (jitter, output lengths)
MIN_DEGREES_OF_FREEDOM = 3  # fewer residual degrees of freedom estimate no sd worth pooling

# One answered request of a level: its prompt id, its rate (tokens over latency) and its decode
# step time (None where its fields do not count its steps).
Request = tuple[str, float, float | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedError:
    """A level's paired relative standard errors: of its rate and of its decode step time."""

    rate: float
    step_time: float | None  # None: some request's step time is unknown, or too few to pair

    @property
    def level(self) -> float:
        """What the step model reads: the step time's, or the rate's where that is the smaller."""
        return self.rate if self.step_time is None else min(self.rate, self.step_time)


def paired_errors(levels: Mapping[K, Sequence[Request]]) -> dict[K, PairedError]:
    """Each level's paired errors, of its rate and of its step time (only where every request of
    every level paired counts its steps). Only levels that share a prompt with another are in it."""
    rate = paired_relative_se({k: [(p, r) for p, r, _ in rows] for k, rows in levels.items()})
    timed = {k: rows for k, rows in levels.items() if all(t is not None for _, _, t in rows)}
    step = paired_relative_se({k: [(p, t or 0.0) for p, _, t in rows] for k, rows in timed.items()})
    return {k: PairedError(rate=se, step_time=step.get(k)) for k, se in rate.items()}


def paired_relative_se(levels: Mapping[K, Sequence[tuple[str, float]]]) -> dict[K, float]:
    """Each level's relative se of its mean value at the group's mix of prompts, with the prompts'
    shared effects taken out (the module doc's se).

    ``levels``: level key -> its answered requests as (prompt id, value > 0). Only levels that
    share a prompt with another level are in the answer.
    """
    keys = [k for k, rows in levels.items() if any(v > 0 and math.isfinite(v) for _, v in rows)]
    counts: dict[str, set[K]] = {}
    for k in keys:
        for prompt, value in levels[k]:
            if value > 0 and math.isfinite(value):
                counts.setdefault(prompt, set()).add(k)
    shared = sorted(p for p, owners in counts.items() if len(owners) > 1)
    paired = [k for k in keys if any(k in counts[p] for p in shared)]
    if len(paired) < 2:
        return {}
    column = {p: j for j, p in enumerate(shared)}
    rows = [(i, column[p], math.log(v)) for i, k in enumerate(paired) for p, v in levels[k]
            if p in counts and len(counts[p]) > 1 and v > 0 and math.isfinite(v)]  # fmt: skip
    design = np.zeros((len(rows), len(paired) + len(shared)))
    for r, (level, shared_prompt, _) in enumerate(rows):
        design[r, level] = 1.0
        design[r, len(paired) + shared_prompt] = 1.0
    y = np.array([v for _, _, v in rows])
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    dof = len(rows) - int(rank)
    if dof < MIN_DEGREES_OF_FREEDOM:
        return {}
    sd = max(math.sqrt(float(np.sum((y - design @ coef) ** 2)) / dof), MIN_REQUEST_SD)
    # the prompts' effects, each fitted over the levels that sent it: their spread less s's part
    prompt_effects = coef[len(paired) :]
    sent_by = [sum(1 for _, p, _ in rows if p == j) for j in range(len(shared))]
    noise_share = sd**2 * float(np.mean([1.0 / m for m in sent_by]))
    prompt_var = max(float(np.var(prompt_effects, ddof=1)) - noise_share, 0.0) if len(shared) > 1 else 0.0
    group = len(shared)
    n = [sum(1 for level, _, _ in rows if level == i) for i in range(len(paired))]
    return {k: math.sqrt(sd**2 / n[i] + prompt_var * max(1.0 / n[i] - 1.0 / group, 0.0)) for i, k in enumerate(paired)}
