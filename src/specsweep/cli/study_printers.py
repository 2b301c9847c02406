"""What ``specsweep study`` prints around its trials, read at a glance: a header that says once
where the study runs and on which clock, then (the rows and the live display: cli/study_progress.py)
a few one-line facts, the picks as one table, the paste and where the report is. ``--verbose`` adds
the long forms of the one-line facts and why each pick won.

Every line fits ``WIDTH`` columns except the paste, which is never wrapped or cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from specsweep.analysis.context_mix import ContextGrid, context_grids, context_members
from specsweep.analysis.recommendation import Gain, Recommendation
from specsweep.analysis.study import StudyAnalysis
from specsweep.cli.study_progress import minutes
from specsweep.config import StudyConfig
from specsweep.report.study_report import snippet_for
from specsweep.tuning.search_words import Leaders
from specsweep.tuning.study_time import StudyTime
from specsweep.types import MeasuredConfig, StudySettings


def print_header(
    out: Console, config: StudyConfig, *, size: int, storage: str, built_in: bool, extra: str = ""
) -> None:
    """Once, before anything runs: the study, where it runs and on which clock, where it is kept."""
    m = config.measure
    levels = ", ".join(map(str, m.concurrency))
    out.print(
        f"[bold]study {config.name}[/bold]: {', '.join(config.workloads)} at concurrency {levels}, "
        f"temperature {m.temperature:g}"
    )
    server = config.server
    if server.mode == "emulator":
        which = "the built-in emulator" if built_in else "the emulator"
        out.print(
            f"on [bold yellow]{which}[/bold yellow], profile {server.emulator.profile}: "
            "every figure is [bold]modelled[/bold]"
        )
    else:
        out.print(f"on your {server.engine} server ({server.mode} mode), started once per configuration")
    kept = f"{size} configurations, stored in {storage}{extra}"
    real = "--config FILE tunes a real server"
    if built_in and len(f"{kept}; {real}") <= out.width:
        kept, real = f"{kept}; {real}", ""
    out.print(kept, highlight=False)
    if built_in and real:
        out.print(real)


def print_stop(
    out: Console, reason: str, starts: int, spent: StudyTime | None, leaders: Sequence[Leaders], *, verbose: bool
) -> None:
    """Why the search stopped, what the run cost against a grid, and the leaders: one line each
    (``verbose``: in full)."""
    tail = f" ({starts} server starts this run)"
    if not verbose and len("stopped: " + reason + tail) > out.width:
        reason = reason.split(": ", maxsplit=1)[0].split("; ", maxsplit=1)[0]
    out.print(f"\n[bold]stopped:[/bold] {reason}{tail}")
    if spent is not None and spent.starts:
        took = minutes(spent.boot_s + spent.measure_s)
        line = f"time: {took}, {spent.starts} start{'' if spent.starts == 1 else 's'} ({minutes(spent.boot_s)} booting)"
        if spent.grid_s is not None:
            line += f"; a grid of {spent.grid_configurations}: about {minutes(spent.grid_s)}"
        if verbose:
            line += f"; idle {minutes(spent.idle_s)} (wall clock)"
        out.print(line)
    if verbose:
        for tie in leaders:
            out.print(f"leaders: {tie.line}")
    elif leaders:
        out.print(leaders_line(leaders, out.width))


def leaders_line(leaders: Sequence[Leaders], width: int) -> str:
    """As many leaders as one line of ``width`` holds, and how many more ``--verbose`` says."""
    for n in range(len(leaders), 0, -1):
        more = f" (+{len(leaders) - n} more: --verbose)" if n < len(leaders) else ""
        line = "leaders: " + "; ".join(tie.short for tie in leaders[:n]) + more
        if len(line) <= width:
            return line
    return "leaders: " + leaders[0].short


def print_boot(out: Console, best: MeasuredConfig, *, on_emulator: bool, verbose: bool) -> None:
    """What the best measured configuration's server said at boot: one line (``verbose``: every fact in full)."""
    boot = best.boot
    facts: list[tuple[str, str]] = []  # short, in full
    if best.startup_s is not None:
        clock = " (wall clock)" if on_emulator else ""
        facts.append((f"ready in {best.startup_s:.1f} s{clock}", f"started in {best.startup_s:.1f} s{clock}"))
    if boot.kv_cache_tokens:
        facts.append((f"KV cache {boot.kv_cache_tokens:,} tokens",) * 2)
    if boot.max_concurrency:
        facts.append((f"max concurrency {boot.max_concurrency:.2f}x",) * 2)
    if boot.memory_suggestions and boot.binding_memory_suggestion is not None:
        shown = ", ".join(f"{x:.4f}" for x in boot.memory_suggestions)
        facts.append(
            (
                f"--gpu-memory-utilization {boot.binding_memory_suggestion:.4f}",
                f"--gpu-memory-utilization suggestions per rank {shown} (the pool is the minimum over ranks: "
                f"use the largest, {boot.binding_memory_suggestion:.4f})",
            )
        )
    if boot.fp8_default_kernel_warning:
        facts.append(
            (
                "default FP8 kernel config",
                "the log warns that the default FP8 kernel config is used (a tuned one may be faster)",
            )
        )
    if not facts:
        return
    head = f"boot of trial {best.trial}: "
    if verbose:
        out.print(head + "; ".join(full for _, full in facts))
        return
    shorts = [short for short, _ in facts]
    while len(shorts) > 1 and len(head + "; ".join(shorts)) > out.width:
        shorts.pop()
    out.print(head + "; ".join(shorts), markup=False)


def _gain(gain: Gain | None) -> str:
    """A gain as a table cell: predicted where the model has it, else measured ("-": neither)."""
    if gain is None:
        return "-"
    if gain.predicted is not None:
        return f"{100 * gain.predicted:+.1f}%"
    return f"{100 * gain.measured:+.1f}% measured" if gain.measured is not None else "-"


def picks_table(recommendations: Sequence[Recommendation]) -> Table:
    """One row per workload and concurrency: the pick, its predicted rate and 95% interval, what
    was measured of it, and its gains against speculation off and the baseline (when there is
    one), as the recommendation holds them."""
    one = len({r.workload for r in recommendations}) == 1
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("concurrency" if one else "cell", justify="right" if one else "left")
    table.add_column("pick", no_wrap=True)
    table.add_column("tok/s", justify="right")
    table.add_column("interval", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("vs off", justify="right")
    if any(r.gain_over_baseline is not None for r in recommendations):
        table.add_column("vs baseline", justify="right")
    shown = len(table.columns)
    for r in recommendations:
        pick = r.choice.short_label if r.measured else f"{r.choice.short_label} (never measured)"
        row = [
            str(r.concurrency) if one else f"{r.workload} at {r.concurrency}",
            pick,
            f"{r.tokens_per_s:.1f}",
            f"{r.tokens_per_s_low:.1f}-{r.tokens_per_s_high:.1f}",
            "-" if r.measured_tokens_per_s is None else f"{r.measured_tokens_per_s:.1f}",
            "-" if r.speculation_off else _gain(r.gain_over_off),
            _gain(r.gain_over_baseline),
        ]
        table.add_row(*row[:shown])
    return table


def context_table(grid: ContextGrid, *, short: bool) -> Table:
    """One row per context, one column per concurrency: each cell's pick, its predicted rate and
    its gain over speculation off ("*": never measured there; ``short``: k alone, one drafter)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("context")
    for level in grid.concurrency_levels:
        table.add_column(f"at {level}", justify="right")
    for row in grid.rows:
        cells = []
        for level in grid.concurrency_levels:
            r = row.picks.get(level)
            if r is None:
                cells.append("-")
                continue
            name = f"k={r.choice.num_speculative_tokens}" if short and not r.speculation_off else r.choice.short_label
            gain = "" if r.speculation_off else f" {_gain(r.gain_over_off)}"
            cells.append(f"{name}{'' if r.measured else '*'} {r.tokens_per_s:.1f}{gain}")
        table.add_row(row.label, *cells)
    return table


def baseline_said(recommendations: Sequence[Recommendation]) -> str:
    """ "; baseline: k=5 probabilistic" (what the server ran before the study; "" without one)."""
    over = sorted({r.gain_over_baseline.over.short_label for r in recommendations if r.gain_over_baseline})
    return f"; baseline: {', '.join(over)}" if over else ""


def print_picks(
    out: Console, analysis: StudyAnalysis, *, verbose: bool, configs: Sequence[MeasuredConfig] = ()
) -> None:
    """The picks as one table (``verbose``: each with the reason the recommendation gives), then
    each workload with context levels as a grid of its best k by context (``configs``: the
    measured ones, for the plain workload's prompt tokens)."""
    recs = analysis.recommendations
    workloads = "" if len({r.workload for r in recs}) != 1 else f" for {recs[0].workload}"
    out.print(f"\n[bold]picks[/bold]{workloads} (predicted tok/s, 95% interval{baseline_said(recs)})")
    out.print(picks_table(analysis.recommendations))
    for grid in context_grids(recs, configs):
        drafters = {r.choice.drafter for row in grid.rows for r in row.picks.values() if not r.choice.off}
        one = next(iter(drafters)) if len(drafters) == 1 else None
        said = f"{one.draft_sample_method}; " if one is not None else ""
        out.print(f"\n[bold]best k by context[/bold] for {grid.workload} ({said}predicted tok/s, vs off)")
        out.print(context_table(grid, short=one is not None))
    if verbose:
        for rec in analysis.recommendations:
            out.print(f"{rec.workload} at {rec.concurrency}: {rec.reason}", style="dim")
    for note in analysis.notes:
        out.print(f"[yellow]note:[/yellow] {note}")


def print_paste(out: Console, analysis: StudyAnalysis, fmt: str, *, settings: StudySettings | None) -> None:
    """Each workload's paste, whole: never wrapped or cut, whatever the console's width."""
    mixed = context_members(analysis.workloads)
    for workload in analysis.workloads:
        plan = analysis.snippet(workload)
        if plan is None or any(workload in members[1:] for members in mixed.values()):
            continue  # a context level: its workload's paste covers it
        table = ""
        if plan.table:
            bound = "max_num_seqs" if plan.max_batch_known else "max_num_seqs not known"
            table = f" (a per-batch-size table up to batch {plan.max_batch}, {bound})"
        out.print(f"\n[bold]paste[/bold] for {workload}{table}:")
        for line in plan.notes:
            out.print(f"[yellow]note:[/yellow] {line}")
        paste = snippet_for(analysis, workload, fmt, settings=settings)
        out.print(paste, soft_wrap=True, markup=False, highlight=False)
