"""The model-guided search against the grid on a real llama-server (Gemma 3 270M, n-gram drafting).

    source ~/.cache/specsweep/real-engines.env
    python bench/search_real_llamacpp.py [--max-requests 12] [--max-tokens 128] [--k 1,8] [--folder DIR]
        [--replay DIR [--tau-prior SD] [--start-prior SD]]

Two studies of one space, side by side in one run: speculation off and ``ngram-simple`` (lookup
3) at k in ``--k``, prose and technical through /v1/completions at T = 0, concurrency 1, both
with adaptive measurement capped at ``--max-requests``: ``grid`` starts every configuration once,
``search`` is the model-guided search (docs/search.md). An n-gram drafter drafts only where the
text matches, so its step time is not a line in k: the case where the model misfits and the
decisions must rest on what was measured.

Printed per way: server starts and wall minutes; per workload the paste at concurrency 1, its
rate as the grid measured it, the grid's best measured configuration and the grid's run-to-run
noise (analysis/noise.py: with one start of each configuration and no greedy/probabilistic pairs,
the engine's usual noise, never below its starts' own request spread). The last line:

    starts: search S, grid G; search's pastes within the grid's noise of the grid's best: P of 2

"Within the noise": the grid's measured rate of the search's paste is at least the grid's best
measured rate times (1 - 2 x noise); the grid measured each configuration once, so its own best
is partly luck.

``--replay FOLDER`` starts nothing: it replays the search's decisions over the model-guided study
an earlier run kept in FOLDER (``--folder``), one trial prefix at a time, with the code at hand,
printing after each prefix what the search would start next, what that start was expected to
buy and what it had to buy (shares of the cells' rate), then both kept studies' pastes against
the grid's best and noise as the code at hand reads them, then each level's error from its own
requests' spread beside the error the step model reads (paired on shared prompts); a change to
the model or the rule is measured on the same starts; ``--tau-prior`` and ``--start-prior`` replace
the step model's prior sd on a configuration's miss and on a start's effect (what-if). It reads
the llama-server's flags as a study does, so it needs the engines.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from kept import kept_folder, set_priors
from rig_real_llamacpp import FIXED, base_argv, parse_engine_args
from specsweep.analysis.drafters import candidate_of
from specsweep.analysis.throughput import fit_throughput_model, study_observations, study_start_sd
from specsweep.config import parse_study_config
from specsweep.engines.registry import engine_info
from specsweep.tuning.records import measured_configs, read_trials
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.strategy import decide_next
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

WORKLOADS = ("prose", "technical")


def study_data(name: str, sampler: str, args: argparse.Namespace) -> dict:
    start = [*base_argv(args.server, args.target), "{spec_args}"]
    return {
        "study": {"name": name, "sampler": sampler, "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": start},
        "search": {"num_speculative_tokens": args.k, "fixed": FIXED},
        "workloads": dict.fromkeys(WORKLOADS, 1.0),
        "measure": {"concurrency": [1], "warmup": 1, "max_tokens": args.max_tokens, "temperature": 0.0,
                    "max_requests": args.max_requests},
    }  # fmt: skip


def label(candidate) -> str:
    return "off" if candidate.off else f"k={candidate.num_speculative_tokens}"


def run_way(sampler: str, folder: Path, args: argparse.Namespace):
    config = parse_study_config(study_data(f"real-{sampler}", sampler, args))
    outcome = StudyRunner(config, study_paths(config, folder)).run()
    return outcome, analyze_stored_study(outcome.study).analysis


def replay(folder: Path, args: argparse.Namespace) -> None:
    """The search's decision after each prefix of the kept model-guided study's trials."""
    if not (folder / "real-model").is_dir():
        raise SystemExit(
            f"error: {folder} holds no real-model/ study: pass the folder --folder kept (the one holding "
            "real-grid/ and real-model/), not a study inside it."
        )
    config = parse_study_config(study_data("real-model", "model", args))
    runner = StudyRunner(config, study_paths(config, folder), resume=True, queue_initial=False)
    trials = read_trials(runner.study)
    print(f"{'after':>5s} {'measured':12s} {'next':10s} {'phase':22s} {'buys':>7s} {'price':>7s}  reason")
    for n in range(1, len(trials) + 1):
        decision = decide_next(trials[:n], runner.space, runner.settings)
        last = trials[n - 1]
        measured = label(candidate_of(last.measured_config().spec, 1)) if last.measured else "-"
        chosen = decision.configuration
        nxt = "stop" if chosen is None else label(candidate_of(chosen.spec, 1)) + (" again" if decision.repeat else "")
        buys = f"{100 * decision.value.share:6.2f}%" if decision.value else ""
        price = f"{100 * decision.price_share:6.2f}%" if decision.price_share is not None else ""
        print(f"{n:5d} {measured:12s} {nxt:10s} {decision.phase.value:22s} {buys:>7s} {price:>7s}  {decision.reason}")
    # the kept studies' pastes and the grid's noise, read with the code at hand
    grid_config = parse_study_config(study_data("real-grid", "grid", args))
    grid = StudyRunner(grid_config, study_paths(grid_config, folder), resume=True, queue_initial=False).study
    analyses = {
        sampler: analyze_stored_study(study).analysis for sampler, study in (("grid", grid), ("model", runner.study))
    }
    within = verdict(measured_configs(grid), analyses)
    print(f"search's pastes within the grid's noise of the grid's best, read now: {within} of {len(WORKLOADS)}")
    # each level's error: from its own requests' spread, and as the step model reads it (paired)
    configs = {c.trial: c for c in measured_configs(runner.study)}
    print(f"\n{'workload':10s} {'trial':>5s} {'config':6s} {'tok/s':>6s} {'own error':>10s} {'model reads':>12s}")
    for workload in WORKLOADS:
        for o in study_observations(list(configs.values()), workload):
            own = configs[o.start].results[workload][o.concurrency].relative_se
            print(
                f"{workload:10s} {o.start:5d} {label(o.candidate):6s} {o.output_tokens_per_s:6.1f} "
                f"{100 * (own or 0):9.2f}% {100 * (o.relative_se or 0):11.2f}%"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-requests", type=int, default=12, help="adaptive measurement's cap per level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", default="1,8", help="the searched draft lengths, LOW,HIGH (lookup is 3)")
    parser.add_argument("--folder", type=Path, help="keep the studies here (default: a new temporary folder)")
    parser.add_argument(
        "--replay", type=Path, metavar="FOLDER", help="replay the kept search's decisions; start nothing"
    )
    parser.add_argument("--tau-prior", type=float, help="with --replay: tau's prior sd (what-if)")
    parser.add_argument("--start-prior", type=float, help="with --replay: the start effect's prior sd (what-if)")
    args = parse_engine_args(parser)
    args.k = [int(x) for x in args.k.split(",")]
    if args.replay:
        set_priors(tau=args.tau_prior, start=args.start_prior)
        replay(args.replay, args)
        return
    folder = args.folder or kept_folder("search-real")
    started = time.monotonic()
    print(
        f"real llama-server, Gemma 3 270M, ngram-simple lookup 3, k {args.k[0]}..{args.k[1]} and off; prose and "
        f"technical, 1 stream, {args.max_tokens}-token requests, adaptive up to {args.max_requests}; wall minutes"
    )
    ways = {sampler: run_way(sampler, folder, args) for sampler in ("grid", "model")}
    print(f"{'way':7s} {'starts':>6s} {'boot min':>9s} {'measure min':>12s}  stop")
    for sampler, (outcome, _) in ways.items():
        t = outcome.time
        print(f"{sampler:7s} {t.starts:6d} {t.boot_s / 60:9.1f} {t.measure_s / 60:12.1f}  {outcome.stop_reason}")
    grid_outcome = ways["grid"][0]
    within = verdict(measured_configs(grid_outcome.study), {sampler: a for sampler, (_, a) in ways.items()})
    print(f"\nstudies kept in {folder}; {(time.monotonic() - started) / 60:.1f} min")
    print(
        f"starts: search {ways['model'][0].time.starts}, grid {grid_outcome.time.starts}; "
        f"search's pastes within the grid's noise of the grid's best: {within} of {len(WORKLOADS)}"
    )


def verdict(grid_configs, analyses: dict) -> int:
    """Each way's paste per workload against the grid's best and the grid's noise as the step model
    reads them: each grid start's rate at a typical start's pace (its start's prefill lag taken out
    at the slope the grid's own model fitted, analysis/start_effect.py), beside the rate as measured.
    Prints the table; returns how many of the search's pastes are within, read both ways."""
    print(
        f"\n{'workload':10s} {'way':7s} {'paste':6s} {'grid typical':>13s} {'grid best':>14s} {'grid noise':>11s}"
        f" {'as measured':>12s} {'best':>10s}"
    )
    within = within_measured = 0
    noise_prior = engine_info("llama.cpp").noise
    shared = study_start_sd(grid_configs, WORKLOADS, noise_prior=noise_prior)
    for workload in WORKLOADS:
        measured = {candidate_of(c.spec, 1): r for c in grid_configs if (r := c.rate(workload, 1))}
        posterior = fit_throughput_model(
            study_observations(grid_configs, workload), noise_prior=noise_prior, shared_start=shared
        ).posterior
        starts = [o.start for o in posterior.observations]
        lags = {} if posterior.prefill is None else dict(zip(starts, posterior.prefill, strict=True))
        slope = posterior.prefill_slope or 0.0
        typical = {
            candidate_of(c.spec, 1): r * math.exp(slope * float(lags.get(c.trial, 0.0)))
            for c in grid_configs if (r := c.rate(workload, 1))
        }  # fmt: skip
        best, best_measured = max(typical, key=typical.__getitem__), max(measured, key=measured.__getitem__)
        noise = posterior.run_sd  # one start of a configuration: the start effect and the level's own error
        for sampler, analysis in analyses.items():
            plan = analysis.snippet(workload)
            paste = plan.choice_by_concurrency[1]
            ok = typical[paste] >= typical[best] * (1 - 2 * noise)
            ok_measured = measured[paste] >= measured[best_measured] * (1 - 2 * noise)
            within += ok and sampler == "model"
            within_measured += ok_measured and sampler == "model"
            print(
                f"{workload:10s} {sampler:7s} {label(paste):6s} {typical[paste]:13.1f} "
                f"{label(best) + f' {typical[best]:.1f}':>14s} {100 * noise:10.1f}% {measured[paste]:12.1f} "
                f"{label(best_measured) + f' {measured[best_measured]:.1f}':>10s}"
                + ("" if ok else "  outside the noise")
                + ("" if ok_measured else "  outside as measured")
            )
            for note in plan.notes:
                print(f"{'':19s}{note}")
    print(f"(prefill slope read: {slope:.2f}; as measured: {within_measured} of {len(WORKLOADS)} within)")
    return within


if __name__ == "__main__":
    main()
