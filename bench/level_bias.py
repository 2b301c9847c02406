"""How far each measured level of stored emulator studies lies from the emulator's truth.

    python bench/level_bias.py FOLDER [--concurrency 4] [--profile NAME] [--tag off]

FOLDER holds studies that bench/recommendation_accuracy.py or bench/time_to_answer.py ran (each
prints where it keeps them); a study's profile is read from its folder name. Per study, every
level's measured rate (the one the fits take: all streams busy) against the closed-loop truth of
its configuration for the same request shape (bench/emulator_studies.truth_rates). Prints one
line per study and a summary: mean, range and how many levels lie within 2%.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from emulator_studies import truth_rates
from specsweep.analysis.drafters import Candidate
from specsweep.analysis.throughput import study_observations
from specsweep.emulator.profile import bundled_profile_names
from specsweep.tuning.stored import analyze_stored_study, load_stored_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--concurrency", type=int, default=None, help="only levels at this concurrency")
    parser.add_argument("--profile", default=None, help="only studies of this bundled profile")
    parser.add_argument("--tag", default=None, help="only studies whose name ends so (accuracy bench: off, on)")
    args = parser.parse_args()
    if not args.folder.is_dir():
        raise SystemExit(f"{args.folder} is not a folder: give the one a bench printed after 'studies kept in'")
    errors: list[float] = []
    for study in sorted(p for p in args.folder.iterdir() if (p / "study.db").exists()):
        profile = next((n for n in bundled_profile_names() if study.name.startswith(n)), None)
        if profile is None or (args.profile and profile != args.profile):
            continue
        if args.tag and not study.name.endswith(f"-{args.tag}"):
            continue
        configs = analyze_stored_study(load_stored_study(study)).configs
        truth = truth_rates(profile, (1, 4))
        mine = []
        for workload in ("prose", "technical"):
            for o in study_observations(configs, workload):
                if args.concurrency is not None and o.concurrency != args.concurrency:
                    continue
                true = truth.get((workload, o.concurrency), {}).get(
                    Candidate(drafter=o.drafter, num_speculative_tokens=o.num_speculative_tokens)
                )
                if true:
                    mine.append(o.output_tokens_per_s / true - 1.0)
        if mine:
            mean = 100 * statistics.fmean(mine)
            print(f"{study.name:48s} {len(mine):3d} levels, measured over true: mean {mean:+.1f}%, "
                  f"{100 * min(mine):+.1f}% to {100 * max(mine):+.1f}%")  # fmt: skip
            errors += mine
    if not errors:
        raise SystemExit(f"no stored emulator study with measured levels in {args.folder}")
    within = sum(abs(e) <= 0.02 for e in errors)
    print(f"{len(errors)} levels: measured over true mean {100 * statistics.fmean(errors):+.1f}%, "
          f"{100 * min(errors):+.1f}% to {100 * max(errors):+.1f}%; {within} within 2%")  # fmt: skip


if __name__ == "__main__":
    main()
