"""Emulator studies for tests: one builder instead of a study file written out in every test.

``emulator_study`` returns the parsed-TOML form of a small study on the built-in emulator (a fast
time scale, no startup wait, the dspark drafter); keyword arguments replace or extend its
tables. ``write_study`` writes one as a TOML file, for tests that run the command line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from specsweep.analysis.drafters import Candidate
from specsweep.analysis.recommendation import CandidateRate, Recommendation
from specsweep.config import StudyConfig, parse_study_config
from specsweep.report.snippets import HEREDOC_END


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


def measured_study(folder: Path, name: str, *, k: tuple[int, int]) -> Path:
    """A small emulator study run once in ``folder`` (2 requests of 30 tokens per level); its folder.
    At a time scale of 50 (steps of 1 to 4 ms of wall time) the emulator keeps its schedule on a
    loaded machine, so its picks are the model's: at 200 they came out speculation off at times."""
    write_study(folder / "s.toml", emulator_study(name, k=k, requests=2, max_tokens=30, time_scale=50))
    result = specsweep("study", "--config", "s.toml", cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    return folder / "studies" / name


def exact_rig(
    profile_name: str,
    method: str,
    *,
    k_max: int,
    levels: Sequence[int] = (1, 4),
    requests: int = 12,
    fields: dict[str, Any] | None = None,
):
    """A rig whose step times and request overheads are the emulator model's own (its truth for
    prose requests of 600 tokens), so a test of what watch recommends has only the counters'
    and gauges' sampling noise between it and the truth. ``fields``: other spec-config fields
    of the drafter (``model`` for eagle3)."""
    from specsweep.analysis.drafters import drafter_of
    from specsweep.emulator.model import compute_truth, step_time_s, workload_prompt_tokens
    from specsweep.emulator.profile import load_profile
    from specsweep.engines.vllm import validate_speculative_config
    from specsweep.rigs.model import LevelTiming, RequestShape, RigIdentity, fit_rig

    profile = load_profile(profile_name)
    first = {**(fields or {}), "method": method, "num_speculative_tokens": 1, "draft_sample_method": "probabilistic"}
    drafter = drafter_of(validate_speculative_config(first))
    temperature = profile.reference_temperature
    prompts = {name: workload_prompt_tokens(name) for name in profile.classes}
    out = []
    for concurrency in levels:
        for k in range(0, k_max + 1):
            asked = {
                **(fields or {}),
                "method": method,
                "num_speculative_tokens": k,
                "draft_sample_method": "probabilistic",
            }
            spec = validate_speculative_config(asked) if k else None
            truth = compute_truth(profile, spec, temperature, [concurrency], prompt_tokens=prompts)["prose"]
            per_step = 1.0 + sum(truth.per_position[:k]) if k else 1.0
            step = step_time_s(profile, spec, k, min(concurrency, profile.max_num_seqs))
            out.append(
                LevelTiming(
                    num_speculative_tokens=k, concurrency=concurrency, drafter=drafter if k else None,
                    output_tokens_per_s=truth.levels[0].output_tokens_per_s, tokens_per_step=per_step,
                    completion_tokens=600.0, decode_span_s=599.0 * step / per_step,
                    prompt_tokens=float(prompts["prose"]), requests=requests, workload="prose",
                )
            )  # fmt: skip
    identity = RigIdentity(
        engine="emulator", engine_version=profile.version, model=profile.served_model_name,
        server_args=("specsweep", "emulate", "--profile", profile_name),
    )  # fmt: skip
    prose = {"prompt_tokens": float(prompts["prose"]), "completion_tokens": 600.0}
    shape = RequestShape(api="chat", temperature=temperature, max_tokens=600, workloads={"prose": prose})
    return fit_rig(out, identity=identity, shape=shape)


def specsweep(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m specsweep ARGS`` in a child process, as a user runs it, its output captured;
    ``env`` adds to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "specsweep", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def picks_of(stdout: str) -> dict[tuple[str, int], str]:
    """The picks table `study` prints: (workload, concurrency) -> the pick's short label."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if re.match(r"\s*(concurrency|cell)\s+pick\s", line))
    workload = re.search(r"picks for (\S+) ", lines[head - 1])
    picks = {}
    for line in lines[head + 2 :]:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) < 3:  # the table ends (a blank line, or --verbose's reasons)
            break
        cell, pick = parts[:2]
        if workload is not None:
            picks[(workload.group(1), int(cell))] = pick
        else:
            name, level = cell.rsplit(" at ", 1)
            picks[(name, int(level))] = pick
    return picks


def run_sglang_paste(text: str, cwd: Path) -> list[str]:
    """Do what a user does with an SGLang paste, in ``cwd``: run its shell lines (the heredoc that
    writes an adaptive config) with bash, and give back its flags as the server's command line
    would take them."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("cat > ")]
    if starts:
        end = lines.index(HEREDOC_END, starts[0])
        subprocess.run(["bash", "-c", "\n".join(lines[starts[0] : end + 1])], cwd=cwd, check=True)
        lines = lines[: starts[0]] + lines[end + 1 :]
    return shlex.split("\n".join(lines), comments=True)


def recommendation_of(
    level: int,
    rates: Mapping[Candidate, float],
    *,
    workload: str = "w",
    measured: Mapping[Candidate, float | None] | None = None,
    choice: Candidate | None = None,
    tied: tuple[Candidate, ...] = (),
    band: float = 0.0,
) -> Recommendation:
    """One cell's recommendation whose predictions are ``rates``, each measured at ``measured``
    (default: as predicted; None: never measured), with a +-``band`` interval; its choice the
    fastest predicted unless ``choice`` names it."""
    seen = measured if measured is not None else rates
    rows = tuple(
        CandidateRate(
            candidate=c, tokens_per_s=r, tokens_per_s_low=(1 - band) * r, tokens_per_s_high=(1 + band) * r,
            shortfall_tokens_per_s=0.0, shortfall_low_tokens_per_s=0.0, shortfall_high_tokens_per_s=0.0,
            step_time_source="measured", measured_tokens_per_s=seen.get(c),
        )
        for c, r in rates.items()
    )  # fmt: skip
    pick = choice if choice is not None else max(rates, key=lambda c: rates[c])
    return Recommendation(
        workload=workload, concurrency=level, choice=pick, speculation_off=pick.off, tokens_per_s=rates[pick],
        tokens_per_s_low=rates[pick], tokens_per_s_high=rates[pick], measured_tokens_per_s=seen.get(pick), tied=tied,
        measured=True, gain_over_off=None, gain_over_baseline=None, reason="", candidates=rows, confidence=0.95,
        leader_confidence=0.95, draws=1, seed=0,
    )  # fmt: skip
