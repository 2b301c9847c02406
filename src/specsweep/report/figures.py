"""The report's figures: data computed by pure functions, then drawn by matplotlib.

Three figures per study: acceptance decay per workload (measured S_i and p_i with Wilson bars,
the AIC-chosen fit and its band past the measured positions, per drafter), throughput against
draft length per workload (one panel per concurrency: measured points, the model's line and
band, the recommended k marked), and the study history (every trial's objective, the best so
far, failed trials). Tests assert on the ``*_figure_data`` records; ``render_figure`` writes them
to PNG and ``draw_figure`` returns the open figure for a notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from specsweep.analysis.drafters import Drafter, drafter_label
from specsweep.analysis.study import StudyAnalysis
from specsweep.errors import OutputError
from specsweep.runtime.store import make_folder

DPI = 110


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One line or set of points: x, y and optional error bars or band (low/high)."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    style: str = "line"  # "line", "band" (line with shaded low..high), "points" (with error bars), "marker", "bars"
    width: float = 0.8  # of each bar ("bars")


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: tuple[Series, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureData:
    title: str
    panels: tuple[Panel, ...]


def acceptance_figure_data(analysis: StudyAnalysis, workload: str) -> FigureData:
    """S_i and p_i against position for every drafter fitted on ``workload``."""
    unconditional: list[Series] = []
    conditional: list[Series] = []
    for entry in (a for a in analysis.acceptance if a.workload == workload):
        fit, name = entry.fit, drafter_label(entry.drafter)
        pos = fit.positions
        unconditional.append(
            Series(
                label=f"{name}: measured (trial {entry.trial})",
                x=tuple(float(p.position) for p in pos),
                y=tuple(p.per_position for p in pos),
                low=tuple(p.per_position_low for p in pos),
                high=tuple(p.per_position_high for p in pos),
                style="points",
            )
        )
        chosen = fit.model(fit.chosen)
        unconditional.append(
            Series(
                label=f"{name}: {fit.chosen} fit",
                x=tuple(float(p.num_speculative_tokens) for p in fit.prediction),
                y=tuple(chosen.per_position[: len(fit.prediction)]),
                low=tuple(p.per_position_low for p in fit.prediction),
                high=tuple(p.per_position_high for p in fit.prediction),
                style="band",
            )
        )
        reached = [p for p in pos if p.conditional is not None]
        conditional.append(
            Series(
                label=f"{name}: measured",
                x=tuple(float(p.position) for p in reached),
                y=tuple(float(p.conditional or 0.0) for p in reached),
                low=tuple(float(p.conditional_low or 0.0) for p in reached),
                high=tuple(float(p.conditional_high or 0.0) for p in reached),
                style="points",
            )
        )
        conditional.append(
            Series(
                label=f"{name}: {fit.chosen} fit",
                x=tuple(float(i) for i in range(1, len(chosen.conditional) + 1)),
                y=tuple(chosen.conditional),
                style="line",
            )
        )
    return FigureData(
        title=f"Acceptance decay, {workload}",
        panels=(
            Panel(
                title="per-position acceptance S_i = P(A >= i)",
                xlabel="draft position i",
                ylabel="S_i",
                series=tuple(unconditional),
            ),
            Panel(
                title="conditional acceptance p_i = S_i / S_(i-1)",
                xlabel="draft position i",
                ylabel="p_i",
                series=tuple(conditional),
            ),
        ),
    )


def throughput_figure_data(analysis: StudyAnalysis, workload: str) -> FigureData:
    """Predicted and measured aggregate tok/s against k, one panel per concurrency level."""
    panels = []
    model = analysis.models.get(workload)
    for block in (p for p in analysis.predictions if p.workload == workload):
        series: list[Series] = []
        drafters = sorted(
            {r.candidate.drafter for r in block.rows if r.candidate.drafter is not None},
            key=lambda d: (d.method, d.draft_sample_method),
        )
        off = next((r for r in block.rows if r.candidate.off), None)
        for drafter in drafters:
            rows = [r for r in block.rows if r.candidate.drafter == drafter or r.candidate.off]
            rows.sort(key=lambda r: r.candidate.num_speculative_tokens)
            series.append(
                Series(
                    label=f"{drafter_label(drafter)}: model",
                    x=tuple(float(r.candidate.num_speculative_tokens) for r in rows),
                    y=tuple(r.tokens_per_s for r in rows),
                    low=tuple(r.tokens_per_s_low for r in rows),
                    high=tuple(r.tokens_per_s_high for r in rows),
                    style="band",
                )
            )
        if model is not None:
            measured: dict[Drafter | None, list[tuple[float, float]]] = {}
            for o in model.observations:
                if o.concurrency == block.concurrency and o.workload == workload:
                    key = None if o.num_speculative_tokens == 0 else o.drafter
                    measured.setdefault(key, []).append((float(o.num_speculative_tokens), o.output_tokens_per_s))
            for measured_drafter, points in sorted(measured.items(), key=lambda item: drafter_label(item[0])):
                points.sort()
                series.append(
                    Series(
                        label=f"{drafter_label(measured_drafter)}: measured",
                        x=tuple(p[0] for p in points),
                        y=tuple(p[1] for p in points),
                        style="points",
                    )
                )
        rec = analysis.recommendation(workload, block.concurrency)
        if rec is not None:
            series.append(
                Series(
                    label=f"recommended: {rec.choice.label}",
                    x=(float(rec.choice.num_speculative_tokens),),
                    y=(rec.tokens_per_s,),
                    style="marker",
                )
            )
        if off is not None and not drafters:
            series.append(Series(label="speculation off: model", x=(0.0,), y=(off.tokens_per_s,), style="marker"))
        panels.append(
            Panel(
                title=f"concurrency {block.concurrency}",
                xlabel="num_speculative_tokens (0 = speculation off)",
                ylabel="aggregate output tok/s",
                series=tuple(series),
            )
        )
    return FigureData(title=f"Throughput against draft length, {workload}", panels=tuple(panels))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialPoint:
    """One trial of the study for the history figure."""

    number: int
    state: str  # optuna's: COMPLETE, FAIL, PRUNED, ...
    value: float | None
    label: str


def history_figure_data(trials: Sequence[TrialPoint], objective_label: str) -> FigureData:
    """Each trial's objective in order, the best so far, failed trials on the axis."""
    done = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    failed = [t for t in trials if t.state == "FAIL"]
    best, running = [], float("-inf")
    for t in done:
        running = max(running, float(t.value or 0.0))
        best.append(running)
    series = [
        Series(
            label="measured",
            x=tuple(float(t.number) for t in done),
            y=tuple(float(t.value or 0) for t in done),
            style="points",
        ),
        Series(label="best so far", x=tuple(float(t.number) for t in done), y=tuple(best), style="line"),
    ]
    if failed:
        series.append(
            Series(
                label="failed", x=tuple(float(t.number) for t in failed), y=tuple(0.0 for _ in failed), style="marker"
            )
        )
    panel = Panel(title="", xlabel="trial", ylabel=objective_label, series=tuple(series))  # the figure's title says it
    return FigureData(title="Study history", panels=(panel,))


def render_figure(data: FigureData, path: Path) -> Path:
    """Draw a FigureData to a PNG file."""
    make_folder(path.parent)
    return save_png(draw_figure(data), path)


def save_png(figure: Figure, path: Path) -> Path:
    """Write a drawn matplotlib figure to ``path`` and close it (OutputError where it cannot be written)."""
    try:
        figure.savefig(path, dpi=DPI)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.") from None
    finally:
        plt.close(figure)
    return path


def draw_figure(data: FigureData) -> Figure:
    """Draw a FigureData as an open matplotlib figure (a notebook shows it; close it when done)."""
    columns = len(data.panels) or 1
    figure, axes = plt.subplots(1, columns, figsize=(5.6 * columns, 4.2), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, panel in zip(axes[0], data.panels, strict=False):
        color_of: dict[str, str] = {}
        for series in panel.series:
            family = series.label.split(":")[0]
            color = color_of.setdefault(family, colors[len(color_of) % len(colors)])
            _draw(axis, series, color)
        axis.set_title(panel.title, fontsize=10)
        axis.set_xlabel(panel.xlabel)
        axis.set_ylabel(panel.ylabel)
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel.series:
            axis.legend(fontsize=7, loc="best")
    figure.suptitle(data.title)
    figure.tight_layout()
    return figure


def _draw(axis, series: Series, color: str) -> None:
    if series.style == "band":
        axis.plot(series.x, series.y, color=color, label=series.label)
        if series.low is not None and series.high is not None:
            axis.fill_between(series.x, series.low, series.high, color=color, alpha=0.18, linewidth=0)
    elif series.style == "points":
        if series.low is not None and series.high is not None:
            below = [y - lo for y, lo in zip(series.y, series.low, strict=True)]
            above = [hi - y for y, hi in zip(series.y, series.high, strict=True)]
            axis.errorbar(series.x, series.y, yerr=[below, above], fmt="o", color=color, capsize=3, label=series.label)
        else:
            axis.plot(series.x, series.y, "o", color=color, label=series.label)
    elif series.style == "bars":
        axis.bar(series.x, series.y, width=series.width, color=color, alpha=0.8, label=series.label)
    elif series.style == "marker":
        axis.plot(
            series.x,
            series.y,
            "*",
            markersize=14,
            color="black" if "recommended" in series.label else color,
            label=series.label,
        )
    else:
        axis.plot(series.x, series.y, "--", color=color, label=series.label)
