"""What the commands print: one home for every printer, shared by the commands.

Rates are aggregate output tok/s, client side, unless a line says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from rich.console import Console

from specsweep.analysis.drafters import candidate_of, configuration_label
from specsweep.report.study_report import baseline_name
from specsweep.runtime.measure import LevelResult, Measurement
from specsweep.tuning.stored import pick_best
from specsweep.types import ClockName, MeasuredConfig, StudySettings

WIDTH = 100  # the widest line a command prints, a paste or a command to copy aside


def fitted_console(
    *, file: IO[str] | None = None, width: int | None = None, force_terminal: bool | None = None, stderr: bool = False
) -> Console:
    """The console a command prints on: the terminal's width (``width``) up to ``WIDTH``, wrapping
    what is longer (a paste is printed with soft_wrap, whole); piped, rich's 80 columns and no
    control codes. ``file``, ``force_terminal``, ``stderr``: as rich's Console takes them."""
    seen = width or Console(file=file, force_terminal=force_terminal, stderr=stderr).width
    return Console(file=file, width=min(seen, WIDTH), force_terminal=force_terminal, highlight=False, stderr=stderr)


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
