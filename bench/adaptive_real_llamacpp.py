"""Adaptive against fixed measurement on a real llama-server (Gemma 3 270M, n-gram drafting).

    source ~/.cache/specsweep/real-engines.env
    python bench/adaptive_real_llamacpp.py [--budget 12] [--max-tokens 128] [--k 3,8] [--folder DIR]

Two studies of one space, side by side in one run: speculation off and ``ngram-simple`` (lookup
3) at k in ``--k``, prose and technical through /v1/completions at T = 0, concurrency 1, the
model-guided search. ``fixed`` measures every level with ``--budget`` requests; ``adaptive``
stops each level by measurement/stopping.py's rules, capped at ``--budget``. Printed per way: server
starts, requests per level and why levels stopped, wall minutes booting and measuring, and the
recommendation per workload with its measured rate. The last line:

    measuring ratio (fixed/adaptive): R; same picks: P of 2

The emulator's version of this is bench/time_to_answer.py; on this 2-core machine a real
server's rates move from request to request with everything else the machine runs.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from kept import kept_folder
from rig_real_llamacpp import FIXED, base_argv, parse_engine_args
from specsweep.config import parse_study_config
from specsweep.tuning.records import read_trials
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.tuning.trial_files import read_trial_file

WORKLOADS = ("prose", "technical")


def study_data(name: str, args: argparse.Namespace, *, fixed: bool) -> dict:
    start = [*base_argv(args.server, args.target), "{spec_args}"]
    measure = {"concurrency": [1], "warmup": 1, "max_tokens": args.max_tokens, "temperature": 0.0}
    measure |= {"requests": args.budget} if fixed else {"max_requests": args.budget}
    return {
        "study": {"name": name, "sampler": "model", "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": start},
        "search": {"num_speculative_tokens": args.k, "fixed": FIXED},
        "workloads": dict.fromkeys(WORKLOADS, 1.0),
        "measure": measure,
    }  # fmt: skip


def label(choice) -> str:
    return "off" if choice.off else f"k={choice.num_speculative_tokens}"


def run_way(way: str, folder: Path, args: argparse.Namespace) -> dict:
    config = parse_study_config(study_data(f"real-{way}", args, fixed=way == "fixed"))
    paths = study_paths(config, folder)
    outcome = StudyRunner(config, paths).run()
    requests, reasons = [], collections.Counter()
    for trial in read_trials(outcome.study):
        stored = read_trial_file(paths.folder, trial)
        for measurement in (stored or {}).get("workloads", {}).values():
            for level in measurement["levels"]:
                requests.append(level["requests"])
                reasons[level.get("stopped_by") or "all sent"] += 1
    analysis = analyze_stored_study(outcome.study).analysis
    picks = {}
    for workload in WORKLOADS:
        rec = analysis.recommendation(workload, 1)
        picks[workload] = (label(rec.choice), rec.tokens_per_s, tuple(label(c) for c in rec.tied)) if rec else None
    assert outcome.time is not None
    return {"time": outcome.time, "requests": requests, "reasons": reasons, "picks": picks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=12, help="requests per level: fixed, and adaptive's cap")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", default="3,8", help="the searched draft lengths, LOW,HIGH (lookup is 3)")
    parser.add_argument("--folder", type=Path, help="keep the studies here (default: a new temporary folder)")
    args = parse_engine_args(parser)
    args.k = [int(x) for x in args.k.split(",")]
    folder = args.folder or kept_folder("adaptive-real")
    started = time.monotonic()
    print(f"real llama-server, Gemma 3 270M, ngram-simple lookup 3, k {args.k[0]}..{args.k[1]} and off; prose and "
          f"technical, 1 stream, {args.max_tokens}-token requests; budget {args.budget}; wall minutes")  # fmt: skip
    print(f"{'way':9s} {'starts':>6s} {'levels':>6s} {'requests/level':>15s} {'boot min':>9s} {'measure min':>12s}  "
          f"why levels stopped")  # fmt: skip
    results = {}
    for way in ("fixed", "adaptive"):
        r = results[way] = run_way(way, folder, args)
        t, n = r["time"], r["requests"]
        spread = f"{sum(n) / len(n):.1f} ({min(n)}-{max(n)})" if n else "-"
        reasons = ", ".join(f"{k} {v}" for k, v in r["reasons"].most_common())
        minutes = f"{t.boot_s / 60:9.1f} {t.measure_s / 60:12.1f}"
        print(f"{way:9s} {t.starts:6d} {len(n):6d} {spread:>15s} {minutes}  {reasons}")
    print()
    print(f"{'workload':10s} {'way':9s} {'pick':6s} {'tok/s':>7s}  tied with")
    for workload in WORKLOADS:
        for way, r in results.items():
            pick = r["picks"][workload]
            if pick is None:
                print(f"{workload:10s} {way:9s} none")
                continue
            print(f"{workload:10s} {way:9s} {pick[0]:6s} {pick[1]:7.1f}  {', '.join(pick[2]) or '-'}")
    same = sum(
        1
        for w in WORKLOADS
        if results["fixed"]["picks"][w] and results["adaptive"]["picks"][w]
        and results["fixed"]["picks"][w][0] == results["adaptive"]["picks"][w][0]
    )  # fmt: skip
    ratio = results["fixed"]["time"].measure_s / max(results["adaptive"]["time"].measure_s, 1e-9)
    print(f"\nstudies kept in {folder}; {(time.monotonic() - started) / 60:.1f} min")
    print(f"measuring ratio (fixed/adaptive): {ratio:.2f}; same picks: {same} of {len(WORKLOADS)}")


if __name__ == "__main__":
    main()
