"""Recommendations with no start for a second workload from a rig, against the emulator's truth.

    python bench/rig_transfer.py [--seeds 10] [--time-scale 100] [--requests 12] [--profiles a,b]

Per bundled profile and seed:
1. a real study on one workload (prose): the emulator as a process, started once per
   configuration, grid over speculation off and k = 1..K at the profile's reference temperature
   with probabilistic drafting, concurrency 1 and 4, 600-token requests; its rig file is written
   beside it (studies/NAME/rig.json);
2. one emulator started at the running k (the profile's "today" configuration, RUNNING_K) and
   measured once on the second workload (technical) with ``measure --rig``'s code path: no
   start;
3. the recommended k per concurrency level, against the true best k of the technical class
   (emulator.model.compute_truth, closed-loop output tok/s of the same request shape), and what
   a miss costs in truth.

Prints one table per profile and the match counts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kept import kept_folder
from specsweep.config import EmulatorServer, MeasureConfig, Objective, SearchSpace, ServerConfig, StudyConfig
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import bundled_profile_names, load_profile
from specsweep.engines.vllm import validate_speculative_config
from specsweep.rigs.file import RIG_FILE, check_server_against_rig, load_rig, write_rig
from specsweep.rigs.stored import build_rig, recommend_for_measurement
from specsweep.runtime.identity import read_server_identity
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.workload import load_workload

RIG_WORKLOAD, NEW_WORKLOAD = "prose", "technical"
LEVELS = (1, 4)
K_MAX = {"dgx-spark-v4-flash": 5, "l40s-llama-8b-eagle3": 8}
RUNNING_K = {"dgx-spark-v4-flash": 5, "l40s-llama-8b-eagle3": 4}  # what the user runs today
# The L40S rig's steps are 8 times shorter: at time scale 100 a 600-token request lasts 60 ms of
# wall clock and the client's own per-chunk time shows in the step times (3-10% per point).
TIME_SCALE = {"l40s-llama-8b-eagle3": 20.0}


def fixed_fields(method: str) -> dict:
    fixed = {"method": method}
    if method in ("eagle", "eagle3", "draft_model", "dflash"):
        fixed["model"] = f"bench/{method}-drafter"
    return fixed


def spec(method: str, k: int):
    return validate_speculative_config(
        {**fixed_fields(method), "num_speculative_tokens": k, "draft_sample_method": "probabilistic"}
    )


def true_rates(profile_name: str, k_max: int) -> dict[int, dict[int, float]]:
    """concurrency -> k -> true closed-loop output tok/s of the new workload."""
    profile = load_profile(profile_name)
    prompts = {NEW_WORKLOAD: workload_prompt_tokens(NEW_WORKLOAD)}
    rates: dict[int, dict[int, float]] = {}
    for k in range(0, k_max + 1):
        config = spec(profile.methods[0], k) if k else None
        truth = compute_truth(profile, config, profile.reference_temperature, LEVELS, prompt_tokens=prompts)
        for level in truth[NEW_WORKLOAD].levels:
            rates.setdefault(level.concurrency, {})[k] = level.output_tokens_per_s
    return rates


def rig_study(profile_name: str, seed: int, folder: Path, args: argparse.Namespace) -> Path:
    profile = load_profile(profile_name)
    config = StudyConfig(
        name=f"{profile_name}-{seed}",
        sampler="grid",
        seed=seed,
        server=ServerConfig(
            engine="emulator", mode="emulator", ready_timeout_s=60.0, stop_grace_s=5.0,
            emulator=EmulatorServer(profile=profile_name, time_scale=args.time_scale, seed=seed,
                                    extra_args=("--startup-seconds", "5")),
        ),
        search=SearchSpace(num_speculative_tokens=(1, K_MAX[profile_name]), draft_sample_method=("probabilistic",),
                           fixed=fixed_fields(profile.methods[0])),
        workloads={RIG_WORKLOAD: 1.0},
        measure=MeasureConfig(concurrency=LEVELS, requests=args.requests, max_tokens=600,
                              temperature=profile.reference_temperature),
        objective=Objective(concurrency=1),
    )  # fmt: skip
    paths = study_paths(config, folder)
    outcome = StudyRunner(config, paths).run()
    path = paths.folder / RIG_FILE
    write_rig(path, build_rig(outcome.study, paths.folder, server=config.server))
    return path


def measure_on_rig(profile_name: str, seed: int, rig_path: Path, folder: Path, args: argparse.Namespace):
    profile = load_profile(profile_name)
    running = spec(profile.methods[0], RUNNING_K[profile_name])
    port = free_port()
    argv = emulator_argv(port=port, speculative_config=running.to_json(), profile=profile_name,
                         time_scale=args.time_scale, seed=1000 + seed, extra=["--startup-seconds", "0"])  # fmt: skip
    rig = load_rig(rig_path)
    with ServerProcess(argv, log_path=folder / f"measure-{profile_name}-{seed}.log") as server:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready(url + "/health", timeout_s=60)
        identity = read_server_identity(url, "vllm")
        check_server_against_rig(rig, identity, server_args=None)
        settings = MeasureSettings(endpoint=url, engine="vllm", concurrency=LEVELS, requests=args.requests,
                                   max_tokens=600, temperature=profile.reference_temperature, seed=seed)  # fmt: skip
        measurement = run_measure(settings, load_workload(NEW_WORKLOAD))
    return recommend_for_measurement(rig, measurement, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--time-scale", type=float, help="Default: 100, or the profile's in TIME_SCALE.")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()))
    parser.add_argument("--json", type=Path, help="Also write every row here.")
    args = parser.parse_args()
    folder = kept_folder("rig")
    started = time.monotonic()
    scale = args.time_scale or "per profile"
    print(f"rig from a {RIG_WORKLOAD} study (grid off, k=1..K, {args.requests} x 600 tokens per level, time scale "
          f"{scale}); {NEW_WORKLOAD} measured once at the running k, no start", flush=True)  # fmt: skip
    rows_out = []
    worst = 1.0
    asked = args.time_scale
    for name in args.profiles.split(","):
        args = argparse.Namespace(**{**vars(args), "time_scale": asked or TIME_SCALE.get(name, 100.0)})
        truth = true_rates(name, K_MAX[name])
        per_level: dict[int, list[dict]] = {b: [] for b in LEVELS}
        for seed in range(args.seeds):
            rig_path = rig_study(name, seed, folder, args)
            result = measure_on_rig(name, seed, rig_path, folder, args)
            for item in result.recommendations:
                rec = item.recommendation
                rates = truth[rec.concurrency]
                best = max(rates, key=rates.__getitem__)
                chosen = rec.choice.num_speculative_tokens
                tied = {c.num_speculative_tokens for c in rec.tied}
                row = {"profile": name, "seed": seed, "concurrency": rec.concurrency, "chosen": chosen,
                       "tied_true": best in tied, "true": best, "tie": bool(tied),
                       "loss": 1 - rates[chosen] / rates[best], "gain_predicted": rec.gain_over_baseline.predicted
                       if rec.gain_over_baseline else None,
                       "gain_true": rates[chosen] / rates[RUNNING_K[name]] - 1}  # fmt: skip
                per_level[rec.concurrency].append(row)
                rows_out.append(row)
        print(f"\nprofile {name} (running k={RUNNING_K[name]}, time scale {args.time_scale:g})")
        print(f"{'conc':>5} {'true k':>7} {'chosen k per seed':>22} {'match':>6} {'tied':>9} {'tied misses':>11} "
              f"{'worst loss':>11} {'gain pred/true (seed 0)':>24}")  # fmt: skip
        for level, rows in per_level.items():
            matches = sum(r["chosen"] == r["true"] for r in rows)
            worst = min(worst, matches / len(rows))
            tie_misses = sum(r["chosen"] != r["true"] and r["tied_true"] for r in rows)  # the true k named as tied
            first = rows[0]
            gains = f"{100 * (first['gain_predicted'] or 0):+.1f}% / {100 * first['gain_true']:+.1f}%"
            print(f"{level:>5} {rows[0]['true']:>7} {' '.join(str(r['chosen']) for r in rows):>22} "
                  f"{matches:>3}/{len(rows):<2} {sum(r['tie'] for r in rows):>9} {tie_misses:>11} "
                  f"{100 * max(r['loss'] for r in rows):>10.1f}% {gains:>24}")  # fmt: skip
    print(f"\nworst match rate over profiles and levels: {worst:.2f} ({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=2) + "\n")


if __name__ == "__main__":
    main()
