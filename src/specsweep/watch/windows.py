"""What ``specsweep watch`` concludes from a server's metrics: per window of time the traffic as
served (watch/traffic.py), its acceptance, and what a rig predicts and recommends for it
(watch/prediction.py); the same over the whole span, and what changed between windows.

Pure: watch/engines.py reads the metrics (a live poll or a Prometheus range) and picks the
engine's names and the rig's drafter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specsweep.analysis.drafters import Candidate, Drafter, drafter_fields
from specsweep.analysis.recommendation import batch_size_table
from specsweep.analysis.snippet_plan import UNKNOWN_MAX_NUM_SEQS
from specsweep.errors import FitError
from specsweep.measurement.series import Interval, SeriesNames
from specsweep.rigs.model import Rig
from specsweep.types import BatchSizeRange, ClockName, SpeculativeConfig
from specsweep.watch.prediction import (
    TrafficPrediction,
    TrafficRecommendation,
    predict_traffic,
    recommend_for_traffic,
    served_context,
)
from specsweep.watch.traffic import (
    ServedWindow,
    WindowAcceptance,
    merge_windows,
    split_windows,
    window_acceptance,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchSettings:
    """What watch was asked: the rig, the running configuration where metrics cannot say it, windows."""

    names: SeriesNames  # the engine's sample names
    engine: str = "vllm"
    per_batch_size_tables: bool = True  # the engine takes num_speculative_tokens_per_batch_size
    rig: Rig | None = None
    drafter: Drafter | None = None  # the rig's drafter the server runs (None: no rig)
    running_config: SpeculativeConfig | None = None  # --running-config
    window_s: float = 3600.0
    clock: ClockName = "wall clock"  # "modelled": the snapshots are on the emulator's modelled clock (runtime/poll.py)
    max_num_seqs: int | None = None  # the server's, for a table's last row (None: not known)
    draws: int = 400
    seed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowReport:
    """One window: what was served, its acceptance, and the recommendation for it."""

    window: ServedWindow
    acceptance: WindowAcceptance | None
    prediction: TrafficPrediction | None
    recommendation: TrafficRecommendation | None
    spec: SpeculativeConfig | None  # the configuration to paste (None: speculation off, or nothing to say)
    observed_tokens_per_s: float | None  # generation counter over the window, in the rig's units
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.recommendation.choice.label if self.recommendation else "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchReport:
    """Every window, the whole span, and what changed between windows."""

    engine: str
    drafter: Drafter | None
    windows: tuple[WindowReport, ...]
    overall: WindowReport
    changes: tuple[str, ...]
    clock: ClockName  # as WatchSettings.clock
    rig: Rig | None
    notes: tuple[str, ...] = ()

    @property
    def rates_note(self) -> str | None:
        """What the rates and windows are, where they are not the server's wall clock (the emulator's)."""
        if self.clock == "wall clock":
            return None
        return (
            "rates and windows on the modelled hardware's clock (the emulator runs faster; its clock is undone "
            "as /metrics is read, from the first read on)"
        )


def analyse_windows(
    intervals: Sequence[Interval],
    settings: WatchSettings,
    *,
    start: float,
    end: float,
    cache: dict[tuple[float, float, int], WindowReport] | None = None,
) -> WatchReport:
    """Windows of ``settings.window_s`` over [start, end], each with its estimates and recommendation.

    ``cache`` (live mode) keeps finished windows' reports between calls, keyed by their span."""
    names = settings.names
    windows = split_windows(intervals, start=start, end=end, window_s=settings.window_s, names=names)
    if not windows:
        raise FitError("no interval to read: watch needs at least two snapshots of the metrics.")
    drafter = settings.drafter if settings.rig is not None else None
    reports = []
    for window in windows:
        key = (window.start, window.end, len(window.intervals))
        if cache is not None and key in cache:
            reports.append(cache[key])
            continue
        report = window_report(window, settings, drafter)
        if cache is not None and window.end < end:
            cache[key] = report
        reports.append(report)
    overall = window_report(merge_windows(windows, names), settings, drafter, parts=reports)
    return WatchReport(
        engine=settings.engine,
        drafter=drafter,
        windows=tuple(reports),
        overall=overall,
        changes=describe_changes(reports),
        clock=settings.clock,
        rig=settings.rig,
        notes=_span_notes(windows, settings),
    )


def window_report(
    window: ServedWindow, settings: WatchSettings, drafter: Drafter | None, *, parts: Sequence[WindowReport] = ()
) -> WindowReport:
    """One window's acceptance, prediction and recommendation; ``parts``: the windows a span combines."""
    names = settings.names
    rig = settings.rig
    running_k = window.running_k or _configured_k(settings)
    k_max = max([*(rig.draft_lengths(drafter) if rig and drafter else ()), running_k or 1]) + (0 if rig else 3)
    sometimes = rig is not None and drafter is not None and _drafts_sometimes(rig, drafter)
    notes = list(window.notes)
    observed = window.generation_tokens_per_s
    try:
        acceptance = window_acceptance(
            window, names, k_max=k_max, running_k=_configured_k(settings), every_step=sometimes, seed=settings.seed
        )
    except FitError as exc:
        acceptance, notes = None, [*notes, f"acceptance could not be fitted: {exc}"]
    empty = WindowReport(window=window, acceptance=acceptance, prediction=None, recommendation=None, spec=None,
                         observed_tokens_per_s=observed, notes=tuple(notes))  # fmt: skip
    if acceptance is None:
        if not window.delta.generation_tokens:
            return replace(empty, notes=(*notes, "the server generated nothing in this window"))
        if names.accept_length and _configured_k(settings) is None:
            notes.append("SGLang publishes no draft length: give the running one with --running-config")
        elif not window.delta.num_drafts:
            notes.append("no drafts were counted: the server runs without speculation, or publishes no spec counters")
        return replace(empty, notes=tuple(notes))
    notes.extend(acceptance.notes)
    if rig is None or drafter is None:
        return replace(empty, notes=tuple(notes))
    prediction = None
    try:
        if parts:
            usable = [(p.window.duration_s, p.prediction) for p in parts if p.prediction is not None]
            if not usable:  # say why the windows had none (they said it each: the gauge, say)
                why = dict.fromkeys(
                    "no window had a prediction: " + n.removeprefix("no prediction: ")
                    for p in parts
                    for n in p.notes
                    if n.startswith("no prediction: ")
                )
                return replace(empty, notes=(*notes, *why))
        else:
            context, said = served_context(window.delta.prompt_tokens, window.finished_requests, rig)
            prediction = _predict(window, acceptance, settings, rig, drafter, context)
            notes.extend([said] if said else [])
            usable = [(window.duration_s, prediction)]
        recommendation = recommend_for_traffic(
            usable, running_k_at=_running_k_at(settings, acceptance.running_k), measured_k=acceptance.running_k,
            allow_table=settings.per_batch_size_tables,
        )  # fmt: skip
    except FitError as exc:
        return replace(empty, notes=(*notes, f"no prediction: {exc}"))
    spec = _paste(recommendation, drafter, settings)
    for batch, source in sorted((prediction.sources if prediction else {}).items()):
        if source != "measured":
            notes.append(f"the rig's step time at batch size {batch} is {source} from its concurrency levels")
    return WindowReport(
        window=window, acceptance=acceptance, prediction=prediction, recommendation=recommendation, spec=spec,
        observed_tokens_per_s=observed, notes=tuple(notes),
    )  # fmt: skip


def _predict(
    window: ServedWindow,
    acceptance: WindowAcceptance,
    settings: WatchSettings,
    rig: Rig,
    drafter: Drafter,
    context: int,  # the served context the rig is read at (served_context)
) -> TrafficPrediction:
    observed = window.observed_s
    sets = max(window.label_sets, 1)
    weights = {b: s / observed * sets for b, s in window.concurrency_s.items() if b >= 1} if observed else {}
    if not weights:
        raise FitError(no_concurrency_reason(window, settings.names))
    completion = window.mean_completion_tokens or _rig_completion_tokens(rig)
    running = Candidate(drafter=drafter, num_speculative_tokens=acceptance.running_k)
    share = None
    if acceptance.steps and window.delta.num_drafts and acceptance.steps > window.delta.num_drafts:
        share = window.delta.num_drafts / acceptance.steps
    return predict_traffic(
        rig, drafter, acceptance.fit, weights=weights, completion_tokens=completion, running=running,
        draft_share=share, k_max=acceptance.fit.k_max, draws=settings.draws, seed=settings.seed,
        context_tokens=context,
    )  # fmt: skip


def no_concurrency_reason(window: ServedWindow, names: SeriesNames) -> str:
    """Why a window has no concurrency to weigh the rig's rates by, though the server generated tokens
    (its rate comes from the generation counter, its concurrency from the running-requests gauge)."""
    if not window.observed_s:
        gauge = f" ({names.running})" if names.running else ""
        return f"the server publishes no running-requests gauge{gauge}: no concurrency to weigh by"
    return (
        "the running-requests gauge read 0 at every read, though the server generated tokens: its requests "
        "ran between reads; read more often (--interval, or Prometheus's scrape interval)"
    )


def _rig_completion_tokens(rig: Rig) -> float:
    """The rig's mean completion tokens, for traffic whose finished requests are not counted."""
    values = [v for w in rig.shape.workloads.values() if (v := w.get("completion_tokens"))]
    return sum(values) / len(values) if values else float(rig.shape.max_tokens)


def _configured_k(settings: WatchSettings) -> int | None:
    spec = settings.running_config
    return spec.num_speculative_tokens if spec is not None else None


def _running_k_at(settings: WatchSettings, running_k: int) -> Callable[[int], int]:
    spec = settings.running_config
    if spec is not None and spec.num_speculative_tokens_per_batch_size:
        return spec.k_for_batch_size
    return lambda _batch: running_k


def _drafts_sometimes(rig: Rig, drafter: Drafter) -> bool:
    """Whether the rig saw this drafter leave decode steps undrafted (n-gram lookup)."""
    return any(lv.draft_share is not None and lv.draft_share < 0.99 for lv in rig.levels if lv.drafter == drafter)


def _paste(
    recommendation: TrafficRecommendation, drafter: Drafter, settings: WatchSettings
) -> SpeculativeConfig | None:
    """The spec config that runs the recommendation: the running config's fields, else the rig's drafter's."""
    ks = recommendation.choice.k_by_batch
    if not ks or max(ks.values()) == 0:
        return None
    if settings.running_config is not None:
        template = settings.running_config
    else:
        template = SpeculativeConfig.from_json(json.dumps(drafter_fields(drafter)))
    table: tuple[BatchSizeRange, ...] = ()
    if not recommendation.choice.single:
        table = batch_size_table(ks, max_batch=settings.max_num_seqs or UNKNOWN_MAX_NUM_SEQS)
    return replace(
        template, num_speculative_tokens=max(ks.values()), num_speculative_tokens_per_batch_size=table or None
    )


def describe_changes(reports: Sequence[WindowReport]) -> tuple[str, ...]:
    """One sentence when the recommendation differs between windows, naming the windows of each."""
    by_label: dict[str, list[WindowReport]] = {}
    for report in reports:
        if report.recommendation is not None:
            by_label.setdefault(report.label, []).append(report)
    if len(by_label) < 2:
        return ()
    parts = [
        f"{label} in windows {', '.join(str(reports.index(r) + 1) for r in rows)}" for label, rows in by_label.items()
    ]
    return ("the recommendation changes with the traffic: " + "; ".join(parts),)


def _span_notes(windows: Sequence[ServedWindow], settings: WatchSettings) -> tuple[str, ...]:
    notes = []
    restarts = sum(w.resets for w in windows)
    if restarts:
        notes.append(
            f"the counters restarted from zero {restarts} time(s) (a server restart): counted from zero after it"
        )
    sets = max((w.label_sets for w in windows), default=0)
    if sets > 1:
        notes.append(
            f"{sets} label sets publish the running-requests gauge (data-parallel engines or several servers): "
            "counters are summed, and each label set's gauge counts as a batch of its own"
        )
    if settings.rig is None:
        notes.append(
            "no rig: acceptance and load only. A rig (step time against k and concurrency) comes from one study "
            "on this setup: specsweep study writes studies/NAME/rig.json, specsweep rig STUDY writes it again"
        )
    return tuple(notes)
