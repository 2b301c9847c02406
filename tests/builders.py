"""Emulator studies for tests: one builder instead of a study file written out in every test.

``emulator_study`` returns the parsed-TOML form of a small study on the built-in emulator (a fast
time scale, no startup wait, the dspark drafter); keyword arguments replace or extend its
tables. ``write_study`` writes one as a TOML file, for tests that run the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from specsweep.config import StudyConfig, parse_study_config


def emulator_study(
    name: str,
    *,
    seed: int = 0,
    time_scale: float = 200,
    startup_s: float | None = 0,
    extra_args: Sequence[str] = (),
    profile: str | None = None,
    k: tuple[int, int] = (1, 4),
    workloads: dict[str, float] | None = None,
    concurrency: Sequence[int] = (1,),
    requests: int | None = 2,
    max_tokens: int = 60,
    temperature: float = 0.0,
    **tables: dict[str, Any],
) -> dict[str, Any]:
    """A small emulator study as a study file's tables; ``tables`` merge into (or add) tables,
    e.g. ``study={"sampler": "grid"}``, ``search={"draft_sample_method": "probabilistic"}``."""
    data: dict[str, Any] = {
        "study": {"name": name, "max_consecutive_failures": 2},
        "server": {
            "engine": "emulator",
            "ready_timeout_s": 30,
            "stop_grace_s": 5,
            "emulator": {
                "time_scale": time_scale,
                "seed": seed,
                # None: the profile's own startup time
                "extra_args": [*(() if startup_s is None else ("--startup-seconds", str(startup_s))), *extra_args],
                **({"profile": profile} if profile else {}),
            },
        },
        "search": {"num_speculative_tokens": list(k), "fixed": {"method": "dspark"}},
        "workloads": dict(workloads or {"prose": 1.0}),
        "measure": {
            "concurrency": list(concurrency),
            **({"requests": requests} if requests is not None else {}),  # None: adaptive measurement
            "max_tokens": max_tokens,
            "temperature": temperature,
        },
    }
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    return data


def emulator_config(name: str, **options: Any) -> StudyConfig:
    """``emulator_study`` parsed, as the study loop takes it."""
    return parse_study_config(emulator_study(name, **options))


def write_study(path: Path, data: dict[str, Any]) -> Path:
    """Write a study's tables as a TOML study file."""
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path
