"""What ``specsweep watch`` says: the lines the terminal and the report share, its JSON, and the
report document (markdown, HTML, JSON and figures, as a study's report has them).

Rates are in the rig's units: on the emulator the snapshots are on its modelled clock (runtime/poll.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.measurement.series import Interval
from specsweep.report import document as doc
from specsweep.report.figures import render_figure
from specsweep.report.snippets import render_snippet
from specsweep.runtime.store import finite_json, make_folder, write_atomic, write_json_atomic
from specsweep.watch.figures import acceptance_by_window_data, concurrency_data, gain_data
from specsweep.watch.prediction import UNREAD_CONTEXT, ConfigRate, TrafficRecommendation
from specsweep.watch.windows import WatchReport, WindowReport


def clock(stamp: float, *, with_date: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(stamp))


def span_text(report: WindowReport, *, with_date: bool = False) -> str:
    w = report.window
    return f"{clock(w.start, with_date=with_date)}-{clock(w.end)}"


def concurrency_text(report: WindowReport, *, top: int = 3) -> str:
    """'running 3 (92%), 2 (6%), idle 2%': the batch sizes that held longest (the running-requests
    gauge's samples)."""
    shares = report.window.concurrency_shares()
    if not shares:
        return "concurrency not published"
    busy = sorted(((b, s) for b, s in shares.items() if b > 0), key=lambda bs: -bs[1])[:top]
    if not busy:
        return "idle at every read"
    idle = shares.get(0, 0.0)
    return (
        "running "
        + ", ".join(f"{b} ({100 * s:.0f}%)" for b, s in busy)
        + (f", idle {100 * idle:.0f}%" if idle >= 0.005 else "")
    )


def acceptance_text(report: WindowReport) -> str:
    """S_i at the running k with Wilson intervals, and how the acceptance was obtained."""
    acceptance = report.acceptance
    if acceptance is None:
        return "no acceptance: " + ("; ".join(report.notes) or "nothing drafted")
    fit = acceptance.fit
    if acceptance.source == "per_position":
        shown = ", ".join(
            f"{p.per_position:.3f} [{p.per_position_low:.3f}, {p.per_position_high:.3f}]" for p in fit.positions
        )
        return (
            f"acceptance at the running k={acceptance.running_k} ({acceptance.steps:,.0f} steps): "
            f"S_1..S_{len(fit.positions)} = {shown}; past it the {fit.chosen} decay fit (extrapolated)"
            + (f"; intervals widened by a design effect of {fit.design_effect:.1f}" if fit.design_effect > 1.05 else "")
        )
    how = "mean acceptance length" if acceptance.source == "aggregate" else "SGLang's accept-length gauge"
    length = 1.0 + sum(p.per_position for p in fit.prediction[: acceptance.running_k])
    return (
        f"acceptance at k={acceptance.running_k} from the {how} only (no per-position counters): "
        f"{length:.2f} tokens per step, fitted as geometric (a = {fit.models[0].params[0]:.3f}); every S_i is modelled"
    )


def rate_text(rate: ConfigRate) -> str:
    return f"{rate.tokens_per_s:.1f} tok/s ({rate.tokens_per_s_low:.1f}-{rate.tokens_per_s_high:.1f})"


def gain_text(rec: TrafficRecommendation) -> str:
    if rec.gain is None or rec.running is None:
        return "the running configuration has no prediction here"
    if rec.choice.k_by_batch == rec.running.k_by_batch:
        return f"the running {rec.running.label} is already the best"
    return (
        f"{100 * rec.gain:+.1f}% over the running {rec.running.label} "
        f"({rec.confidence:.0%} {100 * (rec.gain_low or 0):+.1f}% to {100 * (rec.gain_high or 0):+.1f}%)"
    )


def recommendation_lines(report: WindowReport) -> list[str]:
    """The recommendation, its gain, ties and the extrapolated alternative worth measuring."""
    rec = report.recommendation
    if rec is None:
        return []
    lines = [f"recommended {rec.choice.label}: {rate_text(rec.choice)} predicted; {gain_text(rec)}"]
    if report.observed_tokens_per_s is not None and rec.running is not None:
        lines.append(
            f"  the running {rec.running.label} is predicted at {rec.running.tokens_per_s:.1f} tok/s; "
            f"the server generated {report.observed_tokens_per_s:.1f}"
        )
    if rec.tied:
        lines.append("  the data cannot tell it from " + ", ".join(r.label for r in rec.tied[:4]))
    if rec.worth_measuring is not None:
        ahead = rec.worth_measuring.tokens_per_s / rec.choice.tokens_per_s - 1.0
        lines.append(
            f"  {rec.worth_measuring.label} is predicted {100 * ahead:+.1f}% higher on extrapolated acceptance "
            f"(positions past the running k): run at k={max(rec.worth_measuring.k_by_batch.values())} for a while "
            "and watch again to measure it"
        )
    return lines


def window_lines(report: WindowReport, number: int) -> list[str]:
    """A window in a few lines: what was served and what to run."""
    w = report.window
    rate = report.observed_tokens_per_s
    head = f"window {number}  {span_text(report)}  " + (f"{rate:.1f} tok/s generated, " if rate is not None else "")
    lines = [head + concurrency_text(report), "  " + acceptance_text(report)]
    lines += ["  " + line for line in recommendation_lines(report)]
    lines += [f"  note: {n}" for n in report.notes if n not in w.notes or number == 1]
    return lines


def summary_lines(report: WatchReport, fmt: str, *, snippet: bool = True) -> list[str]:
    """The span's recommendation and the snippet to paste, after every window."""
    lines = list(report.changes)
    overall = report.overall
    count = len(report.windows)
    if overall.recommendation is not None:
        lines.append(f"over all {count} window(s), weighted by their length: " + recommendation_lines(overall)[0])
        lines += recommendation_lines(overall)[1:]
        if snippet:
            lines += ["paste:", render_snippet(overall.spec, fmt)]
    elif report.rig is not None:
        lines.append("no recommendation: " + ("; ".join(overall.notes) or "no window had acceptance to go by"))
    lines += [f"note: {n}" for n in report.notes]
    return lines


def window_json(report: WindowReport, fmt: str) -> dict[str, Any]:
    """One window as JSON (rates in the rig's units)."""
    w, acceptance, rec = report.window, report.acceptance, report.recommendation
    fit = acceptance.fit if acceptance else None
    out: dict[str, Any] = finite_json(
        {
            "start": w.start,
            "end": w.end,
            "generation_tokens_per_s": report.observed_tokens_per_s,
            "finished_requests": w.finished_requests,
            "prompt_tokens": w.delta.prompt_tokens,  # served prompt tokens: per finished request, its context
            "concurrency": {str(b): s for b, s in w.concurrency_shares().items()},
            "waiting_mean": w.waiting_mean,
            "resets": w.resets,
            "acceptance": None
            if acceptance is None or fit is None
            else {
                "source": acceptance.source,
                "running_k": acceptance.running_k,
                "steps": acceptance.steps,
                "model": fit.chosen,
                "per_position": [
                    {
                        "k": p.num_speculative_tokens,
                        "S": p.per_position,
                        "low": p.per_position_low,
                        "high": p.per_position_high,
                        "source": p.source,
                    }
                    for p in fit.prediction
                ],
            },
            "recommendation": None if rec is None else _recommendation_json(report, rec, fmt),
            "notes": list(report.notes),
        }
    )
    return out


def _recommendation_json(report: WindowReport, rec: TrafficRecommendation, fmt: str) -> dict[str, Any]:
    def rate(r: ConfigRate | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"label": r.label, "k_by_batch": {str(b): k for b, k in r.k_by_batch.items()},
                "tokens_per_s": r.tokens_per_s, "low": r.tokens_per_s_low, "high": r.tokens_per_s_high,
                "extrapolated": r.extrapolated}  # fmt: skip

    return {
        "choice": rate(rec.choice),
        "running": rate(rec.running),
        "gain": rec.gain,
        "gain_low": rec.gain_low,
        "gain_high": rec.gain_high,
        "tied": [rate(r) for r in rec.tied],
        "worth_measuring": rate(rec.worth_measuring),
        "weights": {str(b): w for b, w in rec.weights.items()},
        "rates": [rate(r) for r in rec.rates],
        "spec": None if report.spec is None else report.spec.to_json(),
        "snippet": render_snippet(report.spec, fmt),
    }


def watch_json(report: WatchReport, fmt: str) -> dict[str, Any]:
    return {
        "engine": report.engine,
        "drafter": None if report.drafter is None else report.drafter.label,
        "clock": report.clock,
        "windows": [window_json(w, fmt) for w in report.windows],
        "span": window_json(report.overall, fmt),
        "changes": list(report.changes),
        "notes": list(report.notes),
    }


def served_lengths(results: Any) -> list[tuple[float, float]] | None:
    """What watch's ``results.json`` says of the contexts served: per window, its prompt tokens per
    finished request, weighted by the finished requests (windows that counted neither left out);
    None: not a watch results.json."""
    if not isinstance(results, dict) or not isinstance(results.get("windows"), list):
        return None
    out = []
    for window in results["windows"]:
        if not isinstance(window, dict):
            continue
        tokens, done = (_number(window.get(key)) for key in ("prompt_tokens", "finished_requests"))
        if tokens is not None and done is not None and done >= 1:
            out.append((tokens / done, done))
    return out


def context_from_line(report: WatchReport, folder: Path) -> str | None:
    """Where a window's served prompts were longer than the rig could read: the study that measures
    the contexts served, levels and weights from the results.json written in ``folder``."""
    if not any(note.startswith(UNREAD_CONTEXT) for w in report.windows for note in w.notes):
        return None
    return f"measure at the contexts served: specsweep study --context-from {folder}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def interval_json(interval: Interval, report: WatchReport | None, fmt: str) -> dict[str, Any]:
    """Live mode's line per poll: what the interval counted, the window under way and the span so far."""
    gen = next(
        (v for n, v in interval.growth.items() if n.endswith(("generation_tokens_total", "tokens_predicted_total"))),
        None,
    )
    out: dict[str, Any] = finite_json(
        {
            "kind": "interval",
            "start": interval.start,
            "end": interval.end,
            "generation_tokens_per_s": None if gen is None else gen / interval.duration_s,
            "growth": interval.growth,
            "accepted_per_position": list(interval.per_position),
            "gauges": {name: list(values) for name, values in interval.gauges.items()},
            "resets": interval.resets,
            "window": None
            if report is None
            else {"number": len(report.windows), **window_json(report.windows[-1], fmt)},
            "span": None if report is None else window_json(report.overall, fmt),
            "changes": [] if report is None else list(report.changes),
        }
    )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchFiles:
    folder: Path
    markdown: Path
    html: Path
    results: Path
    figures: tuple[Path, ...]


def write_watch_report(report: WatchReport, folder: Path, *, source: str, fmt: str) -> WatchFiles:
    """report.md, report.html, results.json and the figures: acceptance per window, concurrency, gain."""
    make_folder(folder)  # a folder that cannot be written is said before any figure is drawn
    figures_dir = folder / "figures"
    paths = [
        render_figure(acceptance_by_window_data(report), figures_dir / "acceptance-by-window.png"),
        render_figure(concurrency_data(report), figures_dir / "concurrency.png"),
        render_figure(gain_data(report), figures_dir / "predicted-gain.png"),
    ]
    first, last = report.windows[0].window.start, report.windows[-1].window.end
    blocks: list[doc.Block] = [
        doc.Heading(text="specsweep watch", level=1),
        doc.Paragraph(
            text=f"{report.engine} metrics from {source}, {clock(first, with_date=True)} to "
            f"{clock(last, with_date=True)} in {len(report.windows)} window(s). Rates are in the rig's units, "
            "predicted for the traffic as served (its acceptance and its concurrency); intervals are 95%."
        ),
        doc.Heading(text="Recommendation"),
        doc.Bullets(items=tuple(line for line in summary_lines(report, fmt, snippet=False))),
    ]
    if report.overall.spec is not None:
        blocks.append(doc.Code(text=render_snippet(report.overall.spec, fmt)))
    rows = tuple(
        (str(i), span_text(w, with_date=True), f"{w.observed_tokens_per_s or 0:.1f}", concurrency_text(w), w.label,
         gain_text(w.recommendation) if w.recommendation else "-")
        for i, w in enumerate(report.windows, 1)
    )  # fmt: skip
    blocks.append(
        doc.Table(header=("window", "span", "generated tok/s", "concurrency", "recommended", "gain"), rows=rows)
    )
    if report.notes:
        blocks.append(doc.Bullets(items=report.notes))
    captions = (
        "Per-position acceptance S_i per window: measured with Wilson 95% bars, the decay fit past the running k",
        "Share of time at each running batch size, per window (from the running-requests gauge)",
        "Predicted rate of every k over the running configuration, and the recommendation per window",
    )
    blocks += [
        doc.Heading(text="Acceptance per window"),
        doc.Figure(path=paths[0], caption=captions[0]),
        doc.Bullets(items=tuple(f"window {i}: {acceptance_text(w)}" for i, w in enumerate(report.windows, 1))),
        doc.Heading(text="Concurrency"),
        doc.Figure(path=paths[1], caption=captions[1]),
        doc.Heading(text="Predicted gain"),
        doc.Figure(path=paths[2], caption=captions[2]),
    ]
    markdown, html_path, results = folder / "report.md", folder / "report.html", folder / "results.json"
    write_atomic(markdown, doc.render_markdown(blocks, folder=folder))
    write_atomic(html_path, doc.render_html(blocks, title="specsweep watch"))
    write_json_atomic(results, watch_json(report, fmt))
    return WatchFiles(folder=folder, markdown=markdown, html=html_path, results=results, figures=tuple(paths))
