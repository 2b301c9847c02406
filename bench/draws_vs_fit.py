"""How a stored study's step-model draws sit against its fit: per workload and concurrency, each
configuration's fitted step time against its draws' 5th, 50th and 95th percentiles, and its
predicted rate against the draws' mean and relative spread.

    python bench/draws_vs_fit.py FOLDER [--concurrency 1] [--draws 2000]

FOLDER is a study's folder (its study.db), for example one that bench/search_real_llamacpp.py
kept. A fit whose own step times sit far from its draws' medians (docs/math.md: parts clipped at
zero one by one did so on a real llama-server's n-gram study) shows here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specsweep.analysis.rates import sample_rates
from specsweep.analysis.study import model_workload, study_k_max
from specsweep.tuning.records import measured_configs
from specsweep.tuning.stored import load_stored_study
from specsweep.tuning.study_settings import read_study_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    study = load_stored_study(args.folder)
    configs = measured_configs(study)
    settings = read_study_settings(study, configs)
    k_max = study_k_max(configs, settings.k_max)
    print(f"{'workload':10s} {'configuration':22s} {'T fit ms':>9s} {'q05':>7s} {'median':>7s} {'q95':>7s}"
          f" {'R fit':>7s} {'R draws':>8s} {'sd':>6s}")  # fmt: skip
    for workload in settings.workloads:
        model = model_workload(configs, workload, k_max=k_max, captured_widths=settings.captured_widths)
        if model.throughput is None:
            continue
        sample = sample_rates(model.throughput, model.fits, concurrency=args.concurrency, draws=args.draws, seed=0)
        steps = model.throughput.step_time_draws(
            list(sample.candidates), args.concurrency, draws=args.draws, rng=np.random.default_rng(0)
        )
        for j, candidate in enumerate(sample.candidates):
            q05, q50, q95 = 1000 * np.percentile(steps[:, j], [5, 50, 95])
            rates = sample.draws[:, j]
            spread = 100 * rates.std() / rates.mean()
            print(
                f"{workload:10s} {candidate.short_label:22s} {1000 * sample.step_time_s[j]:9.2f} {q05:7.2f} {q50:7.2f}"
                f" {q95:7.2f} {sample.tokens_per_s[j]:7.1f} {rates.mean():8.1f} {spread:5.1f}%"
            )


if __name__ == "__main__":
    main()
