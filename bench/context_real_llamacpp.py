"""Whether the best draft length moves with context on a real llama-server (Gemma 3 270M, n-gram drafting).

    source ~/.cache/specsweep/real-engines.env
    python bench/context_real_llamacpp.py [--k 3,6] [--context 4k,16k] [--workloads technical]
                                          [--max-requests 4] [--max-tokens 64] [--ctx-size 32768]
                                          [--threads 1] [--folder DIR]

One study, grid sampler: speculation off and ``ngram-simple`` (lookup 3) at every k in ``--k``
(an inclusive range; ngram-simple drafts nothing shorter than its lookup, so k < 3 runs as
speculation off), the same drafter at every context; each workload through
/v1/completions at T = 0, concurrency 1, measured as it is (its own prompts, a few hundred
tokens) and again at each ``--context`` level (``measure.context``: ``W@4k``, ``W@16k``, long
prompts behind one shared prefix, docs/workloads.md#context-levels) in the same starts; adaptive
measurement capped at ``--max-requests`` per level. llama-server runs with ``-c --ctx-size`` (one
slot), so the longest level and its output fit; the levels are checked against it before any
start, as ``specsweep study`` checks them. The levels' requests ask
llama-server to keep its prompt cache (``cache_prompt``), so a level's shared prefix is prefilled
once per start, by its warm-up request.

Printed, read back from the stored study: server starts and wall minutes; per workload a table
with contexts as rows (each with its mean prompt tokens as the server counted them) and each
configuration's measured tok/s (client side, the study's own records) as columns, then per
context the measured best, the study's recommendation at one stream and its predicted rate; the
same table by decode rate (each level's median request's tokens per second after its first
token, without the prefill of its own prompt, which is long at 16k); the acceptance (accepted over
drafted tokens) at each k, and the time to first token of speculation off (p95: whether the
prefix cache held the shared prefix). The last line per workload, by the client-side rate:

    k* at 1 stream: plain K1, 4k K2, 16k K3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kept import kept_folder
from rig_real_llamacpp import FIXED, base_argv, parse_engine_args
from specsweep.cli.context_room import refuse_context_levels
from specsweep.cli.study import known_max_model_len
from specsweep.config import parse_context, parse_study_config
from specsweep.tuning.records import measured_configs
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.types import LevelFigures, MeasuredConfig
from specsweep.workload import context_variant_name


def study_data(args: argparse.Namespace) -> dict:
    start = [*base_argv(args.server, args.target, context=args.ctx_size, threads=args.threads), "{spec_args}"]
    return {
        "study": {"name": "real-context", "sampler": "grid", "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": start},
        "search": {"num_speculative_tokens": args.k, "fixed": FIXED},
        "workloads": dict.fromkeys(args.workloads, 1.0),
        "measure": {"concurrency": [1], "warmup": 1, "max_tokens": args.max_tokens, "temperature": 0.0,
                    "max_requests": args.max_requests, "context": list(args.context)},
    }  # fmt: skip


def k_of(config: MeasuredConfig) -> int:
    return config.spec.num_speculative_tokens if config.spec is not None else 0


def label(k: int) -> str:
    return f"k={k}" if k else "off"


def acceptance(level: LevelFigures | None) -> float | None:
    """Accepted over drafted tokens of a level, summed over its subcategories (llama.cpp's timings)."""
    if level is None or not level.by_subcategory:
        return None
    drafted = sum(s.get("drafted", 0.0) for s in level.by_subcategory.values())
    accepted = sum(s.get("accepted", 0.0) for s in level.by_subcategory.values())
    return accepted / drafted if drafted else None


def by_k(configs: list[MeasuredConfig], name: str) -> dict[int, list[LevelFigures]]:
    """Each draft length's measured levels of ``name`` at one stream (0: speculation off), by k."""
    out: dict[int, list[LevelFigures]] = {}
    for config in configs:
        level = config.level(name, 1)
        if level is not None and level.output_tokens_per_s is not None:
            out.setdefault(k_of(config), []).append(level)
    return dict(sorted(out.items()))


def mean_rate(levels: list[LevelFigures]) -> float:
    return sum(level.output_tokens_per_s or 0.0 for level in levels) / len(levels)


def report_workload(workload: str, contexts: tuple[int, ...], configs: list[MeasuredConfig], analysis) -> None:
    names = [workload, *(context_variant_name(workload, t) for t in contexts)]
    ks = sorted({k_of(c) for c in configs})
    print(f"\n{workload}: measured tok/s at 1 stream (client side; the mean where a configuration ran twice)")
    head = "".join(f"{label(k):>8s}" for k in ks)
    print(f"{'context':26s}{head}  {'best':>6s}  {'recommended (predicted)':>24s}")
    best_by_context = {}
    for name in names:
        served = [lv.prompt_tokens_mean for lvs in by_k(configs, name).values() for lv in lvs if lv.prompt_tokens_mean]
        tokens = sum(served) / len(served) if served else None  # as the server counted them
        row = f"{name} ({tokens:,.0f} tok)" if tokens is not None else name
        rates = {k: mean_rate(levels) for k, levels in by_k(configs, name).items()}
        best = max(rates, key=rates.__getitem__) if rates else None
        best_by_context[name] = best
        rec = analysis.recommendation(name, 1)
        pick = (
            f"{label(0 if rec.choice.off else rec.choice.num_speculative_tokens)} {rec.tokens_per_s:.1f}"
            if rec
            else "none"
        )
        cells = "".join(f"{rates[k]:8.1f}" if k in rates else f"{'-':>8s}" for k in ks)
        print(f"{row:26s}{cells}  {label(best) if best is not None else '-':>6s}  {pick:>24s}")
    print(f"{'decode tok/s, p50':26s}{head}  {'best':>6s}")  # after the first token: no prefill in it
    for name in names:
        decode = {
            k: sum(found) / len(found)
            for k, levels in by_k(configs, name).items()
            if (found := [lv.decode_tokens_per_s_p50 for lv in levels if lv.decode_tokens_per_s_p50])
        }
        best = max(decode, key=decode.__getitem__) if decode else None
        cells = "".join(f"{decode[k]:8.1f}" if k in decode else f"{'-':>8s}" for k in ks)
        print(f"{name:26s}{cells}  {label(best) if best is not None else '-':>6s}")
    print(f"{'acceptance':26s}" + "".join(f"{label(k) if k else '':>8s}" for k in ks) + f"  {'TTFT p95 s (off)':>17s}")
    for name in names:
        levels = by_k(configs, name)
        cells = ""
        for k in ks:
            if not k:
                cells += " " * 8
            else:
                found = [a for level in levels.get(k, []) if (a := acceptance(level)) is not None]
                cells += f"{100 * sum(found) / len(found):7.1f}%" if found else f"{'-':>8s}"
        ttft = [level.ttft_p95_s for level in levels.get(0, []) if level.ttft_p95_s is not None]
        print(f"{name:26s}{cells}  {(f'{ttft[0]:.2f}' if ttft else '-'):>17s}")
    moves = ", ".join(
        f"{'plain' if name == workload else name.split('@')[1]} {label(best) if best is not None else '-'}"
        for name, best in best_by_context.items()
    )
    print(f"k* at 1 stream: {moves}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="3,6", help="the draft lengths, an inclusive range LOW,HIGH (lookup is 3)")
    parser.add_argument("--context", default="4k,16k", help="context levels in tokens, e.g. 4k,16k")
    parser.add_argument("--workloads", default="technical", help="bundled workloads, comma separated")
    parser.add_argument("--max-requests", type=int, default=4, help="adaptive measurement's cap per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ctx-size", type=int, default=32768, help="llama-server's -c (Gemma 3 270M takes 32k)")
    parser.add_argument("--threads", type=int, default=1, help="llama-server's -t (1: steadier on a shared machine)")
    parser.add_argument("--folder", type=Path, help="keep the study here (default: a new temporary folder)")
    args = parse_engine_args(parser)
    args.k = [int(x) for x in args.k.split(",")]
    args.context = parse_context(args.context)
    args.workloads = args.workloads.split(",")
    config = parse_study_config(study_data(args))
    refuse_context_levels(config, known_max_model_len(config.server), key="--context")
    folder = args.folder or kept_folder("context-real")
    levels = ", ".join(f"{c:,}" for c in args.context)
    print(
        f"real llama-server (-c {args.ctx_size}, -t {args.threads}), Gemma 3 270M, ngram-simple lookup 3 at "
        f"k {args.k[0]}..{args.k[1]} and off; {', '.join(args.workloads)} at its own prompts and at {levels} "
        f"tokens; 1 stream, T = 0, {args.max_tokens}-token requests, adaptive up to {args.max_requests} per level"
    )
    started = time.monotonic()
    paths = study_paths(config, folder)
    outcome = StudyRunner(config, paths, resume=(paths.folder / "study.db").exists()).run()
    wall = (time.monotonic() - started) / 60
    t = outcome.time
    spent = f"boot {t.boot_s / 60:.1f} min, measuring {t.measure_s / 60:.1f} min, " if t is not None else ""
    print(f"starts {outcome.starts} (one per configuration); {spent}wall {wall:.1f} min")
    print(f"stop: {outcome.stop_reason}")
    configs = measured_configs(outcome.study)
    analysis = analyze_stored_study(outcome.study).analysis
    for workload in args.workloads:
        report_workload(workload, args.context, configs, analysis)
    print(f"\nstudy kept in {folder}")


if __name__ == "__main__":
    main()
