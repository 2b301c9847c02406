"""Seeded emulator studies for the benchmarks, and their regret against the emulator's truth.

One place for what bench/recommendation_accuracy.py and bench/time_to_answer.py both run: a
real study (the emulator as a process started once per configuration and measured over HTTP) of a
profile's drafter over k = 1..5 with both draft methods and speculation off, both bundled
workloads, at concurrency 1 and 4, max_tokens 600, at the profile's reference temperature; and
the regret of each cell's recommendation and of the paste read at that cell:
1 - truth(pick) / truth(best), the truth from compute_truth (the closed-loop rate of the same
request shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from specsweep.analysis.drafters import Candidate, candidate_of
from specsweep.config import EmulatorServer, MeasureConfig, Objective, SearchSpace, ServerConfig, StudyConfig
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import load_profile
from specsweep.engines.vllm import METHODS_NEEDING_MODEL, validate_speculative_config
from specsweep.tuning.stored import analyze_stored_study, load_stored_study
from specsweep.tuning.study import StudyOutcome, StudyRunner
from specsweep.tuning.study_store import study_paths

WORKLOADS = ("prose", "technical")
LEVELS = (1, 4)
METHODS = ("greedy", "probabilistic")
K_MAX = 5
# The emulator keeps its schedule while a modelled step lasts at least about half a millisecond
# of wall time: the DGX rig's 40-200 ms steps allow 100x, the others' 10-15 ms ones 20x.
TIME_SCALE = {"dgx-spark-v4-flash": 100.0}


def fixed_fields(method: str) -> dict:
    """The spec fields every configuration of a profile's drafter carries (a head needs a model)."""
    return {"method": method, **({"model": "draft-head"} if method in METHODS_NEEDING_MODEL else {})}


def truth_rates(
    profile_name: str, levels=LEVELS, *, prompts: dict[str, int] | None = None, rate: str = "output_tokens_per_s"
) -> dict[tuple[str, int], dict[Candidate, float]]:
    """Every configuration's true rate per cell (``rate``: a LevelTruth field; ``prompts``: each
    workload's prompt tokens, by default the bundled workload's own)."""
    profile = load_profile(profile_name)
    prompts = prompts or {w: workload_prompt_tokens(w) for w in WORKLOADS}
    fixed = fixed_fields(profile.methods[0])
    configs = [None] + [
        validate_speculative_config({**fixed, "num_speculative_tokens": k, "draft_sample_method": m})
        for k in range(1, K_MAX + 1)
        for m in METHODS
    ]
    out: dict[tuple[str, int], dict[Candidate, float]] = {}
    for config in configs:
        truth = compute_truth(profile, config, profile.reference_temperature, levels, prompt_tokens=prompts)
        for workload in WORKLOADS:
            for level in truth[workload].levels:
                out.setdefault((workload, level.concurrency), {})[candidate_of(config)] = getattr(level, rate)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One cell of one study, scored against the truth."""

    workload: str
    concurrency: int
    best: Candidate
    pick: Candidate | None
    regret: float  # of the recommendation
    snippet_regret: float  # of the paste read at this concurrency
    tied_best: bool  # the recommendation names the truth's best among its tied leaders
    # the paste runs one of the leaders (the recommendation or one tied with it), the truth's best among them
    snippet_tied_best: bool = False


def run_study(
    profile_name: str,
    seed: int,
    folder: Path,
    *,
    sampler: str = "model",
    requests: int | None = None,
    max_requests: int = 12,
    extra_args: tuple[str, ...] = (),
    time_scale: float | None = None,
    levels: tuple[int, ...] = LEVELS,
    tag: str = "",
    context: tuple[int, ...] = (),
    workloads: tuple[str, ...] = WORKLOADS,
) -> StudyOutcome:
    """One seeded study; ``requests`` a fixed budget per level, else adaptive up to ``max_requests``;
    ``context``: the context levels each workload is measured at too (``measure.context``)."""
    profile = load_profile(profile_name)
    scale = time_scale or TIME_SCALE.get(profile.name, 20.0)
    config = StudyConfig(
        name=f"{profile.name}-{seed}-{sampler}-{tag or 'study'}",
        sampler=sampler,
        seed=seed,
        server=ServerConfig(
            engine="emulator", mode="emulator", ready_timeout_s=60.0, stop_grace_s=5.0,
            emulator=EmulatorServer(profile=profile_name, time_scale=scale, seed=seed,
                                    extra_args=("--startup-seconds", "5", *extra_args)),
        ),
        search=SearchSpace(num_speculative_tokens=(1, K_MAX), draft_sample_method=METHODS,
                           fixed=fixed_fields(profile.methods[0])),
        workloads=dict.fromkeys(workloads, 1.0),
        measure=MeasureConfig(concurrency=levels, requests=requests, max_requests=max_requests, max_tokens=600,
                              temperature=profile.reference_temperature, context=context),
        objective=Objective(concurrency=min(levels)),
    )  # fmt: skip
    return StudyRunner(config, study_paths(config, folder)).run()


def kept_study(profile_name: str, seed: int, folder: Path, *, sampler: str = "model", tag: str = "") -> optuna.Study:
    """The study ``run_study`` kept in ``folder`` for this profile, seed, sampler and tag, loaded as
    it is (nothing is run): its picks can be scored again with the analysis of the code at hand.
    Raises FileNotFoundError where there is none."""
    name = f"{load_profile(profile_name).name}-{seed}-{sampler}-{tag or 'study'}"
    if not (folder / name / "study.db").is_file():
        raise FileNotFoundError(f"no kept study {name} in {folder}")
    return load_stored_study(folder / name)


def score(study: optuna.Study, profile_name: str, *, seed: int = 0, levels: tuple[int, ...] = LEVELS) -> list[Cell]:
    """Every cell's regret, recommendation and paste."""
    analysis = analyze_stored_study(study, seed=seed).analysis
    truth = truth_rates(profile_name, levels)
    cells = []
    for workload in WORKLOADS:
        plan = analysis.snippet(workload)
        for level in levels:
            rates = truth[(workload, level)]
            best = max(rates, key=rates.__getitem__)
            rec = analysis.recommendation(workload, level)
            pick = rec.choice if rec is not None else None
            pasted = candidate_of(plan.spec, level) if plan is not None else None
            leaders = {rec.choice, *rec.tied} if rec is not None else set()
            cells.append(
                Cell(
                    workload=workload,
                    concurrency=level,
                    best=best,
                    pick=pick,
                    regret=1.0 - rates.get(pick, 0.0) / rates[best] if pick is not None else 1.0,
                    snippet_regret=1.0 - rates.get(pasted, 0.0) / rates[best] if pasted is not None else 1.0,
                    tied_best=rec is not None and best in rec.tied,
                    snippet_tied_best=best in leaders and pasted in leaders,
                )
            )
    return cells
