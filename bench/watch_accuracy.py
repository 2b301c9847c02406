"""`specsweep watch` against the emulator's truth: one modelled hour of changing traffic per run.

    python bench/watch_accuracy.py [--seeds 10] [--profiles a,b] [--rig exact|study] [--time-scale 100]
        [--interval 0.25]

Per bundled profile and seed: the emulator serves the bundled day-night schedule itself (four
windows of 15 modelled minutes: prose-heavy at 1 and 3 streams, technical-heavy at 4 and 1) at
the profile's "today" draft length; watch's live poll (runtime/poll.py, the code path of
``watch --endpoint``) reads /metrics every --interval wall seconds for one modelled hour, stamping
each read on the emulator's modelled clock, and the windows are analysed as ``watch --window 15m``
does, aligned with the schedule's windows.

``--rig exact`` (the default) uses the emulator model's own step times (tests/builders.exact_rig),
so what is measured is watch's estimation from counters and gauge samples, not a rig's
measurement error. ``--rig study`` makes the rig as a user does, from an earlier study on the
same rig: per profile and seed, a grid study of prose (speculation off and k = 1..8,
probabilistic, at 1 and 4 streams, 12 requests of 600 tokens per level, its own emulator seed),
whose rig.json watch then uses; the error of the rig's measurement is then in the figures too.
The truth of a window is the emulator's model of it under every k (emulator/traffic.py) for the mix it
really served (its drafts-per-class counter: a window holds a few dozen requests, whose mix is
not quite the nominal one) and, beside it, for the nominal mix.

Prints one row per window and run, then per profile: how many windows' recommendation equals the
truth's best (served mix; nominal mix), the worst gain error (predicted 1 + gain over true
1 + gain), and what a miss costs in truth.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.builders import emulator_study, exact_rig, specsweep, write_study

from specsweep.emulator.model import acceptance_curve
from specsweep.emulator.profile import bundled_profile_names, load_profile
from specsweep.emulator.traffic import load_schedule, window_tokens_per_s
from specsweep.engines.registry import engine_info
from specsweep.engines.vllm import validate_speculative_config
from specsweep.measurement.series import intervals_from_snapshots
from specsweep.rigs.file import RIG_FILE, load_rig
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.modelled_time import ServerClock
from specsweep.runtime.poll import PollMissed, poll_metrics
from specsweep.watch.engines import series_names
from specsweep.watch.windows import WatchSettings, analyse_windows

RUNNING_K = {"dgx-spark-v4-flash": 5, "l40s-llama-8b-eagle3": 4}  # what the user runs today
FIELDS = {"l40s-llama-8b-eagle3": {"model": "bench/eagle3-drafter"}}
K_MAX = 8
TRUTH_COUNTER = "specsweep_emulator_drafts_total"


def spec(profile_name: str, k: int):
    profile = load_profile(profile_name)
    fields = {**FIELDS.get(profile_name, {}), "method": profile.methods[0], "draft_sample_method": "probabilistic"}
    return validate_speculative_config({**fields, "num_speculative_tokens": k}) if k else None


def request_mix(profile_name: str, drafts: dict[str, float]) -> dict[str, float]:
    """Request shares from drafts per class at the running k (a request of class c drafts (M-1)/E_c times)."""
    profile, running = load_profile(profile_name), spec(profile_name, RUNNING_K[profile_name])
    temperature = profile.reference_temperature
    weights = {c: d * (1 + sum(acceptance_curve(profile, c, running, temperature))) for c, d in drafts.items() if d}
    total = sum(weights.values())
    return {c: w / total for c, w in weights.items()}


def drafts_at(snapshots, at: float) -> dict[str, float]:
    nearest = min(snapshots, key=lambda s: abs(s.taken_at - at))
    return {labels["content_class"]: value for labels, value in nearest.values(TRUTH_COUNTER)}


def study_rig(profile_name: str, seed: int, *, time_scale: float, folder: Path):
    """The rig of a prose grid study on the emulator (module doc), as ``specsweep study`` writes it."""
    name = f"rig-{profile_name}-{seed}"
    fields = {**FIELDS.get(profile_name, {}), "method": load_profile(profile_name).methods[0]}
    data = emulator_study(
        name, seed=1000 + seed, time_scale=time_scale, profile=profile_name, k=(1, K_MAX),
        workloads={"prose": 1.0}, concurrency=(1, 4), requests=12, max_tokens=600,
        temperature=load_profile(profile_name).reference_temperature,
        study={"sampler": "grid"}, search={"draft_sample_method": "probabilistic", "fixed": fields},
    )  # fmt: skip
    config = write_study(folder / f"{name}.toml", data)
    done = specsweep("study", "--config", str(config), "--studies-dir", str(folder), timeout=1800)
    if done.returncode != 0:
        last = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the rig study {name} failed: {last}")
    return load_rig(folder / name / RIG_FILE)


def run_once(
    profile_name: str, seed: int, *, time_scale: float, interval_s: float, folder: Path, rig_kind: str = "exact"
) -> list[dict]:
    schedule = load_schedule("day-night")
    running = spec(profile_name, RUNNING_K[profile_name])
    port = free_port()
    argv = emulator_argv(
        port=port, speculative_config=running.to_json(), profile=profile_name, time_scale=time_scale, seed=seed,
        extra=["--startup-seconds", "0", "--traffic", "day-night"],
    )  # fmt: skip
    server = ServerProcess(argv, log_path=folder / f"emulator-{profile_name}-{seed}.log")
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready(url + "/health", timeout_s=60)
        started = httpx.get(url + "/version", timeout=10).json()["emulator"]["traffic"]["started_at"]
        wall_end = started + schedule.period_s / time_scale
        names = series_names(engine_info("emulator"))
        snapshots = []

        def keep(event) -> bool:
            if not isinstance(event, PollMissed):
                snapshots.append(event)
            return time.time() > wall_end + interval_s

        poll_metrics(url, interval_s=interval_s, wanted=lambda _s: [*names.wanted(), TRUTH_COUNTER], on_snapshot=keep)
    finally:
        server.stop(grace_s=5)
    if rig_kind == "study":
        rig = study_rig(profile_name, seed, time_scale=time_scale, folder=folder)
    else:
        method = load_profile(profile_name).methods[0]
        rig = exact_rig(profile_name, method, k_max=K_MAX, fields=FIELDS.get(profile_name))
    settings = WatchSettings(
        names=names, engine="emulator", rig=rig, drafter=rig.drafters[0], running_config=running,
        window_s=900, clock="modelled", seed=seed,
    )  # fmt: skip
    # the poll's stamps are on the emulator's modelled clock, which reads the first read's unix time
    # (runtime/poll.py): the schedule's start and end on it
    origin = snapshots[0].taken_at
    start = ServerClock(time_scale).anchored(origin, started)
    report = analyse_windows(
        intervals_from_snapshots(snapshots, names), settings, start=start, end=start + schedule.period_s
    )
    profile = load_profile(profile_name)
    rows = []
    for window, row in zip(schedule.window, report.windows, strict=True):
        before, after = drafts_at(snapshots, row.window.start), drafts_at(snapshots, row.window.end)
        mix = request_mix(profile_name, {c: after[c] - before.get(c, 0.0) for c in after})
        served = {k: window_tokens_per_s(profile, schedule, replace(window, mix=mix), spec(profile_name, k))
                  for k in range(K_MAX + 1)}  # fmt: skip
        nominal = {k: window_tokens_per_s(profile, schedule, window, spec(profile_name, k)) for k in range(K_MAX + 1)}
        rec = row.recommendation
        chosen = rec.choice.k_by_batch.get(window.streams) if rec else None
        best = max(served, key=served.__getitem__)
        k0 = RUNNING_K[profile_name]
        rows.append(
            {
                "profile": profile_name, "seed": seed, "window": window.name, "streams": window.streams,
                "chosen": chosen, "table": rec.choice.label if rec else None,
                "best_served": best, "best_nominal": max(nominal, key=nominal.__getitem__),
                "gain": rec.gain if rec else None, "true_gain": served[best] / served[k0] - 1.0,
                "gain_of_choice": None if chosen is None else served[chosen] / served[k0] - 1.0,
                "cost": None if chosen is None else 1.0 - served[chosen] / served[best],
            }
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--profiles", default=",".join(bundled_profile_names()))
    parser.add_argument("--time-scale", type=float, default=100.0)
    parser.add_argument("--interval", type=float, default=0.25, help="wall seconds between reads of /metrics")
    parser.add_argument(
        "--rig",
        choices=("exact", "study"),
        default="exact",
        help="the emulator's own step times, or a rig a prose study measured (module doc)",
    )
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    every = []
    with tempfile.TemporaryDirectory() as tmp:
        for profile_name in args.profiles.split(","):
            rows = []
            for seed in range(args.seeds):
                began = time.time()
                found = run_once(profile_name, seed, time_scale=args.time_scale, interval_s=args.interval,
                                 folder=Path(tmp), rig_kind=args.rig)  # fmt: skip
                for r in found:
                    print(
                        f"{profile_name} seed {seed} {r['window']:8s} streams {r['streams']}: chosen k={r['chosen']} "
                        f"(truth {r['best_served']}, nominal mix {r['best_nominal']}); predicted gain "
                        f"{100 * (r['gain'] or 0):+.1f}%, true {100 * r['true_gain']:+.1f}%, miss costs "
                        f"{100 * (r['cost'] or 0):.1f}%",
                        flush=True,
                    )
                print(f"  ({time.time() - began:.0f} s)", flush=True)
                rows += found
            every += rows
            windows = len(rows)
            served = sum(r["chosen"] == r["best_served"] for r in rows)
            nominal = sum(r["chosen"] == r["best_nominal"] for r in rows)
            runs_all = sum(
                all(r["chosen"] == r["best_served"] for r in rows if r["seed"] == s) for s in range(args.seeds)
            )
            errors = [abs((1 + r["gain"]) / (1 + r["gain_of_choice"]) - 1) for r in rows if r["gain"] is not None]
            worst_cost = max((r["cost"] or 0.0) for r in rows)
            print(
                f"{profile_name}: {served}/{windows} windows recommend the truth's best for the mix served "
                f"({nominal}/{windows} for the nominal mix); {runs_all}/{args.seeds} runs right in every window; "
                f"predicted over true 1 + gain of the choice: worst {100 * max(errors):.1f}%, "
                f"median {100 * sorted(errors)[len(errors) // 2]:.1f}%; worst miss costs {100 * worst_cost:.1f}%",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(every, indent=1))


if __name__ == "__main__":
    main()
