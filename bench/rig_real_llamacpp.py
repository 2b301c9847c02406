"""Recommendations with no start on real llama-server (Gemma 3 270M) against an exhaustive sweep.

    source ~/.cache/specsweep/real-engines.env
    python bench/rig_real_llamacpp.py [--k-max 5] [--requests 5] [--max-tokens 128] [--running-k 4] [--folder DIR]

1. An exhaustive sweep: one real study, grid over speculation off and n-gram drafting
   (``--spec-type ngram-simple``, lookup 3) at k = 1..K, starting llama-server once per
   configuration, both bundled workloads (prose, technical) through /v1/completions at T = 0,
   concurrency 1.
2. Per workload W: a rig made from the sweep's levels of the *other* workload only
   (build_rig(..., workloads=[other])), then llama-server started at the running k and W
   measured once, with ``measure --rig``'s code path.
3. The recommended k against the sweep: its measured net tok/s over the best measured one.

Passes when every recommendation is within 3% of the sweep's best.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from kept import kept_folder
from specsweep.config import parse_study_config
from specsweep.rigs.file import check_server_against_rig, write_rig
from specsweep.rigs.stored import build_rig, recommend_for_measurement
from specsweep.runtime.identity import read_server_identity
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.tuning.stored import measured_configs
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.workload import load_workload

WORKLOADS = ("prose", "technical")
FIXED = {"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3}


def base_argv(server: str, target: str, *, context: int = 4096, threads: int = 2) -> list[str]:
    """llama-server's command line before its speculation flags: ``context`` its -c (its one slot
    holds it all), ``threads`` its -t."""
    return [server, "-m", target, "--host", "127.0.0.1", "--port", "{port}", "-c", str(context), "-t", str(threads),
            "-np", "1", "--metrics", "--no-webui"]  # fmt: skip


def spec_args(k: int) -> list[str]:
    if not k:
        return []
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", str(k)]


def sweep(folder: Path, args: argparse.Namespace):
    data = {
        "study": {"name": "llama-sweep", "sampler": "grid", "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": [*base_argv(args.server, args.target), "{spec_args}"]},
        "search": {"num_speculative_tokens": [1, args.k_max], "fixed": FIXED},
        "workloads": {w: 1.0 for w in WORKLOADS},
        "measure": {"concurrency": [1], "requests": args.requests, "warmup": 1, "max_tokens": args.max_tokens,
                    "temperature": 0.0},
    }  # fmt: skip
    config = parse_study_config(data)
    paths = study_paths(config, folder)
    outcome = StudyRunner(config, paths, resume=(paths.folder / "study.db").exists()).run()
    return config, paths, outcome.study


def parse_engine_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parser's arguments with the llama-server binary and target model every real-engine bench
    takes (from ~/.cache/specsweep/real-engines.env); no model is one line, not a traceback."""
    parser.add_argument("--server", default=os.environ.get("SPECSWEEP_LLAMA_SERVER", "llama-server"))
    parser.add_argument("--target", default=os.environ.get("SPECSWEEP_GEMMA_TARGET"))
    args = parser.parse_args()
    if not args.target:
        parser.error("no target model: source ~/.cache/specsweep/real-engines.env or pass --target")
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k-max", type=int, default=6)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--running-k", type=int, default=4, help="The k the 'running' server uses.")
    parser.add_argument("--folder", type=Path, help="Reuse (or keep) the sweep in this folder.")
    args = parse_engine_args(parser)
    folder = args.folder or kept_folder("rig-llama")
    started = time.monotonic()
    config, paths, study = sweep(folder, args)
    rates: dict[str, dict[int, float]] = {}
    for c in measured_configs(study):
        k = c.spec.num_speculative_tokens if c.spec is not None else 0
        for w in WORKLOADS:
            if (rate := c.rate(w, 1)) is not None:
                rates.setdefault(w, {})[k] = rate
    print(f"exhaustive sweep (llama-server, Gemma 3 270M Q4_K_M, ngram-simple n=3, {args.requests} x "
          f"{args.max_tokens} tokens, T=0, concurrency 1; {time.monotonic() - started:.0f} s):")  # fmt: skip
    for w in WORKLOADS:
        print(f"  {w:10s} " + "  ".join(f"k={k}: {r:.1f}" for k, r in sorted(rates[w].items())))
    worst = 1.0
    for workload in WORKLOADS:
        other = next(w for w in WORKLOADS if w != workload)
        rig = build_rig(study, paths.folder, server=config.server, workloads=[other])
        write_rig(folder / f"rig-{other}.json", rig)
        port = free_port()
        argv = [a.replace("{port}", str(port)) for a in base_argv(args.server, args.target)] + spec_args(args.running_k)
        with ServerProcess(argv, log_path=folder / f"running-{workload}.log") as server:
            url = f"http://127.0.0.1:{port}"
            server.wait_ready(url + "/health", timeout_s=120)
            identity = read_server_identity(url, "llama.cpp")
            check_server_against_rig(rig, identity, server_args=argv)
            settings = MeasureSettings(
                endpoint=url, engine="llama.cpp", api="completions", concurrency=(1,), requests=args.requests,
                warmup=1, max_tokens=args.max_tokens, temperature=0.0,
            )  # fmt: skip
            measurement = run_measure(settings, load_workload(workload))
        result = recommend_for_measurement(rig, measurement)
        rec = result.recommendations[0].recommendation
        chosen = rec.choice.num_speculative_tokens
        best_k = max(rates[workload], key=rates[workload].__getitem__)
        ratio = rates[workload][chosen] / rates[workload][best_k]
        worst = min(worst, ratio)
        print(f"\n{workload}: rig from {other} only; measured once at the running k={args.running_k} "
              f"(S = {', '.join(f'{p.per_position:.3f}' for p in result.fit.positions)})")  # fmt: skip
        print(f"  recommended k={chosen} ({rec.tokens_per_s:.1f} tok/s predicted, "
              f"{rec.tokens_per_s_low:.1f}-{rec.tokens_per_s_high:.1f}); sweep best k={best_k} "
              f"{rates[workload][best_k]:.1f} tok/s; the recommended k measured {rates[workload][chosen]:.1f} in the "
              f"sweep: {100 * ratio:.1f}% of the best" + ("  (tied with others)" if rec.tied else ""))  # fmt: skip
    print(f"\nworst: {100 * worst:.1f}% of the sweep's best (need >= 97%); {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
