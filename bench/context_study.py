"""A study over context levels against the same study at one: picks per cell and server starts.

    python bench/context_study.py [--seeds 3] [--profile dgx-spark-v4-flash] [--context 16384,65536]

Per seed, two real emulator studies (bench/emulator_studies.py: k = 1..5, both draft samplings
and speculation off, 11 configurations; prose and technical; concurrency 1 and 4; adaptive
measurement up to 12 requests per level; 600-token requests): one with the workloads as they
are, one that also measures each workload at every ``--context`` level in the same starts
(``measure.context``; the workload ``W`` at 16,384 tokens is ``W@16k``).

Truth: ``compute_truth`` at each cell's prompt length (the bundled workload's own, or the context
level), ranked by its decode rate ``B E(k) / T(k, B)`` at that context: what speculation
changes. (The closed-loop rate also pays each request's whole prefill, which a study's shared
prefix leaves to the server's prefix cache; it would dilute every difference.) Per cell
(workload at a context, concurrency): the truth's best, the study's recommendation and its
regret, ``1 - rate(pick) / rate(best)``.

The last line: the worst regret over every cell of every context study, the cells more than 1%
off, and the most starts a context study took beyond its one-context twin of the same seed.
"""

from __future__ import annotations

import argparse
import time

from emulator_studies import WORKLOADS, run_study, truth_rates
from kept import kept_folder
from specsweep.config import parse_context
from specsweep.emulator.model import workload_prompt_tokens
from specsweep.tuning.stored import analyze_stored_study
from specsweep.workload import context_variant_name

LEVELS = (1, 4)


def scored(outcome, profile: str, contexts: tuple[int, ...]) -> list[tuple[str, int, str, str, float]]:
    """(cell's workload name, concurrency, truth's best, pick, regret) of every cell of a study."""
    analysis = analyze_stored_study(outcome.study).analysis
    rows = []
    for tokens in (0, *contexts):
        prompts = {w: tokens or workload_prompt_tokens(w) for w in WORKLOADS}
        truth = truth_rates(profile, LEVELS, prompts=prompts, rate="decode_tokens_per_s")
        for workload in WORKLOADS:
            name = context_variant_name(workload, tokens) if tokens else workload
            for level in LEVELS:
                rates = truth[(workload, level)]
                best = max(rates, key=rates.__getitem__)
                rec = analysis.recommendation(name, level)
                if rec is None:
                    rows.append((name, level, best.short_label, "none", 1.0))
                    continue
                regret = 1.0 - rates.get(rec.choice, 0.0) / rates[best]
                rows.append((name, level, best.short_label, rec.choice.short_label, regret))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--profile", default="dgx-spark-v4-flash")
    parser.add_argument("--context", default="16384,65536", help="context levels in tokens, e.g. 16k,64k")
    args = parser.parse_args()
    contexts = parse_context(args.context)
    folder = kept_folder("context")
    started = time.monotonic()
    levels = ", ".join(f"{c:,}" for c in contexts)
    print(
        f"{args.profile}: {len(WORKLOADS)} workloads at concurrency {', '.join(map(str, LEVELS))}; context levels "
        f"{levels} tokens besides the workloads' own; regret by decode rate"
    )
    print(f"{'seed':>4s} {'cell':16s} {'B':>2s} {'truth best':>19s} {'pick':>19s} {'regret':>7s}")
    worst, off, extra = 0.0, 0, []
    for seed in range(args.seeds):
        plain = run_study(args.profile, seed, folder, tag="plain")
        wide = run_study(args.profile, seed, folder, tag="context", context=contexts)
        for name, level, best, pick, regret in scored(wide, args.profile, contexts):
            worst = max(worst, regret)
            off += regret > 0.01
            print(f"{seed:4d} {name:16s} {level:2d} {best:>19s} {pick:>19s} {100 * regret:6.1f}%")
        extra.append(wide.starts - plain.starts)
        print(f"{seed:4d} starts: {plain.starts} at one context, {wide.starts} with the context levels")
    print(
        f"worst regret {100 * worst:.1f}%; {off} cells more than 1% off; starts beyond one context: "
        f"at most {max(extra):+d} ({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
