"""Regret of what a study recommends and of what it pastes, against the emulator's truth.

    python bench/recommendation_accuracy.py [--seeds 5] [--profiles NAME|PATH,...] [--max-requests 12]
        [--variation 0.15] [--drift 0.05] [--noise off,on] [--levels 1,4] [--sampler model|grid]
        [--rescore FOLDER]

For every profile, seed and noise setting: a real study, as a user runs it (the model-guided
search; the emulator as a process started once per configuration and measured over HTTP), over
speculation off and k = 1..K with both draft methods, both bundled workloads at every level.
With the noise knob on, every emulator start draws a step-time factor (``--start-variation``,
relative sd) and drifts slowly (``--drift``), as real servers on this machine vary from run to
run (10 to 20%).

Regret of a pick in a cell (workload, concurrency) is 1 - truth(pick) / truth(best), the truth
from the emulator's model (compute_truth: the closed-loop rate of the same request shape, both
draft methods). Scored per cell: the recommendation, and the snippet (the spec config pasted,
read at that concurrency, per-batch-size table and draft method included). A cell whose pick
misses by more than 2% but whose recommendation names the truth's best among its tied leaders
is counted as "tied, best named"; so is a paste that runs one of the cell's leaders (the
recommendation or a configuration named tied with it) while the truth's best is among them
(where levels want different drafters and one spec config runs one drafter, the paste gives way
at some level; among candidates the study cannot tell apart, that is a tie too). Each scored pick
more than 2% off gets a ``miss:`` line naming its profile, noise, seed and cell, and the studies
with one are counted: at 15% start noise one seed's draws can mislead any study, so that count
over many seeds says more than the worst pick of a few. ``--sampler grid`` runs the same studies
as a grid (every configuration started once, the same analysis), the comparator at the same
noise and about as many starts as the search makes with the noise on. ``--rescore FOLDER`` runs
nothing: it scores the studies an earlier run kept in FOLDER (the same options name them), as
they are, with the analysis of the code at hand; a change to how picks and leaders are read is
measured on the same starts. The last line:

    worst regret (recommendation and snippet, every cell): X%; mean: Y%
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from emulator_studies import K_MAX, WORKLOADS, kept_study, run_study, score
from kept import kept_folder
from specsweep.emulator.profile import bundled_profile_names

MISS = 0.02  # a pick this much below the truth's best is a miss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=None, help="default: per profile")
    parser.add_argument("--max-requests", type=int, default=12, help="adaptive measurement's cap per level")
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()), help="names or profile TOML paths")
    parser.add_argument("--levels", default="1,4", help="concurrency levels, comma-separated")
    parser.add_argument("--noise", default="off,on", help="off, on, or off,on")
    parser.add_argument("--variation", type=float, default=0.15, help="with the noise on: --start-variation")
    parser.add_argument("--drift", type=float, default=0.05, help="with the noise on: --drift")
    parser.add_argument("--sampler", default="model", choices=("model", "grid"), help="the search, or a grid")
    parser.add_argument(
        "--rescore", type=Path, default=None, metavar="FOLDER",
        help="run nothing: score the studies an earlier run kept in FOLDER with this code's analysis",
    )  # fmt: skip
    args = parser.parse_args()
    levels = tuple(int(b) for b in args.levels.split(","))
    folder = args.rescore or kept_folder("recommend")
    started = time.monotonic()
    way = "model-guided search" if args.sampler == "model" else "grid"
    print(
        f"seeded emulator studies ({way}, k=1..{K_MAX}, greedy and probabilistic, adaptive measurement "
        f"up to {args.max_requests} x 600-token requests per level, levels {list(levels)}); noise on: start "
        f"variation {args.variation:.0%}, drift {args.drift:.0%}"
    )
    print(
        f"{'profile':24s} {'noise':5s} {'workload':9s} {'B':>3s} {'true best':>18s} {'picks (per seed)':>32s} "
        f"{'worst rec':>9s} {'worst paste':>11s} {'tied, best named':>16s}"
    )
    regrets: list[float] = []
    excused = 0
    misses: list[str] = []
    missed: set[tuple[str, str, int]] = set()  # (profile, noise, seed) of studies with a scored pick > 2% off
    studies: dict[str, int] = {}  # noise -> studies run
    for name in args.profiles.split(","):
        for noise in args.noise.split(","):
            extra = ("--start-variation", str(args.variation), "--drift", str(args.drift)) if noise == "on" else ()
            runs = []
            for seed in range(args.seeds):
                if args.rescore:  # a kept study, as it is, scored with this code's analysis
                    try:
                        study = kept_study(name, seed, folder, sampler=args.sampler, tag=noise)
                    except FileNotFoundError:
                        continue
                    starts, ties = len(study.trials), None  # the search's own words were not kept
                else:
                    outcome = run_study(
                        name, seed, folder, max_requests=args.max_requests, extra_args=extra, levels=levels,
                        time_scale=args.time_scale, tag=noise, sampler=args.sampler,
                    )  # fmt: skip
                    study, starts, ties = outcome.study, outcome.starts, bool(outcome.ties)
                runs.append((starts, ties, score(study, name, seed=seed, levels=levels)))
                studies[noise] = studies.get(noise, 0) + 1
            if not runs:
                continue
            for index, (workload, level) in enumerate((w, b) for w in WORKLOADS for b in levels):
                cells = [cells[index] for _, _, cells in runs]
                for seed, cell in enumerate(cells):
                    for what, regret, named in (
                        ("recommendation", cell.regret, cell.tied_best),
                        ("paste", cell.snippet_regret, cell.snippet_tied_best),
                    ):
                        if regret > MISS and named and noise == "on":
                            excused += 1  # the study said it could not tell its pick from the best
                        else:
                            regrets.append(regret)
                            if regret > MISS:
                                missed.add((name, noise, seed))
                                misses.append(
                                    f"miss: {Path(name).stem} noise {noise} seed {seed} {workload} at {level}: the "
                                    f"{what} is {100 * regret:.1f}% below the true best, {cell.best.short_label}"
                                )
                picks = " ".join(
                    c.pick.short_label.replace("probabilistic", "p").replace("greedy", "g") if c.pick else "-"
                    for c in cells
                )
                print(
                    f"{Path(name).stem:24s} {noise:5s} {workload:9s} {level:>3d} {cells[0].best.short_label:>18s} "
                    f"{picks:>32s} {100 * max(c.regret for c in cells):>8.1f}% "
                    f"{100 * max(c.snippet_regret for c in cells):>10.1f}% "
                    f"{sum(c.tied_best for c in cells):>13d}/{len(cells)}"
                )
            starts = [starts for starts, _, _ in runs]
            named = "not kept" if args.rescore else sum(bool(ties) for _, ties, _ in runs)
            print(
                f"  {Path(name).stem} noise {noise}: starts per study {statistics.median(starts):.0f} median, "
                f"{max(starts)} most; studies that named tied leaders: {named}"
            )
    for line in misses:  # scored picks more than 2% off: what to read in the kept studies
        print(line)
    for noise, runs_of in studies.items():
        off = sum(1 for _, n, _ in missed if n == noise)
        print(f"noise {noise}: {off} of {runs_of} studies with a scored pick more than {MISS:.0%} off")
    print(
        f"{len(regrets)} scored picks; {excused} misses with the noise on whose study named the true best among "
        f"its tied leaders; {time.monotonic() - started:.0f} s; studies kept in {folder} (bench/level_bias.py)"
    )
    print(
        f"worst regret (recommendation and snippet, every cell): {100 * max(regrets):.1f}%; "
        f"mean: {100 * statistics.fmean(regrets):.2f}%"
    )


if __name__ == "__main__":
    main()
