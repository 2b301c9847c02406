"""Where a benchmark keeps the studies it ran, for a later ``--rescore``, ``--replay`` or
bench/level_bias.py to read: a new folder under the checkout's ``studies/bench/`` (git ignores
``studies/*/``), not a temporary directory, which a new machine does not have."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from specsweep.analysis import step_model
from specsweep.engines import registry

BENCH_STUDIES = Path(__file__).resolve().parents[1] / "studies" / "bench"


def kept_folder(name: str) -> Path:
    """A new, empty folder ``studies/bench/<name>-<random>`` for one run of a benchmark."""
    BENCH_STUDIES.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=BENCH_STUDIES))


def set_tau_prior(sd: float) -> None:
    """What-if: the step model's prior on a configuration's miss (tau) at ``sd`` for this run, every
    engine's and the one a fit with no engine named holds."""
    for name in ("TAU_PRIOR", "TAU_PRIOR_WIDTHS_UNKNOWN"):
        setattr(step_model, name, dataclasses.replace(getattr(step_model, name), relative_sd=sd))
    for name, engine in registry.ENGINES.items():
        deviation = dataclasses.replace(engine.noise.deviation or step_model.TAU_PRIOR, relative_sd=sd)
        noise = dataclasses.replace(engine.noise, deviation=deviation)
        registry.ENGINES[name] = dataclasses.replace(engine, noise=noise)
