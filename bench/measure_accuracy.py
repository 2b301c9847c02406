"""Measurement accuracy: `specsweep measure` against the emulator's ground truth, side by side.

    python bench/measure_accuracy.py [--time-scale 20] [--requests 32]

The default profile at k = 5 (probabilistic drafting, T = 0.6), both bundled workloads,
concurrency 1 and 4, 600-token requests. For each level: the measured aggregate output tok/s
against the steady-state truth (and against the truth at the acceptance the emulator actually
drew), every S_i against the truth, and what counting chunks instead of usage would have said.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.workload import load_workload

SPEC = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    scale = args.time_scale
    truth = json.loads(
        subprocess.run(
            [sys.executable, "-m", "specsweep", "emulate", "--print-truth", "--speculative-config", SPEC,
             "--concurrency", "1,4", "--temperature", "0.6"],
            check=True, capture_output=True, text=True,
        ).stdout
    )  # fmt: skip
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="specsweep-accuracy-")) / "emulator.log"
    argv = emulator_argv(port=port, speculative_config=SPEC, time_scale=scale, seed=args.seed,
                         extra=["--startup-seconds", "0"])  # fmt: skip
    rows = []
    with ServerProcess(argv, log_path=log) as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        for workload in ("prose", "technical"):
            settings = MeasureSettings(endpoint=f"http://127.0.0.1:{port}", concurrency=(1, 4), requests=args.requests,
                                       max_tokens=600, temperature=0.6, seed=args.seed)  # fmt: skip
            measurement = run_measure(settings, load_workload(workload))
            t = truth[workload]
            for level, expected in zip(measurement.levels, t["levels"], strict=True):
                s = level.summary
                measured = s.output_tokens_per_s  # modelled: runtime/ undoes the emulator's clock
                busy = s.saturated_output_tokens_per_s
                realized = (
                    expected["output_tokens_per_s"]
                    * s.acceptance.mean_acceptance_length
                    / t["expected_tokens_per_step"]
                )
                worst_si = max(abs(a - b) for a, b in zip(s.acceptance.per_position, t["per_position"], strict=True))
                chunks = sum(r.num_chunks for r in level.records)
                tokens = sum(r.completion_tokens or 0 for r in level.records)
                rows.append((workload, s.concurrency, measured, busy, expected["output_tokens_per_s"], realized,
                             worst_si, s.acceptance.num_drafts, chunks / tokens))  # fmt: skip
    print(f"default profile, --speculative-config '{SPEC}', T=0.6, {args.requests} x 600-token requests per level, "
          f"time scale {scale:g}; rates in modelled tok/s")  # fmt: skip
    header = ("workload", "conc", "wall clock", "ratio", "all busy", "ratio", "truth", "busy/drawn", "max|dS_i|",
              "drafts", "chunks/tokens")  # fmt: skip
    print("  ".join(f"{h:>11}" for h in header))
    for w, c, m, b, t, r, d, n, ct in rows:
        print("  ".join(f"{v:>11}" for v in (w, c, f"{m:.2f}", f"{m / t:.3f}", f"{b:.2f}", f"{b / t:.3f}", f"{t:.2f}",
                                               f"{b / r:.3f}", f"{d:.3f}", n, f"{ct:.3f}")))  # fmt: skip
    print(f"worst ratio to truth: wall clock {min(m / t for _, _, m, _, t, *_ in rows):.3f}, "
          f"all streams busy {min(b / t for _, _, _, b, t, *_ in rows):.3f}; "
          f"worst S_i error: {max(d for *_, d, _, _ in rows):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
