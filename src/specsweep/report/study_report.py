"""The study report: recommendation table, snippets, figures and fits, as markdown, HTML and JSON.

Everything comes from a StudyAnalysis and the stored measurements behind it, so a copied study
folder reports with no server and no network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specsweep.analysis.context_mix import context_members, context_tokens
from specsweep.analysis.drafters import Candidate, drafter_label
from specsweep.analysis.recommendation import Gain, Recommendation
from specsweep.analysis.snippet_plan import SnippetPlan
from specsweep.analysis.study import StudyAnalysis
from specsweep.engines.registry import engine_of_format, measured_speaks_for
from specsweep.names import file_part
from specsweep.report import document as doc
from specsweep.report.context_report import context_blocks, context_json
from specsweep.report.figures import (
    TrialPoint,
    acceptance_figure_data,
    history_figure_data,
    render_figure,
    throughput_figure_data,
)
from specsweep.report.snippets import adaptive_config_path_for, render_snippet
from specsweep.report.study_tables import RESULTS_CSV, latency_table, results_csv, subcategory_table
from specsweep.runtime.store import finite_json, make_folder, write_atomic, write_json_atomic
from specsweep.types import MeasuredConfig, StudySettings
from specsweep.workload import parse_context_variant


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFiles:
    """What ``write_report`` wrote."""

    folder: Path
    markdown: Path
    html: Path
    results: Path
    figures: tuple[Path, ...]
    table: Path | None = None  # results.csv


def percent(value: float | None, low: float | None = None, high: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{100 * value:+.1f}%"
    if low is not None and high is not None:
        text += f" [{100 * low:+.1f}, {100 * high:+.1f}]"
    return text


def gain_text(gain: Gain | None) -> str:
    """'+12.3% [+10.1, +14.0] predicted, +12.0% measured' (what is known of it)."""
    if gain is None:
        return "-"
    parts = []
    if gain.predicted is not None:
        parts.append(percent(gain.predicted, gain.predicted_low, gain.predicted_high) + " predicted")
    if gain.measured is not None:
        parts.append(percent(gain.measured) + " measured")
    return ", ".join(parts) or "-"


def recommendation_rows(analysis: StudyAnalysis) -> list[tuple[str, ...]]:
    """One row per workload and concurrency: the choice, its rate, its gains, why."""
    rows: list[tuple[str, ...]] = []
    for rec in analysis.recommendations:
        measured = f"{rec.measured_tokens_per_s:.1f}" if rec.measured_tokens_per_s is not None else "not measured"
        rows.append(
            (
                rec.workload,
                str(rec.concurrency),
                rec.choice.label,
                f"{rec.tokens_per_s:.1f} [{rec.tokens_per_s_low:.1f}, {rec.tokens_per_s_high:.1f}]",
                measured,
                gain_text(rec.gain_over_off),
                gain_text(rec.gain_over_baseline),
                ", ".join(c.short_label for c in rec.tied) or "-",
            )
        )
    return rows


RECOMMENDATION_HEADER = (
    "workload", "concurrency", "recommended", "predicted tok/s [95%]", "measured tok/s", "vs speculation off",
    "vs baseline", "tied with (the data cannot tell them apart)",
)  # fmt: skip


def recommendation_header(analysis: StudyAnalysis) -> tuple[str, ...]:
    """The recommendation table's header, its baseline column named by the configuration it is."""
    over = next((r.gain_over_baseline.over for r in analysis.recommendations if r.gain_over_baseline), None)
    leaders = next((r.leader_confidence for r in analysis.recommendations), None)
    tied = RECOMMENDATION_HEADER[-1]
    if leaders is not None:  # the confidence each cell's ties are named at, so that all cells hold at once
        tied = f"tied with (the data cannot tell them apart at {100 * leaders:.4g}%)"
    names = {
        "vs baseline": f"vs {baseline_name(over)}" if over is not None else "vs baseline",
        RECOMMENDATION_HEADER[-1]: tied,
    }
    return tuple(names.get(h, h) for h in RECOMMENDATION_HEADER)


def baseline_name(over: Candidate) -> str:
    """The baseline as the output names it: the configuration it is, and that it is the baseline
    (search.baseline: what the server ran before the study)."""
    return f"{over.short_label} (baseline)"


def snippet_heading(plan: SnippetPlan) -> str:
    """What the paste runs at each measured level, and how far its table reaches."""
    runs = ", ".join(f"{b}: {c.short_label}" for b, c in sorted(plan.choice_by_concurrency.items()))
    if not plan.table:
        return f"paste (runs, by concurrency, {runs})"
    bound = "max_num_seqs" if plan.max_batch_known else "max_num_seqs not known: the largest vLLM default"
    return f"paste (runs, by concurrency, {runs}; a per-batch-size table up to batch {plan.max_batch}, {bound})"


def snippet_for(analysis: StudyAnalysis, workload: str, fmt: str, *, settings: StudySettings | None = None) -> str:
    """The paste-ready snippet for one workload (per-batch table included when it pays), in the
    flag names of the build the study read (``settings``), with a comment line for what the
    measured server's flags and version make of its table (vLLM's CUDA-graph mode)."""
    plan = analysis.snippet(workload)
    spec = plan.spec if plan is not None else None
    flags = settings.engine_flags if settings is not None and fmt == "llama.cpp" else None
    path = adaptive_config_path_for(workload) if fmt == "sglang" else None
    text = render_snippet(spec, fmt, help_flags=flags, adaptive_config_path=path)
    engine = engine_of_format(fmt)
    if spec is None or settings is None or fmt == "json":
        return text
    same = measured_speaks_for(settings.engine, engine)
    notes = engine.paste_notes(spec, settings.server_args if same else None, settings.engine_version if same else None)
    return "\n".join([*(f"# {line}" for line in notes), text])


def write_report(
    analysis: StudyAnalysis,
    configs: Sequence[MeasuredConfig],
    settings: StudySettings,
    history: Sequence[TrialPoint],
    folder: Path,
    *,
    name: str,
    snippet_format: str = "vllm",
) -> ReportFiles:
    """Write figures, report.md, report.html and results.json into ``folder``."""
    make_folder(folder)  # a folder that cannot be written is said before any figure is drawn
    figures_dir = folder / "figures"
    figures: list[Path] = []
    blocks: list[doc.Block] = [doc.Heading(text=f"specsweep report: {name}", level=1)]
    blocks.append(doc.Paragraph(text=_summary(analysis, configs, settings, history)))
    blocks.append(doc.Heading(text="Recommendation"))
    blocks.append(doc.Table(header=recommendation_header(analysis), rows=tuple(recommendation_rows(analysis))))
    levels = {m for members in context_members(analysis.workloads).values() for m in members[1:]}
    for workload in analysis.workloads:
        plan = analysis.snippet(workload)
        if plan is None or workload in levels:
            continue  # a context level: its workload's paste, over the context mix, covers it
        text = snippet_for(analysis, workload, snippet_format, settings=settings)
        blocks.append(doc.Paragraph(text=f"{workload}: {snippet_heading(plan)}"))
        blocks.append(doc.Code(text=text))
        if plan.notes:
            blocks.append(doc.Bullets(items=plan.notes))
    blocks.append(doc.Bullets(items=tuple(r.reason for r in analysis.recommendations) + analysis.notes))
    by_context, context_figures = context_blocks(analysis, configs, figures_dir)
    blocks.extend(by_context)
    figures.extend(context_figures)
    for workload in analysis.workloads:
        blocks.append(doc.Heading(text=f"{workload}: acceptance decay"))
        path = render_figure(
            acceptance_figure_data(analysis, workload), figures_dir / f"acceptance-{file_part(workload)}.png"
        )
        figures.append(path)
        blocks.append(doc.Figure(path=path, caption=f"Per-position and conditional acceptance, {workload}"))
        blocks.extend(_fit_blocks(analysis, workload))
        blocks.append(doc.Heading(text=f"{workload}: throughput against draft length"))
        path = render_figure(
            throughput_figure_data(analysis, workload), figures_dir / f"throughput-{file_part(workload)}.png"
        )
        figures.append(path)
        blocks.append(doc.Figure(path=path, caption=f"Measured points, model and 95% band, {workload}"))
        model = analysis.models.get(workload)
        if model is not None:
            blocks.append(doc.Bullets(items=(f"Step time: {model.basis}.",)))
        by_kind = subcategory_table(workload, configs)
        if by_kind is not None:
            blocks.append(doc.Heading(text=f"{workload}: acceptance by subcategory"))
            blocks.append(
                doc.Paragraph(
                    text="Tokens per verification step (1 + accepted drafted tokens) of each kind of output in the "
                    "workload, per drafter at its longest measured draft, every level pooled (requests in brackets); "
                    "the kind that drafts worst first. From each response: one streamed chunk per step, or the "
                    "verification steps SGLang reports."
                )
            )
            blocks.append(by_kind)
    blocks.append(doc.Heading(text="Measured configurations"))
    blocks.append(_measured_table(analysis, configs))
    latency = latency_table(analysis.workloads, configs)
    if latency is not None:
        blocks.append(doc.Heading(text="Latency: time per output token and inter-token latency"))
        blocks.append(
            doc.Paragraph(
                text="TPOT: time per output token after the first, per request; ITL: the time between streamed "
                "chunks that carry tokens (with speculation, one chunk per verification step). Per level, in ms. "
                "On the emulator faster than time scale 10 ITL is not kept: its steps arrive together there."
            )
        )
        blocks.append(latency)
    path = render_figure(history_figure_data(history, "objective tok/s"), figures_dir / "history.png")
    figures.append(path)
    blocks.append(doc.Figure(path=path, caption="Every trial's objective and the best so far"))
    markdown = folder / "report.md"
    html_path = folder / "report.html"
    results = folder / "results.json"
    write_atomic(markdown, doc.render_markdown(blocks, folder=folder))
    write_atomic(html_path, doc.render_html(blocks, title=f"specsweep report: {name}"))
    write_json_atomic(results, results_document(analysis, configs, settings, snippet_format))
    write_atomic(folder / RESULTS_CSV, results_csv(configs))
    return ReportFiles(
        folder=folder, markdown=markdown, html=html_path, results=results, figures=tuple(figures),
        table=folder / RESULTS_CSV,
    )  # fmt: skip


def _settings_json(settings: StudySettings) -> dict[str, Any]:
    """The settings as results.json keeps them: the baseline as its key (``baseline_key``) and its
    spec config's JSON (``baseline``, None for speculation off)."""
    out: dict[str, Any] = {}
    for name, value in asdict(settings).items():
        if name == "baseline":
            base = settings.baseline
            out["baseline_key"] = None if base is None else base.key
            out["baseline"] = None if base is None or base.spec is None else base.spec.to_json()
        else:
            out[name] = value
    return out


def results_document(
    analysis: StudyAnalysis, configs: Sequence[MeasuredConfig], settings: StudySettings, snippet_format: str
) -> dict[str, Any]:
    """Everything the report shows, as JSON."""
    return finite_json(
        {
            "settings": {
                **_settings_json(settings),
                "workloads": list(settings.workloads),
                "k_max": settings.k_max,
                "engine_flags": sorted(settings.engine_flags) if settings.engine_flags else None,
            },
            # each with its context in tokens (a level's, or the plain workload's mean prompt tokens)
            "recommendations": [
                {**asdict(r), "context_tokens": context_tokens(configs, r.workload)} for r in analysis.recommendations
            ],
            "snippets": {
                w: {"format": snippet_format, "text": snippet_for(analysis, w, snippet_format, settings=settings)}
                for w in analysis.workloads
            },
            "acceptance": [asdict(a) for a in analysis.acceptance],
            "throughput_models": {w: m.to_dict() for w, m in analysis.models.items()},
            "predictions": [asdict(p) for p in analysis.predictions],
            "notes": list(analysis.notes),
            "context": context_json(analysis, configs, settings.workload_weights),
            "measured": [
                {
                    "trial": c.trial,
                    "spec": c.spec.to_json() if c.spec else None,
                    "results": {w: {str(b): asdict(lv) for b, lv in levels.items()} for w, levels in c.results.items()},
                }
                for c in configs
            ],
        }
    )


def _summary(
    analysis: StudyAnalysis, configs: Sequence[MeasuredConfig], settings: StudySettings, history: Sequence[TrialPoint]
) -> str:
    failed = sum(t.state == "FAIL" for t in history)
    temperature = settings.temperature
    return (
        f"Engine {settings.engine}, workloads {', '.join(analysis.workloads)}, concurrency "
        f"{', '.join(map(str, analysis.concurrency_levels))} (objective at {analysis.objective_concurrency}), "
        + (f"temperature {temperature:g}, " if temperature is not None else "")
        + f"draft lengths up to {analysis.k_max}; {len(configs)} configurations measured, {failed} trials failed. "
        "Rates are aggregate output tok/s, client side, exact token counts from usage; intervals are 95%."
        + (CONTEXT_NOTE if any(parse_context_variant(w)[1] is not None for w in analysis.workloads) else "")
    )


# What the report says of a study with context levels (docs/workloads.md#context-levels).
CONTEXT_NOTE = (
    " A workload named W@16k is W at a context level (16,384 prompt tokens): each request is one prefix of"
    " realistic text shared by every request of the level, then its own prompt; the server's prefix cache holds"
    " the prefix after the first request, so the level measures decoding at that context, not its prefill"
    " (prompt_tokens_mean in results.json and results.csv: the prompt tokens the server counted)."
)


# alpha + beta past which a beta-geometric fit is its geometric limit: p_i moves by under 0.1%
# of itself over ten positions.
GEOMETRIC_LIMIT_SIZE = 1e4


def _parameters(name: str, names: tuple[str, ...], values: tuple[float, ...]) -> str:
    """A decay model's parameters as the report shows them; a beta-geometric fit at its geometric
    limit (alpha and beta unbounded together) by its mean, the one number it then has."""
    if name == "beta_geometric" and sum(values) > GEOMETRIC_LIMIT_SIZE:
        alpha, beta = values
        return f"mean {alpha / (alpha + beta):.3f}; alpha and beta unbounded (its geometric limit)"
    return ", ".join(f"{n}={v:.3f}" for n, v in zip(names, values, strict=True))


def _fit_blocks(analysis: StudyAnalysis, workload: str) -> list[doc.Block]:
    blocks: list[doc.Block] = []
    for entry in (a for a in analysis.acceptance if a.workload == workload):
        fit = entry.fit
        blocks.append(
            doc.Paragraph(
                text=f"{drafter_label(entry.drafter)} (trial {entry.trial}, {fit.num_drafts:,.0f} drafts): "
                f"{fit.chosen} chosen. {fit.choice_reason}"
            )
        )
        chosen = fit.model(fit.chosen)
        rows = []
        for p in fit.positions:
            conditional = "-" if p.conditional is None else f"{p.conditional:.3f}"
            rows.append((str(p.position), f"{p.per_position:.3f} [{p.per_position_low:.3f}, {p.per_position_high:.3f}]",
                         conditional, f"{chosen.per_position[p.position - 1]:.3f}"))  # fmt: skip
        blocks.append(doc.Table(header=("position", "S_i measured [Wilson 95%]", "p_i measured", f"S_i {fit.chosen}"),
                                rows=tuple(rows)))  # fmt: skip
        models = tuple(
            (m.name, _parameters(m.name, m.param_names, m.params), "-" if m.aic is None else f"{m.aic:.1f}",
             f"{m.delta_aic:.1f}")
            for m in fit.models
        )  # fmt: skip
        blocks.append(doc.Table(header=("model", "parameters", "AIC", "delta AIC"), rows=models))
        blocks.append(
            doc.Table(
                header=("k", "E(k) tokens per step [95%]", "source"),
                rows=tuple(
                    (str(p.num_speculative_tokens),
                     f"{p.tokens_per_step:.3f} [{p.tokens_per_step_low:.3f}, {p.tokens_per_step_high:.3f}]", p.source)
                    for p in fit.prediction
                ),
            )
        )  # fmt: skip
    return blocks


def _measured_table(analysis: StudyAnalysis, configs: Sequence[MeasuredConfig]) -> doc.Table:
    header = ["trial", "configuration"]
    for workload in analysis.workloads:
        header += [f"{workload} tok/s at {b}" for b in analysis.concurrency_levels]
    rows = []
    for config in sorted(configs, key=lambda c: c.trial):
        row = [str(config.trial), config.spec.to_json() if config.spec else "speculation off"]
        for workload in analysis.workloads:
            for level in analysis.concurrency_levels:
                rate = config.rate(workload, level)
                row.append("-" if rate is None else f"{rate:.1f}")
        rows.append(tuple(row))
    return doc.Table(header=tuple(header), rows=tuple(rows))


def recommendation_summary(rec: Recommendation) -> str:
    """One line: 'technical at 1: k=2 dspark probabilistic, 33.2 tok/s [32.5, 33.7] predicted ...'."""
    measured = f", {rec.measured_tokens_per_s:.1f} measured" if rec.measured_tokens_per_s is not None else ""
    gains = []
    if (
        rec.gain_over_off is not None
        and not rec.speculation_off
        and (rec.gain_over_off.predicted is not None or rec.gain_over_off.measured)
    ):
        gains.append(f"{gain_text(rec.gain_over_off)} vs speculation off")
    if rec.gain_over_baseline is not None:
        gains.append(f"{gain_text(rec.gain_over_baseline)} vs {baseline_name(rec.gain_over_baseline.over)}")
    return (
        f"{rec.workload} at concurrency {rec.concurrency}: {rec.choice.label}, {rec.tokens_per_s:.1f} tok/s "
        f"[{rec.tokens_per_s_low:.1f}, {rec.tokens_per_s_high:.1f}] predicted{measured}"
        + (f"; {'; '.join(gains)}" if gains else "")
        + ("" if rec.measured else " (never measured: an untested extrapolation)")
    )
