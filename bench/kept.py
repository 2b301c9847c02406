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


def set_priors(*, tau: float | None = None, start: float | None = None) -> None:
    """What-if, for this run: the step model's prior sd on a configuration's miss (``tau``) and on a
    start's effect (``start``), every engine's and the one a fit with no engine named holds."""
    if tau is not None:
        for name in ("TAU_PRIOR", "TAU_PRIOR_WIDTHS_UNKNOWN"):
            setattr(step_model, name, dataclasses.replace(getattr(step_model, name), relative_sd=tau))
    if start is not None:
        step_model.START_PRIOR = dataclasses.replace(step_model.START_PRIOR, relative_sd=start)
    for name, engine in registry.ENGINES.items():
        noise = engine.noise
        if tau is not None:
            deviation = dataclasses.replace(noise.deviation or step_model.TAU_PRIOR, relative_sd=tau)
            noise = dataclasses.replace(noise, deviation=deviation)
        if start is not None:
            noise = dataclasses.replace(noise, start=dataclasses.replace(noise.start, relative_sd=start))
        registry.ENGINES[name] = dataclasses.replace(engine, noise=noise)
