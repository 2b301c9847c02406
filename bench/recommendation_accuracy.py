"""Recommended draft length against the emulator's truth, over seeded studies per bundled profile.

    python bench/recommendation_accuracy.py [--seeds 10] [--profiles NAME,...] [--requests 12]
        [--workloads prose,technical] [--levels 1,4]

For every bundled emulator profile and seed: a real study (the emulator as a process, restarted
per configuration, measured over HTTP like any server) over speculation off and k = 1..K with
probabilistic drafting at the profile's reference temperature, both bundled workloads at
concurrency 1 and 4; then the study's analysis (acceptance fits, throughput model, tie rule) and
its recommended k per workload and concurrency, compared with the true best k from the
emulator's model (compute_truth, the closed-loop rate of the same request shape). Also: the
share of measured positions whose 95% interval holds the true S_i. Prints one table per
profile and the match counts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from specsweep.config import EmulatorServer, MeasureConfig, Objective, SearchSpace, ServerConfig, StudyConfig
from specsweep.emulator.model import acceptance_curve, compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import bundled_profile_names, load_profile
from specsweep.engines.vllm import METHODS_NEEDING_MODEL, validate_speculative_config
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

WORKLOADS = ("prose", "technical")
LEVELS = (1, 4)
K_MAX = {"dgx-spark-v4-flash": 5, "l40s-llama-8b-eagle3": 6}
# The emulator keeps its schedule while a modelled step lasts at least about half a millisecond
# of wall time: the L40S rig's 10-15 ms steps allow 20x, the DGX rig's 40-200 ms ones 100x.
TIME_SCALE = {"dgx-spark-v4-flash": 100.0, "l40s-llama-8b-eagle3": 20.0}


def fixed_fields(method: str) -> dict:
    """The spec fields every configuration of a profile's drafter carries (a head needs a model)."""
    return {"method": method, **({"model": "draft-head"} if method in METHODS_NEEDING_MODEL else {})}


def spec(method: str, k: int):
    return validate_speculative_config(
        {**fixed_fields(method), "num_speculative_tokens": k, "draft_sample_method": "probabilistic"}
    )


def true_best(
    profile_name: str, k_max: int, workloads=WORKLOADS, levels=LEVELS
) -> dict[tuple[str, int], tuple[int, dict[int, float]]]:
    profile = load_profile(profile_name)
    prompts = {w: workload_prompt_tokens(w) for w in workloads}
    rates: dict[tuple[str, int], dict[int, float]] = {}
    for k in range(0, k_max + 1):
        config = spec(profile.methods[0], k) if k else None
        truth = compute_truth(profile, config, profile.reference_temperature, levels, prompt_tokens=prompts)
        for workload in workloads:
            for level in truth[workload].levels:
                rates.setdefault((workload, level.concurrency), {})[k] = level.output_tokens_per_s
    return {key: (max(r, key=r.__getitem__), r) for key, r in rates.items()}


def one_study(profile_name: str, seed: int, folder: Path, args: argparse.Namespace) -> dict:
    profile = load_profile(profile_name)
    k_max = K_MAX.get(profile_name, 6)
    scale = args.time_scale or TIME_SCALE.get(profile_name, 20.0)
    config = StudyConfig(
        name=f"{profile_name}-{seed}",
        sampler="grid",
        seed=seed,
        server=ServerConfig(
            engine="emulator", mode="emulator", ready_timeout_s=60.0, stop_grace_s=5.0,
            emulator=EmulatorServer(profile=profile_name, time_scale=scale, seed=seed,
                                    extra_args=("--startup-seconds", "5")),
        ),
        search=SearchSpace(num_speculative_tokens=(1, k_max), draft_sample_method=("probabilistic",),
                           fixed=fixed_fields(profile.methods[0])),
        workloads={w: 1.0 for w in args.workloads},
        measure=MeasureConfig(concurrency=args.levels, requests=args.requests, max_tokens=600,
                              temperature=profile.reference_temperature),
        objective=Objective(concurrency=min(args.levels)),
    )  # fmt: skip
    runner = StudyRunner(config, study_paths(config, folder))
    outcome = runner.run()
    analysis = analyze_stored_study(outcome.study, seed=seed).analysis
    truth = true_best(profile_name, k_max, args.workloads, args.levels)
    rows = {}
    for workload in args.workloads:
        for level in args.levels:
            rec = analysis.recommendation(workload, level)
            best_k, rates = truth[(workload, level)]
            chosen = rec.choice.num_speculative_tokens if rec is not None else -1
            rows[(workload, level)] = {
                "chosen": chosen,
                "true": best_k,
                "loss": 1 - rates.get(chosen, 0.0) / rates[best_k],
                "tie": bool(rec and rec.tie_rule_applied),
            }
    covered = total = 0
    for entry in analysis.acceptance:
        true_curve = acceptance_curve(
            profile, entry.workload, spec(profile.methods[0], k_max), profile.reference_temperature
        )
        for position in entry.fit.positions:
            total += 1
            covered += position.per_position_low <= true_curve[position.position - 1] <= position.per_position_high
    return {"rows": rows, "covered": covered, "positions": total, "restarts": outcome.restarts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--time-scale", type=float, default=None, help="default: per profile (TIME_SCALE)")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="bundled workloads, comma-separated")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels, comma-separated")
    args = parser.parse_args()
    args.workloads = tuple(args.workloads.split(","))
    args.levels = tuple(int(b) for b in args.levels.split(","))
    folder = Path(tempfile.mkdtemp(prefix="specsweep-recommend-"))
    started = time.monotonic()
    print(f"seeded emulator studies: grid over off and k=1..K (probabilistic), {args.requests} x 600-token requests "
          f"per level, time scale {args.time_scale or 'per profile'}; recommended k vs the true best k")  # fmt: skip
    summary = []
    for name in args.profiles.split(","):
        results = [one_study(name, seed, folder, args) for seed in range(args.seeds)]
        print(f"\nprofile {name}")
        print(f"{'workload':>10} {'conc':>5} {'true k':>7} {'chosen k per seed':>28} {'match':>6} {'tie rule':>9} "
              f"{'worst loss':>11}")  # fmt: skip
        for workload in args.workloads:
            for level in args.levels:
                rows = [r["rows"][(workload, level)] for r in results]
                matches = sum(r["chosen"] == r["true"] for r in rows)
                chosen = " ".join(str(r["chosen"]) for r in rows)
                worst = max(r["loss"] for r in rows)
                summary.append((name, workload, level, matches, len(rows)))
                print(f"{workload:>10} {level:>5} {rows[0]['true']:>7} {chosen:>28} {matches:>3}/{len(rows):<2} "
                      f"{sum(r['tie'] for r in rows):>9} {100 * worst:>10.1f}%")  # fmt: skip
        covered = sum(r["covered"] for r in results)
        positions = sum(r["positions"] for r in results)
        print(f"true S_i inside the 95% Wilson interval: {covered}/{positions} ({100 * covered / positions:.1f}%)")
    worst = min(m / n for *_, m, n in summary)
    print(f"\nworst match rate over profiles, workloads and levels: {worst:.2f} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
