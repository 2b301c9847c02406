"""A level's error paired on the prompts it shares with other levels.

Every level of a workload sends the same prompts in the same order, so much of the spread of its
requests' rates is the prompts' own spread (a long answer decodes at another rate than a short
one, a repetitive text is looked up better), shared by every level that sent them. That part
moves every configuration together and cancels when two are compared; a level's error from its
requests' spread alone (measurement/stopping.estimate_rate) counts it as the level's own.

Here the levels of one cell group (one workload at one concurrency, one drafter) are fitted
together on the log scale, each request's value the level's effect plus its prompt's effect plus
an error: ``log v[l, p] = a[l] + b[p] + e``. The error's sd, pooled over the group (the residual
sum of squares over its degrees of freedom), over sqrt(n) is each level's relative standard
error, never below ``MIN_REQUEST_SD`` / sqrt(n) as the unpaired one. A prompt one level alone
sent, or a group with no degree of freedom left, says nothing of the error: a level that shares
no prompt keeps its own estimate (None here).

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from specsweep.measurement.stopping import MIN_REQUEST_SD

K = TypeVar("K", bound=Hashable)

MIN_DEGREES_OF_FREEDOM = 3  # fewer residual degrees of freedom estimate no sd worth pooling


def paired_relative_se(levels: Mapping[K, Sequence[tuple[str, float]]]) -> dict[K, float]:
    """Each level's relative se of its mean value, with the prompts' shared effects taken out.

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
    n = [sum(1 for level, _, _ in rows if level == i) for i in range(len(paired))]
    return {k: sd / math.sqrt(n[i]) for i, k in enumerate(paired)}
