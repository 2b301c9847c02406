"""How a stored study's draws sit against its fit, and what the one rule reads of them: per
workload and concurrency, each configuration's fitted step time against its draws' 5th, 50th and
95th percentiles, its predicted rate against the draws' mean and relative spread, and its expected
loss against each draw's best less the study's tolerance (analysis/value.py ``pick``: the paste is
the measured configuration with the least), with how often it is the draws' best; both over the
configurations the engine would run (a draft length it never drafts at, as the report, left out).

    python bench/draws_vs_fit.py FOLDER [--concurrency 1]

FOLDER is a study's folder (its study.db), for example one that bench/search_real_llamacpp.py
kept. The draws are the report's own (the stored study analysed as `specsweep report` does, with
its engine's priors). A fit whose own step times sit far from its draws' medians (docs/math.md:
parts clipped at zero one by one did so on a real llama-server's n-gram study) shows here, and
so does a paste whose rival has the higher mean but the wider spread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specsweep.analysis.drafters import candidate_of
from specsweep.analysis.value import losses
from specsweep.engines.registry import engine_info
from specsweep.tuning.records import measured_configs
from specsweep.tuning.stored import analyze_stored_study, load_stored_study, never_drafting
from specsweep.tuning.study_settings import read_study_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    study = load_stored_study(args.folder)
    configs = measured_configs(study)
    settings = read_study_settings(study, configs)
    analysis = analyze_stored_study(study, configs=configs, settings=settings).analysis
    idle = never_drafting(configs, engine_info(settings.engine).never_drafts, settings.k_max)
    print(f"{'workload':10s} {'configuration':22s} {'T fit ms':>9s} {'q05':>7s} {'median':>7s} {'q95':>7s}"
          f" {'R fit':>7s} {'R draws':>8s} {'sd':>6s} {'loss':>6s} {'best':>5s}  measured")  # fmt: skip
    for workload in settings.workloads:
        model, sample = analysis.models.get(workload), analysis.samples.get((workload, args.concurrency))
        if model is None or sample is None:
            continue
        steps = model.step_time_draws(
            list(sample.candidates), args.concurrency, draws=len(sample.draws), rng=np.random.default_rng(0)
        )
        # the rule reads only what the engine would run: a draft length it never drafts at is not one
        runs = [j for j, c in enumerate(sample.candidates) if c not in idle]
        loss = dict(zip(runs, losses(sample.draws[:, runs], settings.tolerance).mean(axis=0), strict=True))
        best = {j: float(np.mean(sample.draws[:, runs].argmax(axis=1) == i)) for i, j in enumerate(runs)}
        level = args.concurrency
        measured = {candidate_of(c.spec, level) for c in configs if c.feasible and c.rate(workload, level)}
        for j, candidate in enumerate(sample.candidates):
            q05, q50, q95 = 1000 * np.percentile(steps[:, j], [5, 50, 95])
            rates = sample.draws[:, j]
            spread = 100 * rates.std() / rates.mean()
            print(
                f"{workload:10s} {candidate.short_label:22s} {1000 * sample.step_time_s[j]:9.2f} {q05:7.2f} {q50:7.2f}"
                f" {q95:7.2f} {sample.tokens_per_s[j]:7.1f} {rates.mean():8.1f} {spread:5.1f}%"
                + (f" {loss[j]:6.2f} {best[j]:5.2f}" if j in loss else f" {'never drafts':>12s}")
                + f"  {'yes' if candidate in measured else ''}"
            )


if __name__ == "__main__":
    main()
