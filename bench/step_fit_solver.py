"""The step fit's bounded least squares, solved two ways on the problems a real study poses.

    python bench/step_fit_solver.py [--workload technical] [--repeats 3]

Runs the README's first study (``specsweep study --workload W`` on the built-in emulator, in a
temporary folder) in this process, keeping every bounded least-squares problem the step fit
(analysis/step_fit.py) hands ``scipy.optimize.lsq_linear`` while the search decides and the
report fits. Then it solves all of them with each method, side by side in this run, and prints
per method the seconds (the best of ``--repeats``), the largest relative difference of its
solutions from ``trf``'s and the largest relative excess of its residual over the smaller of the
two; the last line is the time ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from scipy import optimize

from specsweep.analysis import step_fit
from specsweep.cli import app

METHODS = ("trf", "bvls")


def collect(workload: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    problems: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    solve = step_fit.bounded_lstsq

    def keep(a: np.ndarray, b: np.ndarray, nonneg: int) -> np.ndarray:
        lower = np.concatenate([np.zeros(nonneg), np.full(a.shape[1] - nonneg, -np.inf)])
        problems.append((a.copy(), b.copy(), lower))
        return solve(a, b, nonneg)

    step_fit.bounded_lstsq = keep
    try:
        with tempfile.TemporaryDirectory() as folder:
            try:
                app(["study", "--workload", workload, "--studies-dir", folder], prog_name="specsweep")
            except SystemExit as stop:
                if stop.code:
                    raise
    finally:
        step_fit.bounded_lstsq = solve
    return problems


def solve_all(problems, method: str) -> tuple[float, list[np.ndarray]]:
    started = time.perf_counter()
    solutions = [
        np.asarray(optimize.lsq_linear(a, b, bounds=(lower, np.full(a.shape[1], np.inf)), method=method).x)
        for a, b, lower in problems
    ]
    return time.perf_counter() - started, solutions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="technical")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    problems = collect(args.workload)
    print(f"\n{len(problems)} bounded least-squares problems from `specsweep study --workload {args.workload}`")
    times: dict[str, float] = {}
    solutions: dict[str, list[np.ndarray]] = {}
    for _ in range(args.repeats):
        for method in METHODS:  # interleaved, so a busy moment hits both
            seconds, solutions[method] = solve_all(problems, method)
            times[method] = min(times.get(method, np.inf), seconds)
    print(f"{'method':8s} {'seconds':>8s} {'max rel. diff of x':>19s} {'max rel. residual excess':>25s}")
    for method in METHODS:
        diff = excess = 0.0
        for (a, b, _), x, reference in zip(problems, solutions[method], solutions["trf"], strict=True):
            diff = max(diff, float(np.max(np.abs(x - reference)) / (1e-300 + np.max(np.abs(reference)))))
            mine, theirs = (float(np.linalg.norm(a @ v - b)) for v in (x, reference))
            excess = max(excess, (mine - min(mine, theirs)) / (1e-300 + min(mine, theirs)))
        print(f"{method:8s} {times[method]:8.2f} {diff:19.1e} {excess:25.1e}")
    print(f"trf/bvls time: {times['trf'] / times['bvls']:.1f}x")


if __name__ == "__main__":
    main()
