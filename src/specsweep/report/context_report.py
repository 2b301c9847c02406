"""A study's context levels in the report: each workload's best k by context and concurrency as
a heat map and a table, and the same cells in results.json.

Rows are the workload's contexts, shortest first (the plain workload at its mean prompt tokens,
then each level ``W@16k``), columns its concurrency levels; a cell is the recommendation there:
its k (the colour), its predicted rate and its gain over speculation off. The paste over the
context mix is the workload's own (analysis/context_mix.py); its notes say what each context
gives up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from specsweep.analysis.context_mix import ContextGrid, context_grids, mix_weights
from specsweep.analysis.recommendation import Recommendation
from specsweep.analysis.study import StudyAnalysis
from specsweep.names import file_part
from specsweep.report import document as doc
from specsweep.report.figures import save_png
from specsweep.runtime.store import make_folder
from specsweep.types import MeasuredConfig

DPI = 110


@dataclass(frozen=True, slots=True, kw_only=True)
class HeatMapData:
    """One workload's best k by context (rows) and concurrency (columns), and each cell's text."""

    title: str
    row_labels: tuple[str, ...]  # the contexts, shortest first
    column_labels: tuple[str, ...]  # "concurrency 1", ...
    k: tuple[tuple[int | None, ...], ...]  # per row, per column: the best k (0: off; None: no pick)
    text: tuple[tuple[str, ...], ...]  # "k=3\n41.2 tok/s\n+31.0%"


def cell_text(rec: Recommendation | None) -> str:
    """A heat map cell: the pick, its predicted rate, its predicted gain over speculation off."""
    if rec is None:
        return "-"
    name = "off" if rec.speculation_off else f"k={rec.choice.num_speculative_tokens}"
    gain = rec.gain_over_off.predicted if rec.gain_over_off is not None and not rec.speculation_off else None
    measured = "" if rec.measured else " *"
    return f"{name}{measured}\n{rec.tokens_per_s:.1f} tok/s" + ("" if gain is None else f"\n{100 * gain:+.1f}%")


def heat_map_data(grid: ContextGrid) -> HeatMapData:
    """The heat map of one workload's context grid."""
    return HeatMapData(
        title=f"{grid.workload}: best k by context and concurrency"
        + (
            "\n(* never measured there)" if any(not r.measured for row in grid.rows for r in row.picks.values()) else ""
        ),
        row_labels=tuple(
            row.workload if row.context_tokens is None else f"{row.context_tokens:,.0f} tokens ({row.workload})"
            for row in grid.rows
        ),
        column_labels=tuple(f"concurrency {b}" for b in grid.concurrency_levels),
        k=tuple(
            tuple(
                None if (r := row.picks.get(b)) is None else r.choice.num_speculative_tokens
                for b in grid.concurrency_levels
            )
            for row in grid.rows
        ),
        text=tuple(tuple(cell_text(row.picks.get(b)) for b in grid.concurrency_levels) for row in grid.rows),
    )


def render_heat_map(data: HeatMapData, path: Path) -> Path:
    """Draw a heat map to a PNG file: the colour is k, each cell says its pick, rate and gain."""
    make_folder(path.parent)
    rows, columns = len(data.row_labels), len(data.column_labels)
    figure, axis = plt.subplots(figsize=(4.6 + 1.8 * columns, 1.6 + 1.0 * rows))
    values = [[float("nan") if k is None else float(k) for k in row] for row in data.k]
    top = max((k for row in data.k for k in row if k is not None), default=0)
    image = axis.imshow(values, cmap="viridis", aspect="auto", vmin=0, vmax=max(top, 1))
    figure.colorbar(image, ax=axis, label="best k (0: speculation off)", ticks=range(max(top, 1) + 1))
    axis.set_xticks(range(columns), data.column_labels)
    axis.set_yticks(range(rows), data.row_labels)
    axis.set_ylabel("context")
    for i, row in enumerate(data.text):
        for j, text in enumerate(row):
            k = data.k[i][j]
            light = k is not None and top > 0 and k > 0.6 * top
            axis.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if light else "white")
    axis.set_title(data.title, fontsize=10)
    figure.tight_layout()
    return save_png(figure, path)


def context_table(grid: ContextGrid) -> doc.Table:
    """Every cell of a workload's context grid: one row per context, one column per concurrency."""
    header = ("context", *(f"concurrency {b}" for b in grid.concurrency_levels))
    rows = tuple(
        (row.label, *(cell_text(row.picks.get(b)).replace("\n", ", ") for b in grid.concurrency_levels))
        for row in grid.rows
    )
    return doc.Table(header=header, rows=rows)


def context_blocks(
    analysis: StudyAnalysis, configs: Sequence[MeasuredConfig], figures_dir: Path
) -> tuple[list[doc.Block], list[Path]]:
    """Each workload with context levels: a heading, its heat map and its table."""
    blocks: list[doc.Block] = []
    paths: list[Path] = []
    for grid in context_grids(analysis.recommendations, configs):
        blocks.append(doc.Heading(text=f"{grid.workload}: best k by context"))
        path = render_heat_map(heat_map_data(grid), figures_dir / f"context-{file_part(grid.workload)}.png")
        paths.append(path)
        blocks.append(
            doc.Figure(path=path, caption=f"Best k, predicted tok/s and gain over speculation off, {grid.workload}")
        )
        blocks.append(context_table(grid))
        blocks.append(
            doc.Paragraph(
                text=f"No engine release takes a k per context, so the paste for {grid.workload} is one k per batch "
                "size over the context mix; its notes say what each context gives up."
            )
        )
    return blocks, paths


def context_json(
    analysis: StudyAnalysis, configs: Sequence[MeasuredConfig], workload_weights: Mapping[str, float]
) -> list[dict[str, Any]]:
    """results.json's ``context``: per workload with context levels, each context's pick per
    concurrency, the mix's weights and what its paste runs."""
    out = []
    for grid in context_grids(analysis.recommendations, configs):
        weights, even = mix_weights([row.workload for row in grid.rows], workload_weights)
        plan = analysis.snippet(grid.workload)
        out.append(
            {
                "workload": grid.workload,
                "weights": weights,
                "weighed_evenly": even,
                "paste_runs": {}
                if plan is None
                else {str(b): c.label for b, c in sorted(plan.choice_by_concurrency.items())},
                "paste_notes": [] if plan is None else list(plan.notes),
                "contexts": [
                    {
                        "workload": row.workload,
                        "context_tokens": row.context_tokens,
                        "cells": [_cell_json(row.picks[b]) for b in grid.concurrency_levels if b in row.picks],
                    }
                    for row in grid.rows
                ],
            }
        )
    return out


def _cell_json(rec: Recommendation) -> dict[str, Any]:
    gain = rec.gain_over_off
    return {
        "concurrency": rec.concurrency,
        "choice": rec.choice.label,
        "num_speculative_tokens": rec.choice.num_speculative_tokens,
        "draft_sample_method": None if rec.choice.drafter is None else rec.choice.drafter.draft_sample_method,
        "tokens_per_s": rec.tokens_per_s,
        "tokens_per_s_low": rec.tokens_per_s_low,
        "tokens_per_s_high": rec.tokens_per_s_high,
        "measured_tokens_per_s": rec.measured_tokens_per_s,
        "measured": rec.measured,
        "gain_over_off": None if gain is None or rec.speculation_off else gain.predicted,
    }
