"""Starts to the optimum: specsweep's model-guided search against optuna's GridSampler and TPESampler.

    python bench/sweep_efficiency.py [--seeds 10] [--noise 0.02] [--requests 32] [--profiles NAME,...]

Cases: every (profile, workload) of the 2 bundled emulator profiles and the 6 in bench/profiles/
(varied decay shapes, draft costs, max_num_seqs; two whose step time is not a line in k: CUDA
graphs captured at few widths, and a draft model with a fixed cost per drafting step), each at
its own objective concurrency, temperature the profile's reference one, draft lengths 1..8 with
both draft sampling methods and speculation off (17 distinct configurations), measured at
concurrency 1 and the objective's.

Truth: ``compute_truth`` (what ``specsweep emulate --print-truth`` prints) at the case's
temperature and concurrency, with the bundled workloads' prompt lengths. The true optimum is
the configuration with the highest true closed-loop output tok/s at the objective concurrency.

Simulated trial (so the whole table runs in a few minutes on 2 cores; the real emulator is
exercised by tests/test_search.py and the `specsweep study` run in docs/search.md): each
start's measured rate at each level is the truth times lognormal noise of relative sd
``--noise`` (default 2%), and its acceptance counters are drawn from the true curve, one
binomial per position (n_i ~ Binomial(n_(i-1), p_i)) from n_0 = requests * max_tokens / E(k)
drafts per level. The trial's user attributes have the same shape as a real study's, and a
configuration giving the same server as a measured one is reused without a start, as in
``specsweep study``.

Reach, precisely. A strategy's pick after r starts is the configuration it would recommend:
the feasible measured configuration with the highest measured objective.
- Grid search names its best after it has run every configuration (that is how grid search
  and ``vllm bench sweep serve`` are used: nothing tells them to stop earlier), so its
  starts are the grid's size. The last line is the median over runs of full grid /
  specsweep.
- Also shown, for optuna's GridSampler (random order) and TPESampler, "hindsight": the smallest
  r such that the pick after r and after every later start of the full run (the whole grid;
  TPE until every configuration was measured or 4x the grid's size of trials) is within 2% of
  the true optimum, as if an oracle stopped them at the right moment. It flatters them.
- For specsweep the count is the starts until its own stopping rule ends the search, and
  its final pick must be within 2%; a run that stops on a worse pick is a miss and is charged
  the grid's full size.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from specsweep.config import SearchSpace
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import Profile, load_profile
from specsweep.engines.registry import ENGINES
from specsweep.engines.vllm import validate_speculative_config
from specsweep.measurement.acceptance import expected_tokens_per_step
from specsweep.tuning.records import (
    TrialTimes,
    decision_attrs,
    read_trials,
    record_config,
    record_results,
    record_times,
)
from specsweep.tuning.space import Space, build_space
from specsweep.tuning.strategy import decide_next
from specsweep.types import CapturedWidths, LevelFigures, StudySettings

optuna.logging.set_verbosity(optuna.logging.WARNING)
HERE = Path(__file__).parent
K_MAX = 8
MAX_TOKENS = 600
WITHIN = 0.02

# (profile, objective concurrency): bundled ones by name, the others from bench/profiles/.
PROFILES = [
    ("dgx-spark-v4-flash", 1),
    ("l40s-llama-8b-eagle3", 8),
    (str(HERE / "profiles" / "h100-qwen-mtp.toml"), 8),
    (str(HERE / "profiles" / "a100-draft-model.toml"), 1),
    (str(HERE / "profiles" / "h200x8-70b-eagle-batch.toml"), 16),
    (str(HERE / "profiles" / "rtx4090-eagle-cool.toml"), 4),
    # Step times that are not a line in k: the search was not built on these.
    (str(HERE / "profiles" / "l4-eagle3-graphs.toml"), 8),
    (str(HERE / "profiles" / "mi300x-draft-launch.toml"), 2),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    profile: Profile
    workload: str
    concurrency: int
    levels: tuple[int, ...]
    space: Space
    truth: dict[str, dict[int, float]]  # key -> level -> true tok/s
    curve: dict[str, list[float]]  # key -> true S_1..S_k
    params: dict[str, dict[str, Any]]  # key -> optuna parameters

    @property
    def best_rate(self) -> float:
        return max(t[self.concurrency] for t in self.truth.values())

    def good(self, key: str | None) -> bool:
        return key is not None and self.truth[key][self.concurrency] >= (1 - WITHIN) * self.best_rate


def build_case(profile: Profile, workload: str, concurrency: int) -> Case:
    temperature = profile.reference_temperature
    fixed = {"method": profile.methods[0]}
    if profile.methods[0] in ("eagle", "eagle3", "draft_model"):
        fixed["model"] = f"bench/{profile.methods[0]}-drafter"
    space = build_space(
        SearchSpace(num_speculative_tokens=(1, K_MAX), fixed=fixed),
        temperature=temperature,
        engine_has_draft_sample_method=True,
    )
    levels = tuple(sorted({1, concurrency}))
    prompts = {name: workload_prompt_tokens(name) for name in profile.classes}
    truth, curve, params = {}, {}, {}
    for configuration in space.configurations():
        spec, key, p = configuration.spec, configuration.key, dict(configuration.params)
        result = compute_truth(profile, spec, temperature, levels, max_tokens=MAX_TOKENS, prompt_tokens=prompts)
        truth[key] = {lv.concurrency: lv.output_tokens_per_s for lv in result[workload].levels}
        curve[key] = result[workload].per_position
        params[key] = p
    return Case(
        profile=profile,
        workload=workload,
        concurrency=concurrency,
        levels=levels,
        space=space,
        truth=truth,
        curve=curve,
        params=params,
    )


def simulate(
    case: Case, key: str, rng: np.random.Generator, *, noise: float, requests: int
) -> dict[str, dict[int, LevelFigures]]:
    """One start's ``results`` attribute: noisy rates and binomially drawn acceptance counters."""
    curve = case.curve[key]
    levels = {}
    for level in case.levels:
        rate = case.truth[key][level] * math.exp(noise * rng.standard_normal() - noise**2 / 2)
        row: dict[str, Any] = {"output_tokens_per_s": rate, "errors": 0, "requests": requests}
        if curve:
            drafts = int(requests * MAX_TOKENS / expected_tokens_per_step(curve))
            counts, reached, previous = [], drafts, 1.0
            for s in curve:
                reached = int(rng.binomial(reached, min(s / previous, 1.0) if previous > 0 else 0.0))
                counts.append(reached)
                previous = s
            row.update(
                num_drafts=drafts,
                accepted_per_position=counts,
                mean_acceptance_length=1.0 + sum(counts) / drafts,
            )
        levels[level] = LevelFigures(
            concurrency=level,
            output_tokens_per_s=row["output_tokens_per_s"],
            whole_level_output_tokens_per_s=row["output_tokens_per_s"],
            decode_tokens_per_s_p50=None,
            ttft_p95_s=None,
            errors=0,
            requests=requests,
            num_drafts=row.get("num_drafts"),
            accepted_per_position=tuple(row["accepted_per_position"]) if "accepted_per_position" in row else None,
            mean_acceptance_length=row.get("mean_acceptance_length"),
        )
    return {case.workload: levels}


def measure_into(study: optuna.Study, trial: optuna.Trial, case: Case, key: str, rng, args) -> float:
    results = simulate(case, key, rng, noise=args.noise, requests=args.requests)
    value = results[case.workload][case.concurrency].output_tokens_per_s
    record_config(trial, case.space.configuration(trial.params))
    record_results(trial, results=results, constraints=[0.0], record_file=None)
    record_times(trial, start_times(case, results))
    study.tell(trial, value)
    return value


def start_times(case: Case, results: dict[str, dict[int, LevelFigures]]) -> TrialTimes:
    """What the simulated start cost, modelled: the profile's boot, and each level measured for as
    long as adaptive measurement's least (two requests at one stream, one per stream above) takes."""
    levels = results[case.workload].values()
    measure = sum(max(2, r.concurrency) * MAX_TOKENS / (r.output_tokens_per_s or 1.0) for r in levels)
    return TrialTimes(boot_s=case.profile.startup_s, measure_s=measure, modelled=True)


def run_specsweep(case: Case, seed: int, args) -> tuple[int, list[str]]:
    """Starts until specsweep's stopping rule fires, and its pick after each start."""
    rng = np.random.default_rng(seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
    grid = case.space.grid()
    settings = StudySettings(
        workload_weights={case.workload: 1.0},
        concurrency_levels=(case.concurrency,),
        objective_concurrency=case.concurrency,
        k_range=(1, K_MAX),
        baseline=None,
        noise_prior=ENGINES["emulator"].noise,
        # what the emulator serving this profile says it captured graphs for (its /version)
        captured_widths=CapturedWidths(every_k=case.profile.timing.captured_widths),
    )
    picks: list[str] = []
    while True:
        decision = decide_next(read_trials(study), case.space, settings)
        pick = (decision.picks or {}).get((case.workload, case.concurrency))
        if pick is not None:  # what the study would paste now, from the starts so far
            picks[-1:] = [key_of(case, pick)]
        if decision.configuration is None:
            break
        study.enqueue_trial(
            dict(decision.configuration.params), user_attrs=decision_attrs(decision.phase, repeat=decision.repeat)
        )
        trial = study.ask()
        params = {name: trial.suggest_categorical(name, values) for name, values in grid.items()}
        key = case.space.configuration(params).key
        measure_into(study, trial, case, key, rng, args)
        picks.append(None)
    return len(picks), picks


def key_of(case: Case, candidate) -> str:
    """The configuration key of a candidate of the case's space."""
    for key, params in case.params.items():
        k = int(params["num_speculative_tokens"])
        if candidate.off and k == 0:
            return key
        if (
            not candidate.off
            and k == candidate.num_speculative_tokens
            and (params.get("draft_sample_method") == candidate.drafter.draft_sample_method)
        ):
            return key
    raise KeyError(candidate)


def oracle_reach(case: Case, picks: list[str | None]) -> int | None:
    """Smallest r after which every pick is within 2% of the truth (None: never)."""
    reach = None
    for r in range(len(picks), 0, -1):
        if case.good(picks[r - 1]):
            reach = r
        else:
            break
    return reach


def run_grid(case: Case, seed: int, args) -> tuple[int | None, int]:
    rng = np.random.default_rng(seed + 10_000)
    keys = list(case.params)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.GridSampler({"config": keys}, seed=seed))
    picks: list[str] = []
    best: list[tuple[float, str]] = []

    def objective(trial: optuna.Trial) -> float:
        # GridSampler ends the study itself after the last grid point (Study.stop), so it runs under optimize.
        key = trial.suggest_categorical("config", keys)
        results = simulate(case, key, rng, noise=args.noise, requests=args.requests)
        value = results[case.workload][case.concurrency].output_tokens_per_s
        best.append(max([*best[-1:], (value, key)]))
        picks.append(best[-1][1])
        return value

    study.optimize(objective, n_trials=len(keys))
    return oracle_reach(case, picks), len(keys)


def run_tpe(case: Case, seed: int, args) -> tuple[int | None, int]:
    rng = np.random.default_rng(seed + 20_000)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    grid = case.space.grid()
    measured: dict[str, float] = {}
    picks = []
    for _ in range(4 * len(case.params)):
        if len(measured) == len(case.params):
            break
        trial = study.ask()
        params = {name: trial.suggest_categorical(name, values) for name, values in grid.items()}
        key = case.space.configuration(params).key
        if key in measured:  # the same server: reused, no start
            study.tell(trial, measured[key])
            continue
        measured.setdefault(key, []).append(measure_into(study, trial, case, key, rng, args))
        picks.append(max(measured, key=lambda k: statistics.fmean(measured[k])))  # repeats averaged
    return oracle_reach(case, picks), len(picks)


def describe(key: str | None) -> str:
    if key is None or key == "off":
        return "off"
    spec = validate_speculative_config(json.loads(key))
    return f"k={spec.num_speculative_tokens} {spec.draft_sample_method[:4]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    specsweep: int  # starts until its own stop (the full grid when its pick missed)
    missed: bool
    specsweep_hindsight: int  # starts until its pick was within 2% and stayed so
    grid: int  # hindsight reach of GridSampler (its full size when never)
    tpe: int
    seed: int = 0
    pick: str | None = None  # specsweep's final pick


def run_case(case: Case, seed: int, args) -> Run:
    starts, picks = run_specsweep(case, seed, args)
    missed = not picks or not case.good(picks[-1])
    g_reach, g_size = run_grid(case, seed, args)
    t_reach, t_total = run_tpe(case, seed, args)
    return Run(
        specsweep=len(case.params) if missed else starts,
        missed=missed,
        specsweep_hindsight=oracle_reach(case, picks) or len(case.params),
        grid=g_reach if g_reach is not None else g_size,
        tpe=t_reach if t_reach is not None else t_total,
        seed=seed,
        pick=picks[-1] if picks else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--noise", type=float, default=0.02, help="relative sd of one measured rate")
    parser.add_argument("--requests", type=int, default=32, help="requests per level (sets the drafts counted)")
    parser.add_argument("--profiles", default="", help="only cases whose profile name holds one of these (a,b,...)")
    args = parser.parse_args()
    wanted = [w for w in args.profiles.split(",") if w]
    profiles = [(n, c) for n, c in PROFILES if not wanted or any(w in Path(n).stem for w in wanted)]
    if not profiles:
        parser.error(f"no case's profile matches {args.profiles!r}")
    started = time.monotonic()
    print(
        f"simulated trials: truth x lognormal noise (sd {args.noise:.0%}), binomial acceptance counts from "
        f"{args.requests} requests x {MAX_TOKENS} tokens per level; {args.seeds} seeds per case; medians per case"
    )
    header = (
        f"{'profile':23s} {'workload':9s} {'B':>3s} {'true best':>9s} {'<2%':>3s} | "
        f"{'ss stop':>7s} {'miss':>4s} {'/method':>7s} {'ss hind':>7s} | {'grid':>4s} {'TPE':>4s} | "
        f"{'grid/ss':>7s} {'full/ss':>7s} {'TPE/ss':>6s}"
    )
    print(header)
    print("-" * len(header))
    runs: list[tuple[Case, Run]] = []
    for name, concurrency in profiles:
        profile = load_profile(name)
        for workload in ("prose", "technical"):
            case = build_case(profile, workload, concurrency)
            best_key = max(case.truth, key=lambda k: case.truth[k][concurrency])
            rows = [run_case(case, seed, args) for seed in range(args.seeds)]
            runs += [(case, r) for r in rows]
            ss = statistics.median(r.specsweep for r in rows)
            grid = statistics.median(r.grid for r in rows)
            print(
                f"{profile.name[:23]:23s} {workload:9s} {concurrency:3d} {describe(best_key):>9s} "
                f"{sum(case.good(k) for k in case.truth):3d} | {ss:7.1f} {sum(r.missed for r in rows):4d} "
                f"{ss / len(case.space.draft_sample_methods):7.1f} "
                f"{statistics.median(r.specsweep_hindsight for r in rows):7.1f} | "
                f"{grid:4.1f} {statistics.median(r.tpe for r in rows):4.1f} | "
                f"{statistics.median(r.grid / r.specsweep for r in rows):7.2f} "
                f"{statistics.median(len(case.params) / r.specsweep for r in rows):7.2f} "
                f"{statistics.median(r.tpe / r.specsweep for r in rows):6.2f}"
            )
    print("-" * len(header))
    for case, run in runs:
        if run.missed:
            best_key = max(case.truth, key=lambda k: case.truth[k][case.concurrency])
            regret = 1 - case.truth[run.pick][case.concurrency] / case.best_rate if run.pick else 1.0
            print(
                f"miss: {case.profile.name} {case.workload} seed {run.seed}: its pick {describe(run.pick)} is "
                f"{100 * regret:.1f}% below the true best, {describe(best_key)}"
            )
    all_runs = [r for _, r in runs]
    per_method = [r.specsweep / len(c.space.draft_sample_methods) for c, r in runs]
    print(
        f"{len(all_runs)} runs: specsweep median {statistics.median(r.specsweep for r in all_runs):.1f} starts "
        f"to its own stop ({statistics.median(per_method):.1f} per draft method; "
        f"{sum(r.missed for r in all_runs)} stopped on a pick more than 2% off and are charged the full grid), "
        f"{statistics.median(r.specsweep_hindsight for r in all_runs):.1f} in hindsight"
    )
    print(
        f"grid (GridSampler, hindsight) median {statistics.median(r.grid for r in all_runs):.1f}, full grid "
        f"{len(runs[0][0].params)}; TPE (hindsight) median {statistics.median(r.tpe for r in all_runs):.1f}; "
        f"median ratios: full grid/specsweep {statistics.median(len(c.params) / r.specsweep for c, r in runs):.2f}, "
        f"TPE/specsweep {statistics.median(r.tpe / r.specsweep for r in all_runs):.2f}; "
        f"{time.monotonic() - started:.0f} s"
    )
    print(f"GridSampler in hindsight/specsweep: {statistics.median(r.grid / r.specsweep for r in all_runs):.2f}")
    print(f"grid/specsweep start ratio: {statistics.median(len(c.params) / r.specsweep for c, r in runs):.2f}")


if __name__ == "__main__":
    main()
