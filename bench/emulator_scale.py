"""Emulator scale: hundreds of concurrent streams on one core, without falling behind schedule.

    python bench/emulator_scale.py [--streams 256] [--target-tokens-per-s 24000]

The emulator is pinned to CPU 0 and the measuring client to CPU 1. The time scale is chosen so
that the modelled rig must emit the target output rate; the table compares what the client
measured with the ground truth times the scale, and reports how far the emulator's step
schedule fell behind (its own counters on /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specsweep.runtime.client import StreamingClient
from specsweep.runtime.driver import PromptCycle, run_closed_loop
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.scraper import scrape_metrics
from specsweep.workload import load_workload

PROFILE = "l40s-llama-8b-eagle3"
SPEC = '{"method":"eagle3","model":"eagle3-head","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'


def truth_rate(streams: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "specsweep", "emulate", "--print-truth", "--profile", PROFILE,
         "--speculative-config", SPEC, "--concurrency", str(streams), "--temperature", "0.7",
         "--max-num-seqs", str(streams)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out)["prose"]["levels"][0]["decode_tokens_per_s"]


async def drive(url: str, model: str, streams: int, requests: int, max_tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url) as http:
        before = await scrape_metrics(http)
        samples = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(1.0)
                samples.append(await scrape_metrics(http))

        sampler = asyncio.create_task(sample())
        client = StreamingClient(url, model=model, continuous_usage=False)
        async with client:
            cpu0 = time.process_time()
            run = await run_closed_loop(
                client, PromptCycle(load_workload("prose")), concurrency=streams, requests=requests,
                max_tokens=max_tokens, temperature=0.7,
            )  # fmt: skip
            cpu = time.process_time() - cpu0
        sampler.cancel()
        after = await scrape_metrics(http)
    # Sustained rate: generation tokens per one-second window, median over the windows.
    windows = sorted(
        ((b.total("vllm:generation_tokens_total") or 0) - (a.total("vllm:generation_tokens_total") or 0))
        / (b.taken_at - a.taken_at)
        for a, b in itertools.pairwise(samples)
    )
    ok = [r for r in run.records if r.ok]

    def grew(name: str) -> float:
        return (after.total(name) or 0.0) - (before.total(name) or 0.0)

    scheduled = grew("specsweep_emulator_scheduled_seconds_total")
    elapsed = grew("specsweep_emulator_elapsed_seconds_total")
    return {
        "requests": len(run.records),
        "errors": len(run.records) - len(ok),
        "wall_s": run.wall_s,
        "tokens": sum(r.completion_tokens or 0 for r in ok),
        "chunks": sum(r.num_chunks for r in ok),
        "aggregate_tokens_per_s": sum(r.completion_tokens or 0 for r in ok) / run.wall_s,
        "sustained_tokens_per_s": windows[len(windows) // 2] if windows else float("nan"),
        "server_tokens_per_s": grew("vllm:generation_tokens_total") / max(after.taken_at - before.taken_at, 1e-9),
        "behind_fraction": (elapsed / scheduled - 1.0) if scheduled else float("nan"),
        "client_cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--target-tokens-per-s", type=float, default=24000.0)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=1500)
    args = parser.parse_args()

    modelled = truth_rate(args.streams)
    scale = args.target_tokens_per_s / modelled
    port = free_port()
    argv = emulator_argv(
        port=port, speculative_config=SPEC, profile=PROFILE, time_scale=scale,
        extra=["--startup-seconds", "0", "--max-num-seqs", str(args.streams)],
    )  # fmt: skip
    if shutil.which("taskset"):
        argv = ["taskset", "-c", "0", *argv]
        os.sched_setaffinity(0, {1})
    workdir = Path(tempfile.mkdtemp(prefix="specsweep-scale-"))
    with ServerProcess(argv, log_path=workdir / "emulator.log") as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        model = "meta-llama/Llama-3.1-8B-Instruct"
        result = asyncio.run(
            drive(f"http://127.0.0.1:{port}", model, args.streams, args.streams * args.requests_per_stream,
                  args.max_tokens)
        )  # fmt: skip
        emulator_cpu = _process_cpu_s(server.pid)
    expected = modelled * scale
    print(f"profile {PROFILE}, k=5 probabilistic, {args.streams} streams, time scale {scale:.2f}, "
          f"emulator on CPU 0, client on CPU 1")  # fmt: skip
    rows = [
        ("ground truth aggregate tok/s (model x scale)", f"{expected:,.0f}"),
        ("server-counted tok/s, median of 1 s windows", f"{result['sustained_tokens_per_s']:,.0f}"),
        ("server-counted tok/s over the whole run (prefill, ramp, tail)", f"{result['server_tokens_per_s']:,.0f}"),
        ("client aggregate tok/s, wall clock (ramp and tail included)", f"{result['aggregate_tokens_per_s']:,.0f}"),
        ("requests / errors", f"{result['requests']} / {result['errors']}"),
        ("chunks per second", f"{result['chunks'] / result['wall_s']:,.0f}"),
        ("emulator schedule behind by", f"{100 * result['behind_fraction']:.2f}%"),
        ("emulator CPU seconds / wall seconds", f"{emulator_cpu / result['wall_s']:.2f}" if emulator_cpu else "-"),
        ("client CPU seconds / wall seconds", f"{result['client_cpu_s'] / result['wall_s']:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"sustained/truth ratio: {result['sustained_tokens_per_s'] / expected:.3f}")


def _process_cpu_s(pid: int | None) -> float | None:
    """User+system CPU seconds of a process (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        # taskset execs the emulator in place, so the PID is the emulator's.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


if __name__ == "__main__":
    main()
