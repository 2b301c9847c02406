"""A study's measured levels as tables: results.csv (one row per trial, workload and level) and
the report's latency table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

from specsweep.analysis.context_mix import context_tokens
from specsweep.analysis.drafters import candidate_of, configuration_label
from specsweep.report import document as doc
from specsweep.types import LevelFigures, MeasuredConfig

RESULTS_CSV = "results.csv"
# results.csv: what identifies a row, then every figure a level keeps (LevelFigures' fields).
CSV_KEYS = ("trial", "configuration", "spec", "workload")
CSV_FIGURES = tuple(f.name for f in fields(LevelFigures) if f.name not in ("notes", "by_subcategory"))
# then the row's context in tokens: a level's (W@16k: 16384), a plain workload's mean prompt tokens
CSV_CONTEXT = ("context",)


def results_csv(configs: Sequence[MeasuredConfig]) -> str:
    """One row per measured trial, workload and level; a sequence (S_1..S_k) is joined by ';',
    a figure not measured is empty. Rates and times as the study keeps them (modelled units on
    the emulator)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_KEYS + CSV_FIGURES + CSV_CONTEXT)
    context = {w: context_tokens(configs, w) for c in configs for w in c.results}
    for config in sorted(configs, key=lambda c: c.trial):
        label = configuration_label(config.configuration)
        for workload, levels in config.results.items():
            for level in sorted(levels):
                row = asdict(levels[level])
                spec = config.spec.to_json() if config.spec else ""
                figures = (_csv_value(row[n]) for n in CSV_FIGURES)
                writer.writerow([config.trial, label, spec, workload, *figures, _csv_value(context[workload])])
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
                    str(config.trial), configuration_label(config.configuration), workload, str(level),
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


def subcategory_table(workload: str, configs: Sequence[MeasuredConfig]) -> doc.Table | None:
    """Tokens per verification step per subcategory of ``workload``, one column per drafter (its
    longest measured draft, every level pooled), the subcategory that drafts worst first; llama.cpp's
    draft acceptance beside it where responses carried it. None when no level kept subcategories."""
    chosen: dict[str, MeasuredConfig] = {}
    chosen_k: dict[str, int | None] = {}
    for config in configs:
        spec = config.spec
        levels = config.results.get(workload, {}).values()
        if spec is None or spec.num_speculative_tokens_per_batch_size or not any(lv.by_subcategory for lv in levels):
            continue
        drafter = candidate_of(spec).drafter
        name = drafter.label if drafter else ""
        if name not in chosen or (spec.num_speculative_tokens or 0) > (chosen_k[name] or 0):
            chosen[name] = config
            chosen_k[name] = spec.num_speculative_tokens
    if not chosen:
        return None
    sums: dict[str, dict[str, dict[str, float]]] = {}
    for name, config in chosen.items():
        for level in config.results[workload].values():
            for tag, row in (level.by_subcategory or {}).items():
                pooled = sums.setdefault(tag, {}).setdefault(name, {})
                for key, value in row.items():
                    pooled[key] = pooled.get(key, 0.0) + value
    names = sorted(chosen)

    def cell(row: dict[str, float] | None) -> str:
        if not row or not row.get("steps"):
            return "-"
        text = f"{row['tokens'] / row['steps']:.2f} ({row['requests']:.0f})"
        return text + (f", {100 * row['accepted'] / row['drafted']:.0f}% accepted" if row.get("drafted") else "")

    def worst(tag: str) -> float:
        rows = [r for r in sums[tag].values() if r.get("steps")]
        return min((r["tokens"] / r["steps"] for r in rows), default=0.0)

    header = ("subcategory", *(f"{n} k={chosen_k[n]}" for n in names))
    rows = tuple((tag, *(cell(sums[tag].get(n)) for n in names)) for tag in sorted(sums, key=worst))
    return doc.Table(header=header, rows=rows)
