"""What the one step model's physics misses on each rig's own truth: where ``TAU_PRIOR`` comes from.

    python bench/step_model_misfit.py

For every rig of bench/sweep_efficiency.py (the 2 bundled emulator profiles and the 6 in
bench/profiles/, two of them with step times that are no line in k: CUDA graphs captured at few
widths, and a fixed launch cost per drafting step), every configuration of its space (draft
lengths 1..8, both draft samplings, speculation off) at concurrency 1 and the rig's own: the
true step time ``B E / R`` from ``compute_truth``, fitted by the step model with the captured
widths the rig's server reports (as a study reads them), each configuration its own start and
each level known to 0.2%. Printed per rig and workload: the root-mean-square and the largest
relative miss of the fitted physics (the model without its per-cell deviations), and the
deviation size the fit estimates. Noise-free, with every configuration measured, this is the
part of a step no amount of measuring moves onto the physics: what an unmeasured cell's
deviation ``N(0, tau^2)`` stands for.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from specsweep.analysis.drafters import candidate_of
from specsweep.analysis.step_fit import fit_step_model
from specsweep.analysis.step_model import TAU_PRIOR, StepObservation
from specsweep.emulator.profile import load_profile
from specsweep.measurement.acceptance import expected_tokens_per_step
from specsweep.types import CapturedWidths
from sweep_efficiency import PROFILES, build_case


def misfit(name: str, concurrency: int, workload: str) -> tuple[float, float, float]:
    """(rms miss, largest miss, fitted tau) of the physics on one rig's truth."""
    profile = load_profile(name)
    case = build_case(profile, workload, concurrency)
    observations = []
    for start, configuration in enumerate(case.space.configurations()):
        candidate = candidate_of(configuration.spec)
        curve = case.curve[configuration.key]
        tokens = expected_tokens_per_step(curve) if curve and not candidate.off else 1.0
        for level in case.levels:
            rate = case.truth[configuration.key][level]
            observations.append(
                StepObservation(
                    concurrency=level, num_speculative_tokens=candidate.num_speculative_tokens,
                    drafter=candidate.drafter, step_time_s=level * tokens / rate, start=start, relative_se=0.002,
                )
            )  # fmt: skip
    posterior = fit_step_model(observations, captured_widths=CapturedWidths(every_k=profile.timing.captured_widths))
    misses = np.array([math.log(o.step_time_s / posterior.physics_s(o.cell)) for o in observations])
    return float(np.sqrt(np.mean(misses**2))), float(np.max(np.abs(misses))), posterior.cell_sd


def main() -> None:
    print(f"{'rig':26s} {'workload':9s} {'B':>3s} {'rms miss':>9s} {'largest':>8s} {'fitted tau':>10s}")
    worst = 0.0
    for name, concurrency in PROFILES:
        for workload in ("prose", "technical"):
            rms, largest, tau = misfit(name, concurrency, workload)
            worst = max(worst, rms)
            print(
                f"{Path(name).stem:26s} {workload:9s} {concurrency:3d} {100 * rms:8.2f}% {100 * largest:7.2f}% "
                f"{100 * tau:9.2f}%"
            )
    print(f"largest rms miss: {100 * worst:.2f}%; TAU_PRIOR: {100 * TAU_PRIOR.relative_sd:.2f}% ({TAU_PRIOR.df} df)")


if __name__ == "__main__":
    main()
