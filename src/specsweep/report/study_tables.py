"""A study's measured levels as tables: results.csv (one row per trial, workload and level) and
the report's latency table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

from specsweep.analysis.drafters import candidate_of
from specsweep.report import document as doc
from specsweep.types import LevelFigures, MeasuredConfig

RESULTS_CSV = "results.csv"
# results.csv: what identifies a row, then every figure a level keeps (LevelFigures' fields).
CSV_KEYS = ("trial", "configuration", "spec", "workload")
CSV_FIGURES = tuple(f.name for f in fields(LevelFigures) if f.name != "notes")


def results_csv(configs: Sequence[MeasuredConfig]) -> str:
    """One row per measured trial, workload and level; a sequence (S_1..S_k) is joined by ';',
    a figure not measured is empty. Rates and times as the study keeps them (modelled units on
    the emulator)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_KEYS + CSV_FIGURES)
    for config in sorted(configs, key=lambda c: c.trial):
        label = candidate_of(config.spec).label
        for workload, levels in config.results.items():
            for level in sorted(levels):
                row = asdict(levels[level])
                spec = config.spec.to_json() if config.spec else ""
                writer.writerow([config.trial, label, spec, workload, *(_csv_value(row[n]) for n in CSV_FIGURES)])
    return buffer.getvalue()


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ";".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def latency_table(workloads: Sequence[str], configs: Sequence[MeasuredConfig]) -> doc.Table | None:
    """TPOT and ITL p50/p99 (ms) and TTFT p95 (s) of every measured trial, workload and level; None
    when no level kept them (a study stored before they were)."""
    rows = []
    for config in sorted(configs, key=lambda c: c.trial):
        for workload in workloads:
            for level, figures in sorted(config.results.get(workload, {}).items()):
                if figures.tpot_p50_s is None and figures.itl_p50_s is None:
                    continue
                rows.append((
                    str(config.trial), candidate_of(config.spec).label, workload, str(level),
                    _ms(figures.tpot_p50_s), _ms(figures.tpot_p99_s), _ms(figures.itl_p50_s), _ms(figures.itl_p99_s),
                    "-" if figures.ttft_p95_s is None else f"{figures.ttft_p95_s:.3f}",
                ))  # fmt: skip
    if not rows:
        return None
    header = ("trial", "configuration", "workload", "concurrency", "TPOT p50", "TPOT p99", "ITL p50", "ITL p99",
              "TTFT p95 s")  # fmt: skip
    return doc.Table(header=header, rows=tuple(rows))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"
