"""Time to the answer: server starts, measuring minutes and total minutes of real emulator studies, four ways.

    python bench/time_to_answer.py [--seeds 3] [--profiles NAME,...] [--budget 12]

Per bundled profile and seed, four studies of the same space (k = 1..5, both draft methods and
speculation off: 11 configurations), both bundled workloads at concurrency 1 and 4, 600-token
requests:

- fixed: the model-guided search measuring every level with ``--budget`` requests;
- search: the same search with adaptive measurement capped at ``--budget`` (the default study);
- grid: every configuration once, at the fixed budget;
- adaptive grid: every configuration once, with adaptive measurement (what a careful user would
  run without specsweep's search).

Times are modelled (the emulator's hardware): measuring is each trial's measuring wall time
times the time scale; total adds each server start at the profile's own startup time (240 s on
the DGX Spark profile), not the 5 s the studies boot with here. Regret is over every cell,
recommendation and paste (bench/emulator_studies.py), of the two search ways. The last line:

    starts ratio (grid/search): R1; time ratio (adaptive grid/search): R2; worst regret: X%; mean regret: Y%

R1 over the median starts of each profile's studies, R2 over total time summed over every study.
"""

from __future__ import annotations

import argparse
import statistics
import time

from emulator_studies import run_study, score
from kept import kept_folder
from specsweep.emulator.profile import bundled_profile_names, load_profile

WAYS = ("fixed", "search", "grid", "adaptive grid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()))
    parser.add_argument("--budget", type=int, default=12, help="requests per level: fixed, and adaptive's cap")
    args = parser.parse_args()
    folder = kept_folder("time")
    started = time.monotonic()
    print(f"real emulator studies; {args.seeds} seeds; {args.budget} x 600-token requests per level (fixed and grid), "
          f"adaptive up to {args.budget}; modelled minutes")  # fmt: skip
    print(f"{'profile':24s} {'way':9s} {'starts':>7s} {'measuring min':>14s} {'total min':>10s} {'worst regret':>13s}")
    measuring = dict.fromkeys(WAYS, 0.0)
    totals = dict.fromkeys(WAYS, 0.0)
    median_starts: dict[str, list[float]] = {way: [] for way in WAYS}
    searched: list[float] = []
    for name in args.profiles.split(","):
        boot = load_profile(name).startup_s
        for way in WAYS:
            starts, measure, regrets = [], [], []
            for seed in range(args.seeds):
                outcome = run_study(
                    name, seed, folder, sampler="grid" if "grid" in way else "model",
                    requests=args.budget if way in ("fixed", "grid") else None, max_requests=args.budget,
                    tag=way.replace(" ", "-"),
                )  # fmt: skip
                assert outcome.time is not None
                starts.append(outcome.time.starts)
                measure.append(outcome.time.measure_s)
                regrets += [r for c in score(outcome.study, name, seed=seed) for r in (c.regret, c.snippet_regret)]
            measuring[way] += sum(measure)
            if "grid" not in way:
                searched += regrets
            total = [(m + s * boot) / 60 for m, s in zip(measure, starts, strict=True)]
            totals[way] += sum(total)
            median_starts[way].append(statistics.median(starts))
            print(
                f"{name:24s} {way:9s} {statistics.median(starts):>7.0f} {statistics.median(measure) / 60:>14.1f} "
                f"{statistics.median(total):>10.1f} {100 * max(regrets):>12.1f}%"
            )
        print()
    print(f"medians per study; {time.monotonic() - started:.0f} s; studies kept in {folder} (bench/level_bias.py)")
    print(f"measuring time ratio (fixed/search): {measuring['fixed'] / measuring['search']:.2f}")
    starts_ratio = sum(median_starts["grid"]) / sum(median_starts["search"])
    time_ratio = totals["adaptive grid"] / totals["search"]
    print(
        f"starts ratio (grid/search): {starts_ratio:.2f}; time ratio (adaptive grid/search): {time_ratio:.2f}; "
        f"worst regret: {100 * max(searched):.1f}%; mean regret: {100 * statistics.fmean(searched):.2f}%"
    )


if __name__ == "__main__":
    main()
