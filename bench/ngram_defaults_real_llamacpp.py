"""llama.cpp's own n-gram defaults against the ones specsweep used to pass, on a real llama-server.

    source ~/.cache/specsweep/real-engines.env
    python bench/ngram_defaults_real_llamacpp.py [--requests 4] [--max-tokens 192] [--k 8,8] [--folder DIR]

Side by side in one run, Gemma 3 270M through /v1/completions at T = 0, one stream, prose and
technical:

- two studies of ``ngram-simple`` (the grid: speculation off and k in ``--k``, LOW..HIGH): ``old`` with the
  lookup size specsweep used to fill in from vLLM's default (``--spec-ngram-simple-size-n 5``),
  ``new`` with llama.cpp's own (no size flag: 12, common/common.h);
- ``ngram-mod`` at the largest k, measured on a server started with the flags specsweep used to
  pass (``--spec-ngram-mod-n-match 5``, no n_min: llama.cpp's 48, above k, drops every partial
  draft) and with today's paste (llama.cpp's n_match of 24, ``--spec-ngram-mod-n-min 0``).

Printed per way, configuration and workload: output tok/s (client side, wall clock), drafts,
drafted and accepted tokens (the server's per-request timings), the draft acceptance rate, the
mean acceptance length of the steps that drafted, and the output tokens per target step (output
tokens over output tokens less accepted ones): the speed-up speculation can give, which other
work on the machine does not move, where tok/s does; then each study's recommendation. An n-gram drafter drafts only
where the text repeats itself, so short requests may draft nothing at all: the defaults are long
enough for Gemma 3 270M at T = 0 to repeat.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kept import kept_folder
from rig_real_llamacpp import base_argv, parse_engine_args
from specsweep.config import parse_study_config
from specsweep.engines import llamacpp
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.tuning.records import read_trials
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.tuning.trial_files import read_trial_file
from specsweep.workload import load_workload

WORKLOADS = ("prose", "technical")
WAYS = {"old": {"prompt_lookup_min": 5, "prompt_lookup_max": 5}, "new": {}}


def study_data(way: str, args: argparse.Namespace) -> dict:
    return {
        "study": {"name": f"ngram-{way}", "sampler": "grid", "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": [*base_argv(args.server, args.target), "{spec_args}"]},
        "search": {"num_speculative_tokens": args.k, "fixed": {"method": "ngram", **WAYS[way]}},
        "workloads": dict.fromkeys(WORKLOADS, 1.0),
        "measure": {"concurrency": [1], "requests": args.requests, "warmup": 1, "max_tokens": args.max_tokens,
                    "temperature": 0.0},
    }  # fmt: skip


def row(rate: float | None, drafts: float | None, drafted: int, accepted: int, length, output: int) -> dict:
    return {
        "rate": rate,
        "drafts": drafts,
        "drafted": drafted,
        "accepted": accepted,
        "rate_accepted": accepted / drafted if drafted else None,
        "length": length,
        "per_step": output / (output - accepted) if output > accepted else None,
    }


def level_row(level: dict, rate: float | None) -> dict:
    client = level.get("client_acceptance") or {}
    acceptance = level.get("acceptance") or {}
    output = sum(r.get("completion_tokens") or 0 for r in level.get("records", []))
    return row(
        rate, acceptance.get("num_drafts"), client.get("drafted_tokens") or 0, client.get("accepted_tokens") or 0,
        acceptance.get("mean_acceptance_length"), output,
    )  # fmt: skip


def run_study(way: str, folder: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """Per configuration label and workload, the level's figures; and the study's picks."""
    config = parse_study_config(study_data(way, args))
    paths = study_paths(config, folder)
    outcome = StudyRunner(config, paths).run()
    rows: dict = {}
    for trial in read_trials(outcome.study):
        if trial.key is None or not trial.results:
            continue
        spec = trial.spec
        label = "off" if spec is None else f"k={spec.num_speculative_tokens}"
        stored = read_trial_file(paths.folder, trial) or {}
        for workload in WORKLOADS:
            level = stored.get("workloads", {}).get(workload, {}).get("levels", [{}])[0]
            figures = trial.results.get(workload, {}).get(1)
            rows[(label, workload)] = level_row(level, figures.output_tokens_per_s if figures else None)
    analysis = analyze_stored_study(outcome.study).analysis
    picks = {}
    for workload in WORKLOADS:
        rec = analysis.recommendation(workload, 1)
        picks[workload] = "-" if rec is None else f"{rec.choice.label}, {rec.tokens_per_s:.1f} tok/s predicted"
    return rows, picks


def measure_mod(way: str, k: int, folder: Path, args: argparse.Namespace) -> dict:
    """ngram-mod at k on a server started with the old flags or today's paste."""
    if way == "old":
        spec_args = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", str(k), "--spec-ngram-mod-n-match", "5"]
    else:
        spec = llamacpp.validate_spec_config({"method": "ngram", "spec_type": "ngram-mod", "num_speculative_tokens": k})
        spec_args = llamacpp.render_spec_args(spec)
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in base_argv(args.server, args.target)] + spec_args
    rows = {}
    with ServerProcess(argv, log_path=folder / f"mod-{way}.log") as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=120)
        for workload in WORKLOADS:
            settings = MeasureSettings(
                endpoint=f"http://127.0.0.1:{port}", api="completions", concurrency=(1,), requests=args.requests,
                warmup=1, max_tokens=args.max_tokens, temperature=0.0, extra_body=dict(llamacpp.EXTRA_BODY),
            )  # fmt: skip
            level = run_measure(settings, load_workload(workload)).levels[0]
            summary = level.summary
            client, acceptance = summary.client_acceptance, summary.acceptance
            rows[(" ".join(spec_args[2:]), workload)] = row(
                summary.output_tokens_per_s, acceptance.num_drafts if acceptance else None,
                (client.drafted_tokens or 0) if client else 0, (client.accepted_tokens or 0) if client else 0,
                acceptance.mean_acceptance_length if acceptance else None,
                sum(r.completion_tokens or 0 for r in level.records),
            )  # fmt: skip
    return rows


def print_rows(way: str, rows: dict) -> None:
    for (label, workload), r in sorted(rows.items()):
        rate = f"{r['rate']:7.1f}" if r["rate"] is not None else "      -"
        share = f"{100 * r['rate_accepted']:6.1f}%" if r["rate_accepted"] is not None else "      -"
        length = f"{r['length']:6.2f}" if r["length"] is not None else "     -"
        per_step = f"{r['per_step']:9.2f}" if r["per_step"] is not None else "        -"
        drafts = f"{r['drafts']:6.0f}" if r["drafts"] is not None else "     -"
        counts = f"{r['drafted']:8d} {r['accepted']:8d}"
        print(f"{way:4s} {label:44s} {workload:10s} {rate} {drafts} {counts} {share} {length} {per_step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="measured requests per level")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--k", default="8,8", help="the searched draft lengths, LOW,HIGH")
    parser.add_argument("--folder", type=Path, help="keep the studies here (default: a new temporary folder)")
    args = parse_engine_args(parser)
    args.k = [int(x) for x in args.k.split(",")]
    folder = args.folder or kept_folder("ngram-defaults")
    started = time.monotonic()
    print(f"real llama-server, Gemma 3 270M; prose and technical, 1 stream, {args.requests} requests of "
          f"{args.max_tokens} tokens per level, T = 0")  # fmt: skip
    header = f"{'way':4s} {'configuration':44s} {'workload':10s} {'tok/s':>7s} {'drafts':>6s} {'drafted':>8s} "
    print(header + f"{'accepted':>8s} {'share':>7s} {'length':>6s} {'tok/step':>9s}")
    picks = {}
    for way in WAYS:
        rows, picks[way] = run_study(way, folder, args)
        print_rows(way, {(f"ngram-simple {label}", w): r for (label, w), r in rows.items()})
    for way in WAYS:
        print_rows(way, measure_mod(way, args.k[1], folder, args))
    print()
    for way, by_workload in picks.items():
        for workload, pick in by_workload.items():
            print(f"{way} study's recommendation for {workload}: {pick}")
    print(f"\nstudies and logs kept in {folder}; {(time.monotonic() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
