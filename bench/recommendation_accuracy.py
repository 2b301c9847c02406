"""Regret of what a study recommends and of what it pastes, against the emulator's truth.

    python bench/recommendation_accuracy.py [--seeds 5] [--profiles NAME|PATH,...] [--requests 12]
        [--variation 0.15] [--drift 0.05] [--noise off,on] [--levels 1,4]

For every profile, seed and noise setting: a real study, as a user runs it (the model-guided
search; the emulator as a process restarted per configuration and measured over HTTP), over
speculation off and k = 1..K with both draft methods, both bundled workloads at every level.
With the noise knob on, every emulator start draws a step-time factor (``--start-variation``,
relative sd) and drifts slowly (``--drift``), as real servers on this machine vary from run to
run (10 to 20%).

Regret of a pick in a cell (workload, concurrency) is 1 - truth(pick) / truth(best), the truth
from the emulator's model (compute_truth: the closed-loop rate of the same request shape, both
draft methods). Scored per cell: the recommendation, and the snippet (the spec config pasted,
read at that concurrency, per-batch-size table and draft method included). A cell whose pick
misses by more than 2% but whose recommendation names the truth's best among its tied leaders
is counted as "tied, best named". The last line:

    worst regret (recommendation and snippet, every cell): X%; mean: Y%
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from specsweep.analysis.drafters import Candidate, candidate_of
from specsweep.config import EmulatorServer, MeasureConfig, Objective, SearchSpace, ServerConfig, StudyConfig
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import bundled_profile_names, load_profile
from specsweep.engines.vllm import METHODS_NEEDING_MODEL, validate_speculative_config
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

WORKLOADS = ("prose", "technical")
LEVELS = (1, 4)
METHODS = ("greedy", "probabilistic")
K_MAX = 5
# The emulator keeps its schedule while a modelled step lasts at least about half a millisecond
# of wall time: the DGX rig's 40-200 ms steps allow 100x, the others' 10-15 ms ones 20x.
TIME_SCALE = {"dgx-spark-v4-flash": 100.0}
MISS = 0.02  # a pick this much below the truth's best is a miss


def fixed_fields(method: str) -> dict:
    """The spec fields every configuration of a profile's drafter carries (a head needs a model)."""
    return {"method": method, **({"model": "draft-head"} if method in METHODS_NEEDING_MODEL else {})}


def truth_rates(profile_name: str, levels) -> dict[tuple[str, int], dict[Candidate, float]]:
    """Every configuration's true rate per cell."""
    profile = load_profile(profile_name)
    prompts = {w: workload_prompt_tokens(w) for w in WORKLOADS}
    out: dict[tuple[str, int], dict[Candidate, float]] = {}
    configs = [None] + [
        validate_speculative_config(
            {**fixed_fields(profile.methods[0]), "num_speculative_tokens": k, "draft_sample_method": m}
        )
        for k in range(1, K_MAX + 1)
        for m in METHODS
    ]
    for config in configs:
        truth = compute_truth(profile, config, profile.reference_temperature, levels, prompt_tokens=prompts)
        for workload in WORKLOADS:
            for level in truth[workload].levels:
                out.setdefault((workload, level.concurrency), {})[candidate_of(config)] = level.output_tokens_per_s
    return out


def one_study(profile_name: str, seed: int, noisy: bool, folder: Path, args: argparse.Namespace) -> dict:
    profile = load_profile(profile_name)
    scale = args.time_scale or TIME_SCALE.get(profile.name, 20.0)
    extra = ["--startup-seconds", "5"]
    if noisy:
        extra += ["--start-variation", str(args.variation), "--drift", str(args.drift)]
    config = StudyConfig(
        name=f"{profile.name}-{seed}-{'noisy' if noisy else 'quiet'}",
        sampler="model",
        seed=seed,
        server=ServerConfig(
            engine="emulator", mode="emulator", ready_timeout_s=60.0, stop_grace_s=5.0,
            emulator=EmulatorServer(profile=profile_name, time_scale=scale, seed=seed, extra_args=tuple(extra)),
        ),
        search=SearchSpace(num_speculative_tokens=(1, K_MAX), draft_sample_method=METHODS,
                           fixed=fixed_fields(profile.methods[0])),
        workloads={w: 1.0 for w in WORKLOADS},
        measure=MeasureConfig(concurrency=args.levels, requests=args.requests, max_tokens=600,
                              temperature=profile.reference_temperature),
        objective=Objective(concurrency=min(args.levels)),
    )  # fmt: skip
    outcome = StudyRunner(config, study_paths(config, folder)).run()
    analysis = analyze_stored_study(outcome.study, seed=seed).analysis
    truth = truth_rates(profile_name, args.levels)
    cells = []
    for workload in WORKLOADS:
        plan = analysis.snippet(workload)
        for level in args.levels:
            rates = truth[(workload, level)]
            best = max(rates, key=rates.__getitem__)
            rec = analysis.recommendation(workload, level)
            pick = rec.choice if rec is not None else None
            pasted = candidate_of(plan.spec, level) if plan is not None else None
            cells.append(
                {
                    "cell": (workload, level),
                    "best": best,
                    "pick": pick,
                    "regret": 1.0 - rates.get(pick, 0.0) / rates[best] if pick is not None else 1.0,
                    "snippet_regret": 1.0 - rates.get(pasted, 0.0) / rates[best] if pasted is not None else 1.0,
                    "tied_best": rec is not None and best in rec.tied,
                }
            )
    return {"cells": cells, "restarts": outcome.restarts, "ties": outcome.ties}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=None, help="default: per profile (TIME_SCALE)")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()), help="names or profile TOML paths")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels, comma-separated")
    parser.add_argument("--noise", default="off,on", help="off, on, or off,on")
    parser.add_argument("--variation", type=float, default=0.15, help="with the noise on: --start-variation")
    parser.add_argument("--drift", type=float, default=0.05, help="with the noise on: --drift")
    args = parser.parse_args()
    args.levels = tuple(int(b) for b in args.levels.split(","))
    folder = Path(tempfile.mkdtemp(prefix="specsweep-recommend-"))
    started = time.monotonic()
    print(
        f"seeded emulator studies (model-guided search, k=1..{K_MAX}, greedy and probabilistic, {args.requests} x "
        f"600-token requests per level, levels {list(args.levels)}); noise on: start variation {args.variation:.0%}, "
        f"drift {args.drift:.0%}"
    )
    print(
        f"{'profile':24s} {'noise':5s} {'workload':9s} {'B':>3s} {'true best':>18s} {'picks (per seed)':>32s} "
        f"{'worst rec':>9s} {'worst paste':>11s} {'tied, best named':>16s}"
    )
    regrets: list[float] = []
    excused = 0
    for name in args.profiles.split(","):
        for noise in args.noise.split(","):
            runs = [one_study(name, seed, noise == "on", folder, args) for seed in range(args.seeds)]
            for index, (workload, level) in enumerate((w, b) for w in WORKLOADS for b in args.levels):
                cells = [run["cells"][index] for run in runs]
                for cell in cells:
                    for regret in (cell["regret"], cell["snippet_regret"]):
                        if regret > MISS and cell["tied_best"] and noise == "on":
                            excused += 1  # the study said it could not tell its pick from the best
                        else:
                            regrets.append(regret)
                picks = " ".join(c["pick"].short_label.replace("probabilistic", "p").replace("greedy", "g")
                                 if c["pick"] else "-" for c in cells)  # fmt: skip
                print(
                    f"{Path(name).stem:24s} {noise:5s} {workload:9s} {level:>3d} {cells[0]['best'].short_label:>18s} "
                    f"{picks:>32s} {100 * max(c['regret'] for c in cells):>8.1f}% "
                    f"{100 * max(c['snippet_regret'] for c in cells):>10.1f}% "
                    f"{sum(c['tied_best'] for c in cells):>13d}/{len(cells)}"
                )
            restarts = [run["restarts"] for run in runs]
            named = sum(bool(r["ties"]) for r in runs)
            print(
                f"  {Path(name).stem} noise {noise}: restarts per study {statistics.median(restarts):.0f} median, "
                f"{max(restarts)} most; studies that named tied leaders: {named}"
            )
    print(
        f"{len(regrets)} scored picks; {excused} misses with the noise on whose study named the true best among "
        f"its tied leaders; {time.monotonic() - started:.0f} s"
    )
    print(
        f"worst regret (recommendation and snippet, every cell): {100 * max(regrets):.1f}%; "
        f"mean: {100 * statistics.fmean(regrets):.2f}%"
    )


if __name__ == "__main__":
    main()
