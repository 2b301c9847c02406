"""Calibration: the emulator's default profile measured side by side with the user report.

    python bench/calibrate_emulator.py [--time-scale 10] [--requests 32]

Starts ``specsweep emulate`` with the report's configuration (k = 5, probabilistic drafting),
measures the bundled prose and technical workloads at concurrency 1 and 4 (600-token
generations, exact usage counts, like the report), and prints a table of emulator against
report. Times and rates are converted back to modelled (real-hardware) units by the time scale.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from specsweep.emulator.profile import load_profile
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.workload import load_workload

SPEC = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'
REPORT = {
    "prose S_i": (0.741, 0.538, 0.411, 0.291, 0.241),
    "technical S_i": (0.569, 0.347, 0.188, 0.069, 0.035),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    scale = args.time_scale
    profile = load_profile()
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="specsweep-calibrate-"))
    server = ServerProcess(
        emulator_argv(port=port, speculative_config=SPEC, time_scale=scale, seed=args.seed),
        log_path=workdir / "emulator.log",
    )
    results = {}
    with server:
        boot_s = server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=120)
        for workload in ("prose", "technical"):
            settings = MeasureSettings(
                endpoint=f"http://127.0.0.1:{port}",
                concurrency=(1, 4),
                requests=args.requests,
                max_tokens=600,
                temperature=profile.reference_temperature,
                seed=args.seed,
            )
            results[workload] = run_measure(settings, load_workload(workload))
    log = (workdir / "emulator.log").read_text()
    # TTFT is a fraction of a second: measure it at time scale 1, where the client's own
    # millisecond of overhead is not multiplied by the scale.
    port = free_port()
    with ServerProcess(
        emulator_argv(port=port, speculative_config=SPEC, time_scale=1.0, seed=args.seed,
                      extra=["--startup-seconds", "0"]),
        log_path=workdir / "emulator-ttft.log",
    ) as server:  # fmt: skip
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        settings = MeasureSettings(
            endpoint=f"http://127.0.0.1:{port}", concurrency=(1,), requests=16, warmup=1, max_tokens=8,
            temperature=profile.reference_temperature, seed=args.seed,
        )  # fmt: skip
        ttft1 = run_measure(settings, load_workload("prose")).levels[0].summary

    prose1, prose4 = (level.summary for level in results["prose"].levels)
    rows: list[tuple[str, str, str]] = []

    # measurements come in the modelled hardware's units (runtime/ undoes the emulator's clock)
    def rate(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    d1, d4 = prose1.decode_tokens_per_s_per_stream, prose4.decode_tokens_per_s_per_stream
    rows.append(("single stream decode tok/s (p50; min-max)", "40.4 (37.7-43.3)",
                 f"{rate(d1.p50)} ({rate(d1.min)}-{rate(d1.max)})"))  # fmt: skip
    rows.append(("single stream output tok/s, wall clock", "-", rate(prose1.output_tokens_per_s)))
    rows.append(
        ("TTFT at 1 (min-max) s, at time scale 1", "0.13-0.15", f"{ttft1.ttft_s.min:.3f}-{ttft1.ttft_s.max:.3f}")
    )
    rows.append(("4 concurrent aggregate tok/s, wall clock", "66.7", rate(prose4.output_tokens_per_s)))
    rows.append(("4 concurrent per-stream tok/s (min-max)", "17-22", f"{rate(d4.min)}-{rate(d4.max)}"))
    rows.append(("TTFT at 4, max s", "up to 0.80", secs(prose4.ttft_s.max)))
    rows.append(
        (
            "prefill peak tok/s (prompt tokens / TTFT), at time scale 1",
            "~3,000",
            f"{ttft1.prefill_tokens_per_s.max:.0f}",
        )
    )
    rows.append(("server generation tok/s at 1", "29.7-40.1", rate(prose1.server_generation_tokens_per_s)))
    rows.append(("server generation tok/s at 4", "67.7-75.5", rate(prose4.server_generation_tokens_per_s)))
    for workload, label in (("prose", "prose S_i"), ("technical", "technical S_i")):
        acceptance = results[workload].levels[0].summary.acceptance
        measured = ", ".join(f"{x:.3f}" for x in acceptance.per_position)
        rows.append(
            (f"{label} (c=1, {acceptance.num_drafts} drafts)", ", ".join(f"{x:.3f}" for x in REPORT[label]), measured)
        )
        worst = max(abs(a - b) for a, b in zip(acceptance.per_position, REPORT[label], strict=True))
        rows.append((f"{label}: largest difference", "-", f"{worst:.3f}"))
        rows.append((f"{workload} mean acceptance length", "~3.0 (prose)", f"{acceptance.mean_acceptance_length:.2f}"))
    kv = re.search(
        r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", log
    )
    rows.append(
        ("KV pool tokens / max concurrency", "1,760,985 / 4.40x", f"{kv.group(1)} / {kv.group(2)}x" if kv else "-")
    )
    suggestions = re.findall(r"equivalent to --gpu-memory-utilization=([\d.]+)", log)
    rows.append(("per-rank memory suggestions", "0.8526, 0.8556", ", ".join(suggestions)))
    rows.append(("FP8 default kernel warning", "yes", "yes" if "Using default W8A8 Block FP8" in log else "no"))
    rows.append(("startup (modelled s)", "minutes", f"{boot_s * scale:.0f}"))

    width = max(len(r[0]) for r in rows)
    print(
        f"emulator profile {profile.name}, --speculative-config '{SPEC}', T={profile.reference_temperature}, "
        f"{args.requests} requests x 600 tokens per level, time scale {scale:g}"
    )
    print(f"{'figure':<{width}}  {'user report':<36}  emulator")
    for name, report, measured in rows:
        print(f"{name:<{width}}  {report:<36}  {measured}")
    ratio = prose1.decode_tokens_per_s_per_stream.p50 / 40.4
    print(f"single-stream ratio emulator/report: {ratio:.3f}")
    print(f"4-concurrent ratio emulator/report: {prose4.output_tokens_per_s / 66.7:.3f}")


if __name__ == "__main__":
    main()
