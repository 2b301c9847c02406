"""``specsweep recommend``: the config snippet for a stored study, and the recommendation lines."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from specsweep.analysis.study import StudyAnalysis
from specsweep.cli.options import one_of
from specsweep.errors import ConfigError
from specsweep.report.snippets import FORMATS, render_snippet, snippet_format_for
from specsweep.report.study_report import recommendation_summary
from specsweep.tuning.recommend import analyze_stored_study, load_stored_study


def recommend(
    folder: Path = typer.Argument(None, help="Study folder, e.g. studies/emulator-technical."),
    fmt: str = typer.Option(
        None,
        "--format",
        callback=one_of(FORMATS),
        help="vllm, vllm-yaml, compose, sglang, llama.cpp or json (default: the engine's).",
    ),
    workload: str = typer.Option(None, help="Workload whose recommendation to print (default: the study's first)."),
    storage: str = typer.Option(None, help="Optuna storage URL instead of the folder's study.db."),
    study_name: str = typer.Option(None, help="Study name in --storage (default: the folder's name)."),
) -> None:
    """Print the recommended speculative config as a snippet ready to paste, and nothing else.

    The draft length and drafter come from the study's fits and throughput model (see `specsweep
    report`); when the best k differs across the measured concurrency levels, the vLLM forms
    carry a num_speculative_tokens_per_batch_size table.
    """
    study = load_stored_study(folder, storage=storage, name=study_name)
    analysis, _, settings = analyze_stored_study(study)
    fmt = fmt or snippet_format_for(settings["engine"])
    chosen = workload or analysis.workloads[0]
    if chosen not in analysis.workloads:
        raise ConfigError(f"the study measured no workload {chosen!r}; it has {', '.join(analysis.workloads)}.")
    plan = analysis.snippet(chosen)
    typer.echo(render_snippet(plan.spec if plan else None, fmt))


def print_analysis(out: Console, analysis: StudyAnalysis, fmt: str) -> None:
    """The recommendation per workload and concurrency, why, and the snippet per workload."""
    out.print(
        "\n[bold]recommended[/bold] (fitted acceptance x modelled step time; aggregate output tok/s, 95% intervals)"
    )
    for rec in analysis.recommendations:
        out.print(f"  {recommendation_summary(rec)}")
        out.print(f"    [dim]{rec.reason}[/dim]")
    for note in analysis.notes:
        out.print(f"  [yellow]note:[/yellow] {note}")
    for workload in analysis.workloads:
        plan = analysis.snippet(workload)
        if plan is None:
            continue
        if plan.table:
            out.print(f"{workload}: k by concurrency {plan.k_by_concurrency}, as vLLM's per-batch-size table:")
        elif len(analysis.workloads) > 1:
            out.print(f"{workload}:")
        out.print(render_snippet(plan.spec, fmt), highlight=False, markup=False)
