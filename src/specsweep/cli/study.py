"""``specsweep study``: start the server once per configuration, measure, and recommend."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import optuna
import typer
from rich.console import Console

from specsweep.analysis.drafters import configuration_label
from specsweep.cli.context_from import apply_context_from
from specsweep.cli.context_room import refuse_context_levels
from specsweep.cli.options import check_finite, check_levels
from specsweep.cli.plan_printer import print_plan
from specsweep.cli.printers import fitted_console, print_best_measured
from specsweep.cli.rig_printers import print_rig_study
from specsweep.cli.study_printers import (
    print_boot,
    print_header,
    print_paste,
    print_picks,
    print_stop,
)
from specsweep.cli.study_progress import StudyProgress, TrialRows
from specsweep.config import (
    EmulatorServer,
    MeasureConfig,
    Objective,
    SearchSpace,
    ServerConfig,
    StudyConfig,
    load_study_config,
    parse_concurrency,
    parse_context,
)
from specsweep.emulator.profile import DEFAULT_PROFILE, load_profile
from specsweep.engines.registry import engine_info, max_model_len_flag
from specsweep.errors import ConfigError, FitError, SpecsweepError
from specsweep.names import check_name
from specsweep.report.snippets import render_snippet, snippet_format_for
from specsweep.rigs.file import RIG_FILE, load_rig, write_rig
from specsweep.rigs.stored import build_rig
from specsweep.rigs.study import run_rig_study
from specsweep.tuning.plan import plan_study
from specsweep.tuning.records import measured_configs
from specsweep.tuning.storage import default_worker, is_shared, redact_password
from specsweep.tuning.stored import analyze_stored_study, best_overall, nothing_to_compare
from specsweep.tuning.study import StudyOutcome, StudyRunner
from specsweep.tuning.study_settings import read_study_settings
from specsweep.tuning.study_store import StudyPaths, check_resumable, check_study_free, study_exists, study_paths

# The default study: the emulator's default profile (the DGX Spark field report), the report's
# current configuration as the baseline, draft lengths 1 to 5 with both draft methods at the
# profile's reference temperature. Sized to finish in about a minute on 2 cores.


BUILT_IN = "built-in emulator study"  # the source of the study run without --config


def default_study(workload: str) -> StudyConfig:
    """The study ``specsweep study --workload W`` runs when no --config is given."""
    profile = load_profile(DEFAULT_PROFILE)
    return StudyConfig(
        name=f"emulator-{Path(workload).stem}",
        sampler="model",
        server=ServerConfig(
            engine="emulator",
            mode="emulator",
            # The profile's own 4-minute start (2.4 s of wall clock at time scale 100): what a start costs.
            emulator=EmulatorServer.demo(DEFAULT_PROFILE),
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
            concurrency=(1, 4), max_requests=12, max_tokens=600, temperature=profile.reference_temperature
        ),
        objective=Objective(concurrency=1),
        source=BUILT_IN,
    )


# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = (
    "specsweep study --workload technical",
    "specsweep study --workload technical --concurrency 1,4,16 --max-tokens 300 --temperature 0.6 --dry-run",
    "specsweep study --config studies/dgx-spark.toml --requests 16 --dry-run",
    "specsweep study --workload technical --context 16k,64k",
    "specsweep study --workload technical --context-from prompts.jsonl --dry-run",
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
        help="Reuse a rig file (studies/NAME/rig.json): start the server only where it cannot answer (one start "
        "at the largest k for acceptance; a drafter or level it lacks; --check).",
    ),
    check: bool = typer.Option(False, "--check", help="With --rig: also measure the predicted optimum."),
    concurrency: str = typer.Option(
        None,
        callback=check_levels,
        help="Concurrency levels to measure, e.g. 1,4,16; overrides measure.concurrency (default: the config's).",
    ),
    context: str = typer.Option(
        None,
        help="Context levels in prompt tokens, e.g. 16384,65536 or 16k,64k: each workload W is also measured as "
        "W@16k, W@64k in the same starts; overrides measure.context (default: the config's, none).",
    ),
    context_from: str = typer.Option(
        None,
        "--context-from",
        help="Context levels and their weights from your own traffic: a file of prompts (any format workloads "
        "import reads) or a watch --out folder; overrides measure.context and its weights.",
    ),
    requests: int = typer.Option(
        None,
        min=1,
        help="Measure every level with exactly this many requests; overrides measure.requests "
        "(default: adaptive, docs/search.md).",
    ),
    max_tokens: int = typer.Option(
        None, min=1, help="max_tokens of every request; overrides measure.max_tokens (default: the config's)."
    ),
    temperature: float = typer.Option(
        None,
        callback=check_finite,
        min=0.0,
        max=2.0,
        help="Sampling temperature of every request; overrides measure.temperature (default: the config's).",
    ),
    tolerance: float = typer.Option(
        None,
        callback=check_finite,
        min=0.0001,
        max=0.49,
        help="Differences under this share of a rate do not matter (default: the config's study.tolerance, "
        "0.01): such leaders are either-is-fine and never separated by starts (docs/search.md).",
    ),
    max_itl_p99: float = typer.Option(
        None,
        callback=check_finite,
        min=0.001,
        help="A latency target: recommend only configurations whose inter-token latency p99 is within this many ms.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan and every configuration's server command; start nothing."
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Also print what the search said before each start, the best measured configurations, why each pick "
        "won, and the stop, leaders and boot lines in full.",
    ),
) -> None:
    """Tune draft length and draft sampling: start the server once per configuration, measure, recommend.

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
        chosen = replace(chosen, name=check_name(study_name, what="--study-name"))
    chosen = override_measure(
        chosen, concurrency=concurrency, requests=requests, max_tokens=max_tokens, temperature=temperature
    )
    if context is not None and context_from is not None:
        raise ConfigError("--context and --context-from both give the context levels; pass one of them.")
    if context is not None:  # the file's levels, and their shares, are replaced
        levels = parse_context(context)
        chosen = replace(chosen, measure=replace(chosen.measure, context=levels, context_shares=(), context_from=None))
    said = None  # the levels from the user's traffic, in one line
    if (from_path := context_from or chosen.measure.context_from) is not None:
        where = "--context-from" if context_from else f"{chosen.source}: measure.context_from"
        chosen, said = apply_context_from(chosen, from_path, where=where)
    if tolerance is not None:
        chosen = replace(chosen, tolerance=tolerance)
    if max_itl_p99 is not None:
        chosen = replace(chosen, objective=replace(chosen.objective, max_itl_p99_s=max_itl_p99 / 1000))
    if chosen.server.mode == "emulator":
        load_profile(chosen.server.emulator.profile)  # a wrong profile fails here, not in every trial's start
    try:
        refuse_what_no_server_answers(chosen, key="--max-tokens" if max_tokens is not None else "measure.max_tokens")
        key = "--context" if context is not None else "--context-from" if context_from else "measure.context"
        key = "measure.context_from" if key == "measure.context" and said else key
        refuse_context_levels(chosen, known_max_model_len(chosen.server), key=key)
    except ConfigError as exc:
        if max_tokens is None and context is None and context_from is None:
            raise
        raise typer.BadParameter(str(exc)) from None  # a usage error: click adds the command's usage line
    out = fitted_console()
    if dry_run:
        if said:
            out.print(said, markup=False)
        print_plan(Console(soft_wrap=True), plan_study(chosen))
        return
    paths = study_paths(chosen, studies_dir, storage)
    shared = is_shared(paths.storage)
    worker = worker or default_worker()
    check_study_free(chosen.name, paths, worker)  # another live run on it: one line, nothing changed
    continuing = ""
    if config is None and not resume and not shared and study_exists(chosen.name, paths.storage):
        # The built-in demo picks up where it left off instead of refusing to run twice.
        continuing = "continuing the stored study (--study-name NAME starts afresh)"
        resume = True
    if resume and not shared:
        check_resumable(chosen.name, paths, studies_dir)  # before anything is created
    rows = TrialRows(out, workloads=list(chosen.workloads), levels=chosen.measure.concurrency, labels=())
    progress = StudyProgress(out, rows, verbose=verbose)
    if rig is not None:
        loaded = load_rig(rig)
        if said:
            out.print(said, markup=False)
        with progress:
            result = run_rig_study(chosen, paths, loaded, check=check, resume=resume, on_event=progress, worker=worker)
        print_rig_study(out, result, rig)
        return
    runner = StudyRunner(chosen, paths, resume=resume, on_event=progress, worker=worker)
    progress.rows = trial_rows(out, chosen, runner)
    print_header(
        out, chosen, size=runner.space.size(), storage=redact_password(paths.storage), built_in=config is None,
        extra=f"; worker {worker}, {len(runner.study.trials)} trials in the study so far" if shared else "",
    )  # fmt: skip
    if said:
        out.print(said, markup=False)
    if continuing:
        out.print(continuing)
    with progress:
        outcome = runner.run(max_trials=trials)
    print_outcome(out, outcome, chosen, paths, verbose=verbose)


def trial_rows(out: Console, config: StudyConfig, runner: StudyRunner) -> TrialRows:
    """The rows a run prints, aligned for its space's labels; speculation off's rates measured by an
    earlier run are what its rows are compared with."""
    levels = config.measure.concurrency
    labels = [configuration_label(c, short=True) for c in runner.space.configurations()]
    off = {}
    for measured in measured_configs(runner.study):
        if measured.spec is None:
            off.update({(w, b): r for w in config.workloads for b in levels if (r := measured.rate(w, b))})
    return TrialRows(out, workloads=list(config.workloads), levels=levels, labels=labels, off=off)


def print_outcome(
    out: Console, outcome: StudyOutcome, config: StudyConfig, paths: StudyPaths, *, verbose: bool
) -> None:
    """After the run: why it stopped, its time and leaders, the rig file, the boot, the picks, the paste
    and where the report is; a study that measured nothing is a failure, and says why."""
    print_stop(out, outcome.stop_reason, outcome.starts, outcome.time, outcome.ties, verbose=verbose)
    on_emulator = config.server.engine == "emulator"
    if not measured_configs(outcome.study):
        _print_results(out, outcome.study, on_emulator=on_emulator, verbose=verbose)
        raise SpecsweepError(f"study {config.name} measured no configuration: {outcome.stop_reason}")
    _write_rig(out, outcome, config, paths.folder)
    reported = _print_results(out, outcome.study, on_emulator=on_emulator, verbose=verbose)
    if reported and paths.storage.startswith("sqlite:///"):
        out.print(f"\nfigures, tables and fits: specsweep report {paths.folder}")


def override_measure(
    config: StudyConfig,
    *,
    concurrency: str | None = None,
    requests: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> StudyConfig:
    """``config`` with the [measure] keys given on the command line (None: the file's, or the built-in
    study's). Levels that leave out the objective's concurrency are refused with a study file; the
    built-in study measures its objective at the lowest level given."""
    measure = config.measure
    objective = config.objective
    if concurrency is not None:
        levels = parse_concurrency(concurrency)
        measure = replace(measure, concurrency=levels)
        if objective.concurrency not in levels:
            if config.source != BUILT_IN:
                raise typer.BadParameter(
                    f"--concurrency {concurrency} leaves out objective.concurrency ({objective.concurrency}) "
                    f"of {config.source}; add that level, or change [objective] in the file.",
                )
            objective = replace(objective, concurrency=min(levels))
    if requests is not None:
        measure = replace(measure, requests=requests)
    if max_tokens is not None:
        measure = replace(measure, max_tokens=max_tokens)
    if temperature is not None:
        measure = replace(measure, temperature=temperature)
    return replace(config, measure=measure, objective=objective)


def known_max_model_len(server: ServerConfig) -> tuple[int, str] | None:
    """The server's max model length where it is known before a start, and where it comes from: the
    emulator's profile, or the start command's flag (--max-model-len, --context-length, -c)."""
    if server.mode == "emulator":
        return load_profile(server.emulator.profile).max_model_len, f"profile {server.emulator.profile}"
    if server.start is None:
        return None
    argv = shlex.split(server.start) if isinstance(server.start, str) else server.start
    found = max_model_len_flag(engine_info(server.engine), argv)
    return (found[0], f"{found[1]} in server.start") if found else None


def refuse_what_no_server_answers(config: StudyConfig, *, key: str = "measure.max_tokens") -> None:
    """Refuse, before any start, a study whose every request the server would refuse: a max_tokens
    beyond the server's max model length (prompt and completion share it); ``key`` is where it was set."""
    known = known_max_model_len(config.server)
    asked = config.measure.max_tokens
    if known is not None and asked >= known[0]:
        where = key if key.startswith("--") else f"{config.source}: {key}"
        raise ConfigError(
            f"{where} ({asked:,}) leaves no room for a prompt in the server's max "
            f"model length ({known[0]:,}, {known[1]}): every request would be refused; lower {key}."
        )


def _print_results(out: Console, study: optuna.Study, *, on_emulator: bool, verbose: bool = False) -> bool:
    """The best measured configuration's boot, the picks per workload and concurrency and the paste
    (``verbose``: the best measured configurations too); False when the study holds too little to report on."""
    configs = measured_configs(study)
    if not configs:
        out.print("[red]no configuration was measured successfully; see the trial logs in the study folder.[/red]")
        return False
    settings = read_study_settings(study, configs)
    best = best_overall(configs)
    if best is not None:
        print_boot(out, best, on_emulator=on_emulator, verbose=verbose)
    if verbose:
        print_best_measured(out, configs, settings)
    too_little = nothing_to_compare(configs, study)
    if too_little is not None:
        out.print(f"\n[yellow]no recommendation[/yellow]: {too_little}")
        return False
    if best is None:
        out.print("[red]no configuration met the objective's constraints.[/red]")
        return True
    fmt = snippet_format_for(settings.engine)
    try:
        stored = analyze_stored_study(study, configs=configs, settings=settings)
    except FitError as exc:
        out.print(f"\n[yellow]no model-based recommendation ({exc}); the best measured configuration:[/yellow]")
        out.print(render_snippet(best.spec, fmt), soft_wrap=True, highlight=False, markup=False)
    else:
        print_picks(out, stored.analysis, verbose=verbose, configs=stored.configs)
        print_paste(out, stored.analysis, fmt, settings=stored.settings)
    return True


def _write_rig(out: Console, outcome: StudyOutcome, config: StudyConfig, folder: Path) -> None:
    """The study's step-cost model as a rig file beside it, for measure --rig and study --rig."""
    try:
        built = build_rig(outcome.study, folder, server=config.server)
    except (FitError, ConfigError) as exc:
        out.print(f"no rig file: {exc}")
        return
    write_rig(folder / RIG_FILE, built)
    out.print(f"rig: {folder / RIG_FILE} (step cost per k and concurrency)", highlight=False)
