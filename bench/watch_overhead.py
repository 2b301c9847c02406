"""What reading a server costs it: the emulator's token rate with `specsweep watch` polling its
/metrics every second, against the rate without, side by side in one run.

    python bench/watch_overhead.py [--pairs 4] [--segment 20] [--time-scale 10] [--streams 4]

The emulator serves a steady schedule itself (prose at --streams closed-loop streams, no client),
so its rate depends only on its own event loop, which also answers /metrics. Segments of
--segment wall seconds alternate: without watch, then with ``specsweep watch --endpoint URL
--interval 1s --json`` running as its own process (the order flips every pair). A segment's
rate is generation-counter growth between one read at its start and one at its end. Prints
every segment, the mean rate with and without, their ratio, and the spread between segments of
the same kind (the noise the ratio is within or not).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.scraper import parse_metrics_text

RUNNING = {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"}
GENERATED = "vllm:generation_tokens_total"


def generated(url: str) -> tuple[float, float]:
    snapshot = parse_metrics_text(httpx.get(url + "/metrics", timeout=10).text, taken_at=time.monotonic())
    return snapshot.taken_at, snapshot.total(GENERATED) or 0.0


def segment_rate(url: str, seconds: float) -> float:
    t0, g0 = generated(url)
    time.sleep(seconds)
    t1, g1 = generated(url)
    return (g1 - g0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--segment", type=float, default=20.0, help="wall seconds per segment")
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        schedule = folder / "steady.toml"
        schedule.write_text(
            f'name = "steady"\n[[window]]\nduration_s = 3600\nstreams = {args.streams}\nmix = {{ prose = 1.0 }}\n'
        )
        port = free_port()
        argv = emulator_argv(
            port=port, speculative_config=json.dumps(RUNNING), profile="dgx-spark-v4-flash",
            time_scale=args.time_scale, seed=0, extra=["--startup-seconds", "0", "--traffic", str(schedule)],
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with ServerProcess(argv, log_path=folder / "emulator.log") as server:
            server.wait_ready(url + "/health", timeout_s=60)
            time.sleep(2.0)  # the streams reach their steady state
            rates: dict[bool, list[float]] = {False: [], True: []}
            for pair in range(args.pairs):
                for watching in (False, True) if pair % 2 == 0 else (True, False):
                    watcher = None
                    if watching:
                        command = [sys.executable, "-m", "specsweep", "watch", "--endpoint", url, "--interval", "1s",
                                   "--json", "--window", "1h"]  # fmt: skip
                        watcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(3.0)  # its start-up (imports) is not its polling
                    try:
                        rate = segment_rate(url, args.segment)
                    finally:
                        if watcher is not None:
                            watcher.terminate()
                            watcher.wait(timeout=30)
                    rates[watching].append(rate)
                    print(f"pair {pair + 1}: {'with' if watching else 'without'} watch  {rate:8.1f} tok/s", flush=True)
    without, with_watch = statistics.mean(rates[False]), statistics.mean(rates[True])
    spread = max(statistics.stdev(rates[False]), statistics.stdev(rates[True])) / without
    print(
        f"without watch {without:.1f} tok/s, with watch polling every second {with_watch:.1f} tok/s: ratio "
        f"{with_watch / without:.4f}; segment-to-segment spread (sd) {100 * spread:.2f}% of the rate, so the "
        f"ratio's own noise is about {100 * spread * (2 / args.pairs) ** 0.5:.2f}%"
    )


if __name__ == "__main__":
    main()
