"""What the commands print: one home for every printer, shared by the commands.

Rates are aggregate output tok/s, client side, unless a line says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console, Group
from rich.status import Status
from rich.text import Text

from specsweep.analysis.drafters import candidate_of, configuration_label
from specsweep.analysis.study import StudyAnalysis
from specsweep.cli.rig_printers import describe_rig
from specsweep.report.study_report import baseline_name, recommendation_summary, snippet_for, snippet_heading
from specsweep.runtime.measure import LevelResult, LevelStarted, Measurement, RequestDone, WarmingUp
from specsweep.tuning.events import (
    MeasuredElsewhere,
    Note,
    Planned,
    StartsLeft,
    StudyEvent,
    TrialDone,
    TrialFailed,
    TrialProgress,
    TrialReady,
    TrialReused,
    TrialStarting,
    Waiting,
)
from specsweep.tuning.plan import PlannedConfiguration, StudyPlan
from specsweep.tuning.stored import pick_best
from specsweep.tuning.study_time import StudyTime
from specsweep.types import ClockName, MeasuredConfig, StudySettings
from specsweep.watch.report import summary_lines, window_lines
from specsweep.watch.windows import WatchReport


def print_analysis(
    out: Console,
    analysis: StudyAnalysis,
    fmt: str,
    *,
    settings: StudySettings | None = None,
    folder: Path | None = None,
) -> None:
    """The recommendation per workload and concurrency, why, and the snippet per workload (in the
    study's build's flag names; an SGLang adaptive config written into ``folder``)."""
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
        out.print(f"{workload}: {snippet_heading(plan)}")
        for line in plan.notes:
            out.print(f"  [yellow]note:[/yellow] {line}")
        out.print(snippet_for(analysis, workload, fmt, settings=settings, folder=folder), highlight=False, markup=False)


def _range(low: float, high: float, digits: int = 1) -> str:
    return f"{low:.{digits}f}-{high:.{digits}f}"


def print_measurement(out: Console, result: Measurement) -> None:
    """The summary, shaped like the field report."""
    s = result.settings
    out.print(
        f"[bold]{result.endpoint}[/bold]  engine {result.engine or 'unknown'}, model {result.model}, "
        f"workload {result.workload}"
    )
    out.print(
        f"{s.requests} requests x {s.max_tokens} tokens per level, temperature {s.temperature:g}, "
        "token counts from usage"
    )
    for note in result.notes:
        out.print(note)
    clock = result.clock
    for level in result.levels:
        _print_level(out, level, clock=clock)


def _print_level(out: Console, level: LevelResult, *, clock: ClockName = "wall clock") -> None:
    m = level.summary
    label = "single stream" if m.concurrency == 1 else f"{m.concurrency} concurrent"
    out.print(f"\n[bold]{label}[/bold]  ({m.requests} requests, {m.errors} failed, {m.wall_s:.1f} s)")
    decode, ttft = m.decode_tokens_per_s_per_stream, m.ttft_s
    if m.output_tokens_per_s is not None:
        busy = ""
        if m.saturated_output_tokens_per_s is not None and m.concurrency > 1:
            busy = f" ({m.saturated_output_tokens_per_s:.1f} while all {m.concurrency} streams were busy)"
        out.print(f"  {m.output_tokens_per_s:8.1f} tok/s aggregate output, {clock}{busy}")
    if decode is not None:
        out.print(
            f"  {decode.p50:8.1f} tok/s decode per stream (p50; {_range(decode.min, decode.max)} across requests)"
        )
    if ttft is not None:
        out.print(f"  TTFT {_range(ttft.min, ttft.max, 3)} s (p50 {ttft.p50:.3f}, p95 {ttft.p95:.3f})")
    if m.tpot is not None:
        itl = f"; ITL p50 {1000 * m.itl.p50_s:.1f} ms, p99 {1000 * m.itl.p99_s:.1f} ms" if m.itl else ""
        out.print(f"  TPOT p50 {1000 * m.tpot.p50_s:.1f} ms, p99 {1000 * m.tpot.p99_s:.1f} ms{itl}")
    if m.prefill_tokens_per_s is not None:
        out.print(f"  prefill {m.prefill_tokens_per_s.max:,.0f} tok/s peak (prompt tokens / TTFT)")
    if m.tokens_per_chunk is not None:
        out.print(
            f"  {m.tokens_per_chunk:.2f} tokens per streamed chunk ({m.chunks_per_request:.0f} chunks per request)"
        )
    if m.server_generation_tokens_per_s is not None:
        ratio = f" ({m.server_to_client_ratio:.2f}x the client's)" if m.server_to_client_ratio else ""
        out.print(f"  server-reported generation {m.server_generation_tokens_per_s:.1f} tok/s{ratio}")
    acceptance = m.acceptance
    if acceptance is not None:
        out.print(
            "  acceptance per position "
            + ", ".join(f"{x:.3f}" for x in acceptance.per_position)
            + "  (conditional "
            + ", ".join(f"{x:.3f}" for x in acceptance.conditional)
            + ")"
        )
        out.print(
            f"  mean acceptance length {acceptance.mean_acceptance_length:.2f}, draft acceptance "
            f"{100 * acceptance.draft_acceptance_rate:.1f}%, {acceptance.num_drafts:,} drafts"
        )
    client = m.client_acceptance
    if client is not None and client.draft_acceptance_rate is not None:
        out.print(
            f"  per-request timings: {client.accepted_tokens:,} of {client.drafted_tokens:,} drafted tokens "
            f"accepted ({100 * client.draft_acceptance_rate:.1f}%)"
        )
    if client is not None and client.mean_acceptance_length is not None:
        out.print(f"  per-request accept length {client.mean_acceptance_length:.2f} tokens per verification step")
    if m.gauge_accept_length is not None:
        out.print(f"  server accept-length gauge {m.gauge_accept_length:.2f}")
    for note in level.notes:
        out.print(f"  [yellow]note:[/yellow] {note}")


class StudyProgress:
    """One line per trial; a transient status line with the phase and live tok/s on a terminal."""

    def __init__(self, out: Console, status: Status) -> None:
        self.out = out
        self.status = status
        self.level_started = 0.0
        self.level_tokens = 0

    def __call__(self, event: StudyEvent) -> None:
        out, status = self.out, self.status
        match event:
            case Note(text=text):
                out.print(f"note: {text}")
            case TrialStarting(trial=trial, configuration=configuration):
                status.update(f"trial {trial}: starting the server ({configuration_label(configuration, short=True)})")
            case TrialReady(trial=trial, startup_s=startup_s):
                status.update(f"trial {trial}: server ready after {startup_s:.1f} s")
            case TrialProgress(trial=trial, workload=workload, event=WarmingUp(concurrency=level)):
                status.update(f"trial {trial}: {workload} warming up at concurrency {level}")
            case TrialProgress(event=LevelStarted()):
                self.level_started, self.level_tokens = time.monotonic(), 0
            case TrialProgress(trial=trial, workload=workload, event=RequestDone(concurrency=level, record=record)):
                self.level_tokens += record.completion_tokens or 0
                elapsed = time.monotonic() - self.level_started
                live = f", {self.level_tokens / elapsed:,.0f} tok/s wall clock" if elapsed > 0 else ""
                status.update(f"trial {trial}: {workload} measuring concurrency {level}{live}")
            case TrialDone(trial=trial, results=results, boot_s=boot_s, measure_s=measure_s) as done:
                rates = "; ".join(
                    f"{w} " + ", ".join(f"{row.output_tokens_per_s:.1f} at {b}" for b, row in levels.items())
                    for w, levels in results.items()
                )
                took = ""
                if boot_s is not None and measure_s is not None:
                    unit = " modelled" if done.modelled else ""
                    took = f"  (boot {_minutes(boot_s)}, measuring {_minutes(measure_s)}{unit})"
                label = configuration_label(done.configuration, short=True)
                out.print(f"trial {trial:3d}  {label:22s} {rates} tok/s{took}")
            case Planned(phase=phase, reason=reason, configuration=configuration) if configuration is not None:
                out.print(f"          next: {phase}: {reason}")
            case StartsLeft() as left:
                out.print(f"          {left_line(left)}")
            case TrialFailed(trial=trial, reason=reason):
                out.print(f"trial {trial:3d}  [red]failed[/red]: {reason}")
            case TrialReused(trial=trial, source=source):
                out.print(f"trial {trial:3d}  same server as trial {source}: result reused, no start")
            case MeasuredElsewhere(trial=trial, source=source, worker=worker):
                out.print(f"trial {trial:3d}  worker {worker} measures this configuration (trial {source})")
            case Waiting(trials=trials):
                status.update(f"other workers measure the rest (trials {list(trials)}): waiting for them")


def print_best_measured(out: Console, configs: Sequence[MeasuredConfig], settings: StudySettings) -> None:
    """The best measured configuration per workload and concurrency, with its gains."""
    out.print(
        "\n[bold]best measured configuration[/bold] (aggregate output tok/s while every stream was busy, "
        "client-side; repeats averaged)"
    )
    for name in settings.workloads:
        for level in settings.concurrency_levels:
            pick = pick_best(configs, workload=name, concurrency=level, baseline=settings.baseline)
            if pick is None:
                continue
            gains = []
            if pick.off_rate and pick.best.spec is not None:
                gains.append(f"{100 * (pick.rate / pick.off_rate - 1):+.1f}% vs speculation off")
            if pick.baseline_rate and settings.baseline is not None and settings.baseline.spec is not None:
                over = baseline_name(candidate_of(settings.baseline.spec, level))
                gains.append(f"{100 * (pick.rate / pick.baseline_rate - 1):+.1f}% vs {over}")
            gap = f"; runner-up {100 * pick.runner_up_gap:.1f}% slower" if pick.runner_up_gap is not None else ""
            out.print(
                f"  {name} at concurrency {level}: {configuration_label(pick.best.configuration, short=True)}  "
                f"{pick.rate:.1f} tok/s  "
                f"({', '.join(gains) or _no_reference(pick.best)}{gap})"
            )


def _no_reference(best: MeasuredConfig) -> str:
    return "nothing speculative measured here" if best.spec is None else "no reference measured"


def print_boot(out: Console, best: MeasuredConfig, *, on_emulator: bool) -> None:
    """What the best measured configuration's server said at boot."""
    boot = best.boot
    facts = []
    if best.startup_s is not None:
        facts.append(f"started in {best.startup_s:.1f} s" + (" (wall clock, time-scaled)" if on_emulator else ""))
    if boot.kv_cache_tokens:
        facts.append(f"KV cache {boot.kv_cache_tokens:,} tokens")
    if boot.max_concurrency:
        facts.append(f"max concurrency {boot.max_concurrency:.2f}x")
    if boot.memory_suggestions and boot.binding_memory_suggestion is not None:
        shown = ", ".join(f"{x:.4f}" for x in boot.memory_suggestions)
        facts.append(
            f"--gpu-memory-utilization suggestions per rank {shown} (the pool is the minimum over ranks: "
            f"use the largest, {boot.binding_memory_suggestion:.4f})"
        )
    if boot.fp8_default_kernel_warning:
        facts.append("the log warns that the default FP8 kernel config is used (a tuned one may be faster)")
    if facts:
        out.print(f"boot of trial {best.trial}: " + "; ".join(facts))


def left_line(left: StartsLeft) -> str:
    """What is left of the study: "start 4 of at most 11, about 6 expected; about 12.4 min left (modelled)"."""
    line = f"start {left.starts + 1} of at most {left.cap}"
    unit = " (modelled)" if left.modelled else ""
    if left.expected is not None and left.left_s is not None:
        return line + f", about {left.expected} expected; about {_minutes(left.left_s)} left{unit}"
    if left.start_s is not None:
        return line + f"; a start takes about {_minutes(left.start_s)}{unit}"
    return line + "; time left: known once a start is timed"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def print_study_time(out: Console, spent: StudyTime) -> None:
    """Where the run's time went, and what the grid would have cost on the same rig."""
    unit = " (modelled)" if spent.modelled else ""
    line = (
        f"time: {spent.starts} server starts; booting {_minutes(spent.boot_s)}, measuring "
        f"{_minutes(spent.measure_s)}{unit}; idle {_minutes(spent.idle_s)} (wall clock)"
    )
    if spent.grid_s is not None:
        line += (
            f"; a full grid of {spent.grid_configurations} configurations at {spent.grid_requests} requests per "
            f"level would take about {_minutes(spent.grid_s)}{unit}"
        )
    out.print(line)


def print_watch(out: Console, report: WatchReport, fmt: str, *, source: str, unchecked: tuple[str, ...] = ()) -> None:
    """Every window in a few lines, then the recommendation over all of them and the snippet."""
    out.print(f"\n[bold]watch[/bold] {report.engine} at {source}: {len(report.windows)} window(s)" + _scale(report))
    if report.rig is not None:
        out.print(f"rig: {describe_rig(report.rig)}")
    if unchecked:
        out.print(f"  unchecked against the running server: {', '.join(unchecked)}")
    for number, window in enumerate(report.windows, 1):
        for line in window_lines(window, number):
            out.print(line, highlight=False, markup=False)
    out.print("")
    for line in summary_lines(report, fmt):
        out.print(line, highlight=False, markup=False)


def watch_view(report: WatchReport, fmt: str, *, source: str) -> Group:
    """The live view: the last windows and the span so far, refreshed in place."""
    lines = [f"watch {report.engine} at {source}{_scale(report)} (Ctrl-C stops and prints the summary)"]
    for number, window in list(enumerate(report.windows, 1))[-3:]:
        lines += window_lines(window, number)
    lines += summary_lines(report, fmt)
    return Group(*(Text(line) for line in lines))


def _scale(report: WatchReport) -> str:
    return f"; {report.rates_note}" if report.rates_note else ""


def _planned_label(planned: PlannedConfiguration, plan: StudyPlan) -> str:
    """A planned configuration's label, with ``(baseline)`` after a speculative baseline."""
    c = planned.configuration
    return configuration_label(c) + (" (baseline)" if c.spec is not None and c == plan.baseline else "")


def print_plan(out: Console, plan: StudyPlan) -> None:
    """``study --dry-run``: the space, the levels and workloads, and every server command."""
    out.print(f"[bold]dry run[/bold] of study {plan.name}: nothing is started, nothing is written")
    first = [_planned_label(c, plan) for c in plan.configurations if c.first]
    out.print(
        f"space: {len(plan.configurations)} distinct configurations on {plan.engine} ({plan.mode} mode), "
        f"sampler {plan.sampler}; measured first: {', '.join(first) or 'none'}"
    )
    if plan.collapsed:
        out.print(f"  note: {plan.collapsed}")
    for w in plan.workloads:
        kinds = ", ".join(f"{tag or '-'} {count}" for tag, count in sorted(w.subcategories.items()))
        out.print(f"workload {w.name}: weight {w.weight:g}, {w.prompts} prompts ({kinds})")
    out.print(
        f"levels: concurrency {', '.join(map(str, plan.concurrency))}; requests {plan.requests}; "
        f"max_tokens {plan.max_tokens}, temperature {plan.temperature:g}"
    )
    if plan.context:
        out.print(f"context levels: {plan.context}", highlight=False)
    out.print(f"objective: {plan.objective}; {plan.budget}")
    out.print("server command per configuration" + (" (PORT: a free port picked at each start)" if any(
        " PORT" in c.command for c in plan.configurations) else "") + ":")  # fmt: skip
    for c in plan.configurations:
        out.print(f"  {_planned_label(c, plan)}:", highlight=False)
        out.print(f"    {c.command}", highlight=False, markup=False)
    for warning in plan.warnings:
        out.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
