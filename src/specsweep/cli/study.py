"""``specsweep study``: restart the server per config, measure, and recommend."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from specsweep.cli.recommend import print_analysis
from specsweep.cli.rig import print_rig_study
from specsweep.config import (
    EmulatorServer,
    MeasureConfig,
    Objective,
    SearchSpace,
    ServerConfig,
    StudyConfig,
    load_study_config,
)
from specsweep.emulator.profile import DEFAULT_PROFILE, load_profile
from specsweep.errors import ConfigError, FitError
from specsweep.report.snippets import render_snippet, snippet_format_for
from specsweep.tuning.recommend import analyze_stored_study, best_overall, measured_configs, pick_best
from specsweep.tuning.rig import RIG_FILE, build_rig, load_rig, write_rig
from specsweep.tuning.rig_study import run_rig_study
from specsweep.tuning.storage import default_worker, is_shared, shown
from specsweep.tuning.study import StudyOutcome, StudyRunner, study_exists, study_paths

# The default study: the emulator's default profile (the DGX Spark field report), the report's
# current configuration as the baseline, draft lengths 1 to 5 with both draft methods at the
# profile's reference temperature. Sized to finish in about a minute on 2 cores.
DEFAULT_TIME_SCALE = 100.0


def default_study(workload: str) -> StudyConfig:
    """The study ``specsweep study --workload W`` runs when no --config is given."""
    profile = load_profile(DEFAULT_PROFILE)
    return StudyConfig(
        name=f"emulator-{Path(workload).stem}",
        sampler="model",
        server=ServerConfig(
            engine="emulator",
            mode="emulator",
            # A 20 s modelled restart instead of the profile's 4 minutes keeps the demo short.
            emulator=EmulatorServer(
                profile=DEFAULT_PROFILE, time_scale=DEFAULT_TIME_SCALE, seed=0, extra_args=("--startup-seconds", "20")
            ),
            ready_timeout_s=60.0,
            stop_grace_s=5.0,
        ),
        search=SearchSpace(
            num_speculative_tokens=(1, 5),
            fixed={"method": "dspark"},
            baseline={"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"},
        ),
        workloads={workload: 1.0},
        measure=MeasureConfig(
            concurrency=(1, 4), requests=12, max_tokens=600, temperature=profile.reference_temperature
        ),
        objective=Objective(concurrency=1),
        source="built-in emulator study",
    )


def study(
    workload: str = typer.Option(
        None, help="Workload to tune for (prose, technical or a JSONL path); overrides the config's [workloads]."
    ),
    config: Path = typer.Option(None, help="Study TOML file (docs/study-config.md). Without it: the emulator."),
    trials: int = typer.Option(None, min=1, help="Most trials to run now (default: the config's budget)."),
    study_name: str = typer.Option(None, help="Study name (default: the config's)."),
    storage: str = typer.Option(
        None,
        help="Optuna storage (default: SQLite in studies/NAME/). Shared by several machines: "
        "postgresql://USER:PASSWORD@HOST/DB, or journal:///PATH.log on a shared filesystem.",
    ),
    studies_dir: Path = typer.Option(Path("studies"), help="Folder that holds study folders."),
    resume: bool = typer.Option(False, "--resume", help="Continue an existing study."),
    worker: str = typer.Option(
        None,
        help="This worker's name in a shared study, kept with every trial it runs (default: the host name); "
        "workers on one host need different names.",
    ),
    rig: Path = typer.Option(
        None,
        help="Reuse a rig file (studies/NAME/rig.json): restart only where it cannot answer (one start "
        "at the largest k for acceptance; a drafter or level it lacks; --check).",
    ),
    check: bool = typer.Option(False, "--check", help="With --rig: also measure the predicted optimum."),
) -> None:
    """Tune draft length and draft sampling: restart the server for each config, measure, recommend.

    Without --config it runs on the built-in emulator (the default profile reproduces a two-box
    DGX Spark running DeepSeek-V4-Flash with a 5-token drafter) and says so. Every trial is kept
    in an optuna study under studies/NAME/ (optuna-dashboard opens its study.db); --resume
    continues one after a stop or a crash. On a shared --storage every machine runs the same
    command with its own server config: the first one creates the study, the others join it.
    """
    if config is None:
        chosen = default_study(workload or "technical")
    else:
        chosen = load_study_config(config)
        if workload:
            chosen = replace(chosen, workloads={workload: 1.0})
    if study_name:
        chosen = replace(chosen, name=study_name)
    out = Console(soft_wrap=True)
    paths = study_paths(chosen, studies_dir, storage)
    shared = is_shared(paths.storage)
    if config is None and not resume and not shared and study_exists(chosen.name, paths.storage):
        # The built-in demo picks up where it left off instead of refusing to run twice.
        out.print(
            f"study {chosen.name} exists in {shown(paths.storage)}: continuing it (--study-name NAME starts afresh)"
        )
        resume = True
    on_emulator = chosen.server.engine == "emulator"
    if on_emulator:
        out.print(
            f"[bold yellow]Running on the built-in emulator[/bold yellow] (profile {chosen.server.emulator.profile}, "
            f"time scale {chosen.server.emulator.time_scale:g}): figures are modelled, not your hardware's. "
            "Point --config at a study file to tune a real server."
        )
    status = out.status("opening the study")
    worker = worker or default_worker()
    if rig is not None:
        loaded = load_rig(rig)
        with status:
            result = run_rig_study(
                chosen, paths, loaded, check=check, resume=resume, on_event=_printer(out, status), worker=worker
            )
        print_rig_study(out, result, rig)
        return
    runner = StudyRunner(chosen, paths, resume=resume, on_event=_printer(out, status), worker=worker)
    out.print(
        f"study [bold]{chosen.name}[/bold]: {runner.space.size()} distinct configurations, sampler {chosen.sampler}, "
        f"workloads {', '.join(chosen.workloads)}, concurrency {list(chosen.measure.concurrency)}, "
        f"temperature {chosen.measure.temperature:g}; storage {shown(paths.storage)}"
        + (f"; worker {worker}, {len(runner.study.trials)} trials in the study so far" if shared else "")
    )
    with status:
        outcome = runner.run(max_trials=trials)
    out.print(f"\nstopped: {outcome.stop_reason} ({outcome.restarts} server restarts this run)")
    print_recommendation(out, outcome, chosen)
    _write_rig(out, outcome, chosen, paths.folder)
    if paths.storage.startswith("sqlite:///"):
        out.print(f"figures, tables and fits: specsweep report {paths.folder}")


def _write_rig(out: Console, outcome: StudyOutcome, config: StudyConfig, folder: Path) -> None:
    """The study's step-cost model as a rig file beside it, for measure --rig and study --rig."""
    try:
        built = build_rig(outcome.study, folder, server=config.server)
    except (FitError, ConfigError) as exc:
        out.print(f"no rig file: {exc}")
        return
    write_rig(folder / RIG_FILE, built)
    out.print(f"rig (step cost per k and concurrency, no workload in it): {folder / RIG_FILE}")


def _describe(spec: Any) -> str:
    if spec is None:
        return "speculation off"
    return f"k={spec.num_speculative_tokens} {spec.draft_sample_method}"


def _printer(out: Console, status: Any):
    """One line per trial; a transient status line with the phase and live tok/s on a terminal."""
    tokens: dict[str, float] = {}

    def on_event(kind: str, data: dict[str, Any]) -> None:
        trial = data.get("trial")
        if kind == "note":
            out.print(f"note: {data['text']}")
        elif kind == "starting":
            status.update(f"trial {trial}: starting the server ({_describe(data['spec'])})")
        elif kind == "ready":
            status.update(f"trial {trial}: server ready after {data['startup_s']:.1f} s")
        elif kind == "measure.warmup":
            status.update(f"trial {trial}: {data['workload']} warming up at concurrency {data['concurrency']}")
            tokens.clear()
        elif kind == "measure.level":
            tokens["start"] = time.monotonic()
            tokens["count"] = 0
        elif kind == "measure.request":
            tokens["count"] = tokens.get("count", 0) + (data["record"].completion_tokens or 0)
            elapsed = time.monotonic() - tokens.get("start", time.monotonic())
            live = f", {tokens['count'] / elapsed:,.0f} tok/s wall clock" if elapsed > 0 else ""
            status.update(f"trial {trial}: {data['workload']} measuring concurrency {data['concurrency']}{live}")
        elif kind == "done":
            rates = "; ".join(
                f"{w} " + ", ".join(f"{row['output_tokens_per_s']:.1f} at {c}" for c, row in levels.items())
                for w, levels in data["results"].items()
            )
            out.print(f"trial {trial:3d}  {_describe(data['spec']):22s} {rates} tok/s")
        elif kind == "plan" and data["params"] is not None:
            out.print(f"          next: {data['phase']}: {data['reason']}")
        elif kind == "failed":
            out.print(f"trial {trial:3d}  [red]failed[/red]: {data['reason']}")
        elif kind == "reused":
            out.print(f"trial {trial:3d}  same server as trial {data['source']}: result reused, no restart")
        elif kind == "elsewhere":
            out.print(f"trial {trial:3d}  worker {data['worker']} measures this configuration (trial {data['source']})")
        elif kind == "waiting":
            status.update(f"other workers measure the rest (trials {data['trials']}): waiting for them")

    return on_event


def print_recommendation(out: Console, outcome: StudyOutcome, config: StudyConfig) -> None:
    """Best measured config per workload and concurrency, the overall pick and its snippet."""
    configs = measured_configs(outcome.study)
    if not configs:
        out.print("[red]no configuration was measured successfully; see the trial logs in the study folder.[/red]")
        return
    baseline_key = outcome.study.user_attrs.get("baseline_key")
    out.print("\n[bold]best measured configuration[/bold] (aggregate output tok/s, wall clock, client-side)")
    for name in config.workloads:
        for level in config.measure.concurrency:
            pick = pick_best(configs, workload=name, concurrency=level, baseline_key=baseline_key)
            if pick is None:
                continue
            gains = []
            if pick.off_rate:
                gains.append(f"{100 * (pick.rate / pick.off_rate - 1):+.1f}% vs speculation off")
            if pick.baseline_rate:
                gains.append(f"{100 * (pick.rate / pick.baseline_rate - 1):+.1f}% vs baseline")
            gap = f"; runner-up {100 * pick.runner_up_gap:.1f}% slower" if pick.runner_up_gap is not None else ""
            out.print(
                f"  {name} at concurrency {level}: {_describe(pick.best.spec)}  {pick.rate:.1f} tok/s  "
                f"({', '.join(gains) or 'no reference measured'}{gap})"
            )
    best = best_overall(configs)
    if best is None:
        out.print("[red]no configuration met the objective's constraints.[/red]")
        return
    fmt = snippet_format_for(config.server.engine)
    try:
        analysis, _, _ = analyze_stored_study(outcome.study)
    except FitError as exc:
        out.print(f"\n[yellow]no model-based recommendation ({exc}); the best measured configuration:[/yellow]")
        out.print(render_snippet(best.spec, fmt), highlight=False, markup=False)
    else:
        print_analysis(out, analysis, fmt)
    _print_boot(out, best, on_emulator=config.server.engine == "emulator")


def _print_boot(out: Console, best: Any, *, on_emulator: bool) -> None:
    """What the best measured configuration's server said at boot."""
    boot = best.boot
    facts = []
    if best.startup_s is not None:
        facts.append(f"started in {best.startup_s:.1f} s" + (" (wall clock, time-scaled)" if on_emulator else ""))
    if boot.get("kv_cache_tokens"):
        facts.append(f"KV cache {boot['kv_cache_tokens']:,} tokens")
    if boot.get("max_concurrency"):
        facts.append(f"max concurrency {boot['max_concurrency']:.2f}x")
    if boot.get("memory_suggestions"):
        shown = ", ".join(f"{x:.4f}" for x in boot["memory_suggestions"])
        facts.append(
            f"--gpu-memory-utilization suggestions per rank {shown} (the pool is the minimum over ranks: "
            f"use the largest, {boot['binding_memory_suggestion']:.4f})"
        )
    if boot.get("fp8_default_kernel_warning"):
        facts.append("the log warns that the default FP8 kernel config is used (a tuned one may be faster)")
    if facts:
        out.print(f"boot of trial {best.trial}: " + "; ".join(facts))
