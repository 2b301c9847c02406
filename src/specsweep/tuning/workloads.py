"""The workloads a study measures: each of its [workloads], then each at every context level.

A context level (``measure.context``) is a variant of a workload, named ``W@16k``
(``workload.context_variant_name``), measured in the same start after the plain workloads and
stored, weighed and reported as a workload of its own. Its weight in the objective is its own
share of its workload's weight (``measure.context_shares``, which ``--context-from`` fills from
the user's own traffic), or else ``measure.context_weight`` split evenly over the levels; the
plain workload keeps the rest (by default all of it: the variants are measured and reported,
and weigh 0).
"""

from __future__ import annotations

from specsweep.config import StudyConfig
from specsweep.context_prompts import context_variant
from specsweep.errors import ConfigError
from specsweep.workload import Workload, context_variant_name, load_workload


def study_workloads(config: StudyConfig) -> dict[str, float]:
    """Every workload the study measures -> its weight in the objective: the plain ones first, in
    the file's order, then each context level (shortest first) of each of them."""
    m = config.measure
    levels = m.context
    shares = m.context_shares or tuple(m.context_weight / len(levels) for _ in levels)
    taken = (sum(shares) if m.context_shares else m.context_weight) if levels else 0.0
    out = {name: weight * max(0.0, 1.0 - taken) for name, weight in config.workloads.items()}
    for level, share in zip(levels, shares, strict=True):
        for name, weight in config.workloads.items():
            variant = context_variant_name(name, level)
            if variant in out:
                raise ConfigError(
                    f"{config.source}: workload {variant!r} is also the name of {name} at context level {level:,} "
                    "(measure.context); rename it in [workloads]."
                )
            out[variant] = weight * share
    return out


def load_study_workloads(config: StudyConfig) -> dict[str, Workload]:
    """The prompts of every workload the study measures, by the name its results are kept under."""
    plain = {name: load_workload(name) for name in config.workloads}
    out = dict(plain)
    for level in config.measure.context:
        for name, workload in plain.items():
            out[context_variant_name(name, level)] = context_variant(workload, level)
    return out
