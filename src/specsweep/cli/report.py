"""``specsweep report``: fits, figures, tables and the recommendation from a stored study."""

from __future__ import annotations

from pathlib import Path

import optuna
import typer

from specsweep.cli.options import check_finite, one_of
from specsweep.cli.printers import fitted_console
from specsweep.cli.study_printers import print_paste, print_picks
from specsweep.engines.registry import engine_of_format
from specsweep.errors import ConfigError
from specsweep.names import check_name
from specsweep.report.figures import TrialPoint
from specsweep.report.snippets import FORMATS, snippet_format_for
from specsweep.report.study_report import write_report
from specsweep.tuning.records import read_trials
from specsweep.tuning.stored import analyze_stored_study, load_stored_study


def trial_history(study: optuna.Study) -> list[TrialPoint]:
    """Every trial of the study as the history figure needs it."""
    return [
        TrialPoint(
            number=t.number,
            state=t.state.name,
            value=t.value,
            label=t.spec.to_json() if t.spec else "speculation off",
        )
        for t in read_trials(study)
    ]


# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = ("specsweep report studies/emulator-technical",)


def report(
    folder: Path = typer.Argument(
        None,
        metavar="FOLDER",
        help="Study folder, e.g. studies/emulator-technical (required unless --storage and --study-name).",
    ),
    out: Path = typer.Option(None, help="Folder to write the report in (default: FOLDER/report)."),
    fmt: str = typer.Option(
        None,
        "--format",
        callback=one_of(FORMATS),
        help="Format of the snippet in the report: vllm, vllm-yaml, compose, sglang, llama.cpp or json "
        "(default: the engine's).",
    ),
    snippet_format: str = typer.Option(
        None, "--snippet-format", hidden=True, callback=one_of(FORMATS), help="Old spelling of --format."
    ),
    storage: str = typer.Option(None, help="Optuna storage URL instead of the folder's study.db."),
    study_name: str = typer.Option(None, help="Study name in --storage (default: the folder's name)."),
    max_itl_p99: float = typer.Option(
        None,
        callback=check_finite,
        min=0.001,
        help="A latency target: recommend only configurations whose inter-token latency p99 is within this many ms.",
    ),
    verbose: bool = typer.Option(False, "--verbose", help="Also print why each pick won (report.md has it all)."),
) -> None:
    """Write the study's report: figures, report.md, a self-contained report.html, results.json.

    Acceptance-decay fits (geometric, logistic, exponential decay, beta-geometric; chosen by
    AIC), a throughput model against draft length per concurrency, the recommended k per
    workload and concurrency with intervals, and the snippet to paste. Uses stored data only:
    a copied study folder reports with no server.
    """
    fmt = fmt or snippet_format
    study = load_stored_study(folder, storage=storage, name=study_name)
    if out is not None or folder is not None:
        target = out or Path(folder) / "report"
    else:  # the name is the storage's, chosen by whoever made the study: it must stay one folder here
        try:
            target = Path(f"{check_name(study.study_name, what='the study name in --storage')}-report")
        except ConfigError as exc:
            raise ConfigError(f"{exc} Pass --out DIR to write its report elsewhere.") from None
    stored = analyze_stored_study(
        study,
        paste_engine=engine_of_format(fmt).name if fmt else None,
        max_itl_p99_s=max_itl_p99 / 1000 if max_itl_p99 else None,
    )
    analysis, configs, settings = stored.analysis, stored.configs, stored.settings
    fmt = fmt or snippet_format_for(settings.engine)
    files = write_report(
        analysis, configs, settings, trial_history(study), target, name=study.study_name, snippet_format=fmt
    )
    console = fitted_console()
    print_picks(console, analysis, verbose=verbose, configs=configs)
    limit_s = max_itl_p99 / 1000 if max_itl_p99 else settings.max_itl_p99_s
    if limit_s:
        said = "" if verbose else "; --verbose says where it is not met"
        console.print(f"latency target: inter-token latency p99 at most {1000 * limit_s:g} ms{said}")
    print_paste(console, analysis, fmt, settings=settings)
    written = [p.name for p in (files.markdown, files.html, files.results, files.table) if p is not None]
    console.print(f"\nwrote {', '.join(written)} and {len(files.figures)} figures in {files.folder}")
