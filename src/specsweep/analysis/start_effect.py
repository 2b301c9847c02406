"""What every level of one server start shares: how fast the start prefilled, and the study's
start spread and prefill slope fitted once over every workload (analysis/step_fit.py
``shared_start_sd``), which each workload's step model then holds.

A start's luck (the run-to-run noise, ``u_start`` in analysis/step_model.py) is partly the pace of
the machine it ran on, and its first token shows that pace: at one stream nothing queues before
a prefill, and where a server prefills the target alone and drafts nothing before the first token
(speculation off, a lookup drafter), no configuration changes what that token costs. The step
model reads each start's prefill lag as a covariate of its levels, with a slope beta estimated
from the data.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specsweep.analysis.step_model import StepObservation

# A start's step time against its prefill time, both logs: 1 where a start's luck is the machine's
# pace alone, which sets both; 0 where its prefill says nothing of it (a real llama-server on a
# shared 2-core VM: 0.67, correlation 0.91, bench/start_speed_real.py)
PREFILL_PRIOR_SD = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class StartPrefill:
    """How fast one start prefilled a workload at one stream (prompt tokens per second of time to
    first token), and which starts' first tokens cost the same: "" every start whose server
    prefills the target alone and drafts nothing before its first token (speculation off, a drafter
    that looks its drafts up), else its configuration's key (a draft model prefills too, and a
    server may draft k tokens before it sends the first). Among starts alike, a faster first token
    is a faster machine."""

    tokens_per_s: float
    alike: str = ""


def prefill_lags(observations: Sequence[StepObservation]) -> np.ndarray | None:
    """Per observation: how much slower its start prefilled than the typical start alike (the
    mean of those starts' log speeds less its own start's; 0 where not measured). None where no
    two starts alike were measured: nothing to compare."""
    speeds: dict[str, dict[int, float]] = {}
    for o in observations:
        if o.start_prefill is not None:
            speeds.setdefault(o.start_prefill.alike, {})[o.start] = math.log(o.start_prefill.tokens_per_s)
    typical = {model: float(np.mean(list(starts.values()))) for model, starts in speeds.items() if len(starts) > 1}
    if not typical:
        return None
    return np.array([
        typical[p.alike] - math.log(p.tokens_per_s) if p is not None and p.alike in typical else 0.0
        for p in (o.start_prefill for o in observations)
    ])  # fmt: skip


@dataclass(frozen=True, slots=True)
class SharedStart:
    """What a study's starts share across its workloads, fitted once over all of them: sigma_start
    and the degrees of freedom it is known on, and the prefill slope beta with its sd (None: no two
    starts' prefills to compare)."""

    sd: float
    df: float
    prefill_slope: float | None = None
    prefill_slope_sd: float | None = None


def prefill_prior(shared: SharedStart | None) -> tuple[float, float]:
    """beta's prior (mean, sd) in one workload's fit: as every workload's starts measured it where
    the study fitted it once, else centred on 0 (a prefill that says nothing of a start's luck)."""
    if shared is None or shared.prefill_slope is None:
        return 0.0, PREFILL_PRIOR_SD
    return shared.prefill_slope, shared.prefill_slope_sd or PREFILL_PRIOR_SD
