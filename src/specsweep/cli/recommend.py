"""``specsweep recommend``: the config snippet for a stored study, and the recommendation lines."""

from __future__ import annotations

from pathlib import Path

import typer

from specsweep.cli.options import check_finite, one_of
from specsweep.engines.registry import engine_of_format
from specsweep.errors import ConfigError
from specsweep.report.snippets import FORMATS, snippet_format_for
from specsweep.report.study_report import snippet_for
from specsweep.tuning.stored import analyze_stored_study, load_stored_study

# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = ("specsweep recommend studies/emulator-technical --format vllm",)


def recommend(
    folder: Path = typer.Argument(
        None,
        metavar="FOLDER",
        help="Study folder, e.g. studies/emulator-technical (required unless --storage and --study-name).",
    ),
    fmt: str = typer.Option(
        None,
        "--format",
        callback=one_of(FORMATS),
        help="vllm, vllm-yaml, compose, sglang, llama.cpp or json (default: the engine's).",
    ),
    workload: str = typer.Option(None, help="Workload whose recommendation to print (default: the study's first)."),
    storage: str = typer.Option(None, help="Optuna storage URL instead of the folder's study.db."),
    study_name: str = typer.Option(None, help="Study name in --storage (default: the folder's name)."),
    max_itl_p99: float = typer.Option(
        None,
        callback=check_finite,
        min=0.001,
        help="A latency target: recommend only configurations whose inter-token latency p99 is within this many ms.",
    ),
) -> None:
    """Print the recommended speculative config as a snippet ready to paste, and nothing else.

    The draft length and drafter come from the study's fits and throughput model (see `specsweep
    report`); when the best k differs across the measured concurrency levels, the vLLM forms
    carry a num_speculative_tokens_per_batch_size table.
    """
    study = load_stored_study(folder, storage=storage, name=study_name)
    stored = analyze_stored_study(
        study,
        paste_engine=engine_of_format(fmt).name if fmt else None,
        max_itl_p99_s=max_itl_p99 / 1000 if max_itl_p99 else None,
    )
    analysis = stored.analysis
    fmt = fmt or snippet_format_for(stored.settings.engine)
    chosen = workload or analysis.workloads[0]
    if chosen not in analysis.workloads:
        raise ConfigError(f"the study measured no workload {chosen!r}; it has {', '.join(analysis.workloads)}.")
    plan = analysis.snippet(chosen)
    # What the paste gives up, and a version whose vocabulary specsweep does not know, as comment
    # lines (JSON has none: there, on stderr).
    engine = engine_of_format(fmt)
    known = engine.vocabulary_note(stored.settings.engine_version) if engine.name == stored.settings.engine else None
    for line in [*(plan.unmeasured + plan.given_up if plan else ()), *([known] if known else [])]:
        typer.echo(f"# {line}", err=fmt == "json")
    typer.echo(snippet_for(analysis, chosen, fmt, settings=stored.settings))
