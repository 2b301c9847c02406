"""What the commands print of a rig: what it was measured on, its step times and step model, a workload's
recommendation from it (``measure --rig``) and what ``study --rig`` started and found.

Rates are aggregate output tok/s, client side, unless a line says otherwise.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specsweep.analysis.recommendation import Recommendation
from specsweep.rigs.model import Rig, context_label
from specsweep.rigs.stored import WorkloadOnRig
from specsweep.rigs.study import RigStudyOutcome


def describe_rig(built: Rig) -> str:
    """One line: what the rig was measured on and what it covers."""
    ident = built.identity
    drafters = "; ".join(f"{d.label} k={_ks(built.draft_lengths(d))}" for d in built.drafters)
    contexts = f", context levels {', '.join(map(context_label, built.context_levels))}" if built.context_levels else ""
    return (
        f"{ident.engine} {ident.engine_version or '(version unknown)'}, model {ident.model or '(unknown)'}, "
        f"concurrency {list(built.concurrency_levels)}{contexts}, {drafters or 'no drafter'}"
    )


def _ks(ks: tuple[int, ...]) -> str:
    if ks and list(ks) == list(range(ks[0], ks[-1] + 1)) and len(ks) > 2:
        return f"{ks[0]}..{ks[-1]}"
    return ",".join(map(str, ks))


def print_rig(out: Console, built: Rig) -> None:
    out.print(f"[bold]rig[/bold]: {describe_rig(built)}")
    if built.identity.server_args:
        out.print(f"  flags: {' '.join(built.identity.server_args)}")
    levels: dict[tuple[int, int, str], list[str]] = {}
    for o in built.model.observations:
        name = "speculation off" if o.candidate.off or o.drafter is None else o.drafter.label
        key = (o.context_tokens, o.concurrency, name)
        levels.setdefault(key, []).append(f"k={o.num_speculative_tokens} {1000 * o.step_time_s:.2f}")
    for (context, concurrency, name), points in sorted(
        levels.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "speculation off", kv[0][2])
    ):
        at = f" at context {context_label(context)}" if context else ""
        out.print(f"  concurrency {concurrency}{at}, {name}: decode step ms {', '.join(points)}")
    out.print(f"  step model: {built.model.basis}")


def _gain(rec: Recommendation) -> str:
    gain = rec.gain_over_baseline
    if gain is None or gain.predicted is None:
        return ""
    return (
        f"; expected gain over the running {gain.over.short_label}: {100 * gain.predicted:+.1f}% "
        f"({rec.confidence:.0%} {100 * (gain.predicted_low or 0):+.1f}% to {100 * (gain.predicted_high or 0):+.1f}%)"
    )


def print_rig_recommendation(
    out: Console,
    built: Rig,
    path: Path | None,
    result: WorkloadOnRig,
    *,
    unchecked: tuple[str, ...],
    note: str | None = None,
) -> None:
    """The recommendation with no start, one line per concurrency level, and how far it extrapolates
    (``note``: what the rig did not measure, said once under its line)."""
    fit = result.fit
    out.print(f"\n[bold]rig[/bold] {path or ''}: {describe_rig(built)}")
    if unchecked:
        hint = " (pass --server-args to check them)" if "server_args" in unchecked else ""
        out.print(f"  unchecked against the running server: {', '.join(unchecked)}{hint}")
    if note:
        out.print(f"  {note}", highlight=False)
    measured = ", ".join(f"{p.per_position:.3f}" for p in fit.positions)
    out.print(
        f"[bold]{result.workload}[/bold] measured at the running k={fit.measured_positions}: S_1..S_"
        f"{fit.measured_positions} = {measured}; acceptance past it from the {fit.chosen} decay fit"
    )
    shares = result.timing.draft_share
    if shares and min(shares.values()) < 0.99:
        shown = ", ".join(f"{q:.0%} of decode steps at concurrency {b}" for b, q in sorted(shares.items()))
        out.print(f"  it drafted at {shown} (S_i are per step; the rig carries the share to other k)")
    idle = {
        k
        for b in built.concurrency_levels
        for k in built.draft_lengths(result.drafter, b)
        if built.draft_share(result.drafter, k, b) == 0
    }
    if idle:
        out.print(f"  on the rig this drafter drafted nothing at k={','.join(map(str, sorted(idle)))}")
    for item in result.recommendations:
        rec = item.recommendation
        running = (
            f"; running {item.running.short_label} measured {item.running_tokens_per_s:.1f} tok/s"
            if item.running is not None and item.running_tokens_per_s
            else ""
        )
        out.print(
            f"  concurrency {rec.concurrency}: recommended {rec.choice.short_label}  {rec.tokens_per_s:.1f} tok/s "
            "predicted "
            f"({rec.confidence:.0%} {rec.tokens_per_s_low:.1f}-{rec.tokens_per_s_high:.1f}){running}{_gain(rec)}"
        )
        if rec.tied:
            tied = ", ".join(c.short_label for c in rec.tied)
            out.print(f"    the data cannot tell it from {tied}: measure both again to separate them")
        if item.extrapolated_positions:
            first, last = item.extrapolated_positions[0], item.extrapolated_positions[-1]
            span = f"position {first}" if first == last else f"positions {first}..{last}"
            out.print(
                f"    extrapolated: {span} of {rec.choice.short_label} come from the fitted {item.acceptance_model} "
                f"decay model (measured up to {item.measured_positions}); measure at "
                f"k={rec.choice.num_speculative_tokens} to confirm"
            )
        elif item.measured_positions < item.k_max:
            out.print(
                f"    k={item.measured_positions + 1}..{item.k_max} were ranked on extrapolated acceptance "
                f"({item.acceptance_model} decay model); the recommendation itself needs none"
            )
        if item.step_time_extrapolated:
            out.print("    its step time is the rig's line, not a measured point")


def print_rig_study(out: Console, result: RigStudyOutcome, path: Path) -> None:
    """What study --rig measured, why, and the recommendation per workload."""
    out.print(
        f"\n{result.starts} server start(s) this run: "
        + "; ".join(f"{p.candidate.short_label} ({p.reason})" for p in result.plan)
    )
    for note in result.notes:
        out.print(f"  {note}")
    for item in result.results:
        print_rig_recommendation(out, result.rig, path, item, unchecked=result.unchecked)
    if result.check is not None:
        out.print(f"\n[bold]check[/bold] of the predicted optimum k={result.check.num_speculative_tokens}:")
        for workload, level, predicted, measured in result.check.rows:
            shown = (
                f"{measured:.1f} measured ({100 * (measured / predicted - 1):+.1f}%)" if measured else "not measured"
            )
            out.print(f"  {workload} at concurrency {level}: {predicted:.1f} tok/s predicted, {shown}")
