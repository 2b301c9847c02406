"""The pastes of kept real llama-server studies against the mean of every start they measured.

    source ~/.cache/specsweep/real-engines.env
    python bench/kept_real_pastes.py FOLDER [FOLDER ...]

Each FOLDER is one ``bench/search_real_llamacpp.py --folder`` keeps (``real-grid/`` and
``real-model/``: Gemma 3 270M, ngram-simple lookup 3, k = 1..8 and off, prose and technical at one
stream). On this machine one start of a configuration is 8 to 12% off its mean, so one study's
measurements are no truth; the mean over every start of every kept study is nearer one (6 to 18
starts a configuration). Each study is analysed with the code at hand (starting nothing), and its
paste per workload is scored against that mean: regret = 1 - mean(paste) / mean(best). Printed:
the means, then each study's pastes, then

    pastes: N; mean regret X%; worst Y%

and the one step model fitted over every kept start at once (each study's trials numbered apart):
the start spread, tau (what the physics misses at one configuration, estimated from the data) and
each configuration's deviation, against the prior a study's fit holds tau to (the engine's:
types.REAL_ENGINE_DEVIATION). ``--tau-prior SD`` and ``--start-prior SD`` run the analyses with
that prior's sd replaced (what-if; the code at hand otherwise).

The means carry their own error (about 8% over the square root of their starts), so a regret under
3% is within it; the figure compares versions of the code on the same starts.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np

from kept import set_priors
from rig_real_llamacpp import parse_engine_args
from search_real_llamacpp import WORKLOADS, label, study_data
from specsweep.analysis import step_model
from specsweep.analysis.drafters import candidate_of
from specsweep.analysis.throughput import fit_throughput_model, study_observations, study_start_sd
from specsweep.config import parse_study_config
from specsweep.engines.registry import engine_info
from specsweep.tuning.records import measured_configs
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.types import CapturedWidths


def kept_studies(folders: list[Path], args: argparse.Namespace) -> dict[str, object]:
    out = {}
    for folder in folders:
        for way in ("grid", "model"):
            if not (folder / f"real-{way}").is_dir():
                raise SystemExit(f"error: {folder} holds no real-{way}/ study: pass folders search_real_llamacpp kept.")
            config = parse_study_config(study_data(f"real-{way}", way, args))
            runner = StudyRunner(config, study_paths(config, folder), resume=True, queue_initial=False)
            out[f"{folder.name} {way}"] = runner.study
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--max-requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tau-prior", type=float, help="the prior sd of a configuration's miss (what-if)")
    parser.add_argument("--start-prior", type=float, help="the prior sd of a start's effect (what-if)")
    args = parse_engine_args(parser)
    args.k = [1, 8]
    set_priors(tau=args.tau_prior, start=args.start_prior)
    studies = kept_studies(args.folders, args)
    rates: dict[tuple[str, object], list[float]] = defaultdict(list)
    for study in studies.values():
        for config in measured_configs(study):
            for workload in WORKLOADS:
                if rate := config.rate(workload, 1):
                    rates[(workload, candidate_of(config.spec, 1))].append(rate)
    mean = {key: float(np.mean(v)) for key, v in rates.items()}
    for workload in WORKLOADS:
        mine = sorted(
            ((c, v) for (w, c), v in mean.items() if w == workload), key=lambda cv: cv[0].num_speculative_tokens
        )
        print(f"{workload:10s} " + "  ".join(f"{label(c)} {v:.1f} ({len(rates[(workload, c)])})" for c, v in mine))
    print(f"\n{'study':16s} " + " ".join(f"{w + ' paste':>16s} {'regret':>7s}" for w in WORKLOADS))
    regrets = []
    for name, study in studies.items():
        analysis = analyze_stored_study(study).analysis
        cells = []
        for workload in WORKLOADS:
            paste = analysis.snippet(workload).choice_by_concurrency[1]
            best = max(v for (w, _), v in mean.items() if w == workload)
            regrets.append(1.0 - mean[(workload, paste)] / best)
            cells.append(f"{label(paste):>16s} {100 * regrets[-1]:6.1f}%")
        print(f"{name:16s} " + " ".join(cells))
    print(f"\npastes: {len(regrets)}; mean regret {100 * np.mean(regrets):.2f}%; worst {100 * max(regrets):.2f}%")
    undrafted_steps(studies)
    every_start(studies)


def undrafted_steps(studies: dict[str, object]) -> None:
    """Per workload and k, the steps per output token that drafted nothing, c = (1 - q) / E, over
    the drafting starts (docs/math.md: one number across k, each start's text one draw of it)."""
    print("\nsteps per output token that drafted nothing, c, over the drafting starts: mean (min..max, starts)")
    for workload in WORKLOADS:
        by_k: dict[int, list[float]] = defaultdict(list)
        for study in studies.values():
            for o in study_observations(measured_configs(study), workload):
                if o.num_speculative_tokens and o.drafted_share > 0:
                    by_k[o.num_speculative_tokens].append((1 - o.drafted_share) / o.tokens_per_step)
        cells = [f"k={k} {np.mean(v):.3f} ({min(v):.3f}..{max(v):.3f}, {len(v)})" for k, v in sorted(by_k.items())]
        print(f"{workload:10s} " + "  ".join(cells))


def every_start(studies: dict[str, object]) -> None:
    """The one step model over every kept start: how far configurations stray from the physics."""
    configs = [
        dataclasses.replace(c, trial=1000 * i + c.trial)
        for i, study in enumerate(studies.values())
        for c in measured_configs(study)
    ]
    noise = engine_info("llama.cpp").noise
    shared = study_start_sd(configs, WORKLOADS, noise_prior=noise)
    tau_prior = step_model.step_priors(noise, CapturedWidths())[1]
    print(f"\nevery kept start in one fit (tau's prior: {100 * tau_prior.relative_sd:.1f}%)")
    for workload in WORKLOADS:
        observations = study_observations(configs, workload)
        posterior = fit_throughput_model(observations, noise_prior=noise, shared_start=shared).posterior
        deviations = "  ".join(
            f"{label_of(c)} {100 * d:+.1f}%" for c, d in zip(posterior.cells, posterior.deviation, strict=True)
        )
        print(
            f"{workload:10s} starts {len({o.start for o in posterior.observations})}, start spread "
            f"{100 * posterior.start_sd:.1f}%, tau {100 * posterior.cell_sd:.1f}%; step time off the physics: "
            + deviations
        )


def label_of(cell) -> str:
    return "off" if not cell.num_speculative_tokens else f"k={cell.num_speculative_tokens}"


if __name__ == "__main__":
    main()
