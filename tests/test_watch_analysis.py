"""watch's arithmetic on hand-made snapshots, where the right answer is worked out by hand: counter
growth across restarts and label sets, gauge time per batch size, windows, and acceptance from
per-position counters, from totals only, and from SGLang's accept-length gauge."""

from __future__ import annotations

import pytest

from specsweep.engines import llamacpp, sglang, vllm
from specsweep.engines.registry import engine_from_metric_names, engine_info
from specsweep.measurement.series import IntervalReader, SeriesNames, intervals_from_snapshots
from specsweep.types import MetricsSnapshot
from specsweep.watch.engines import series_names
from specsweep.watch.traffic import split_windows, summarize_window, window_acceptance
from specsweep.watch.windows import WatchSettings, analyse_windows

NAMES = series_names(engine_info("vllm"))
GEN = vllm.COUNTERS.generation_tokens
DRAFTS = vllm.COUNTERS.num_drafts
DRAFT_TOKENS = vllm.COUNTERS.num_draft_tokens
ACCEPTED = vllm.COUNTERS.num_accepted_tokens
PER_POS = vllm.COUNTERS.accepted_per_position
RUNNING = NAMES.running


def snap(at: float, samples: dict[str, list[tuple[dict[str, str], float]]]) -> MetricsSnapshot:
    return MetricsSnapshot(taken_at=at, samples={name: tuple(rows) for name, rows in samples.items()})


def engines(*values: float, **extra: str) -> list[tuple[dict[str, str], float]]:
    """One series per data-parallel engine, engine "0", "1", ..."""
    return [({"engine": str(i), **extra}, v) for i, v in enumerate(values)]


def test_counters_grow_across_a_restart_and_are_summed_over_label_sets() -> None:
    # engine 0: 100 -> 150 -> 20 (restarted) -> 50; engine 1: 10 -> 30 -> 60 -> 70
    snapshots = [
        snap(0, {GEN: engines(100, 10)}),
        snap(1, {GEN: engines(150, 30)}),
        snap(2, {GEN: engines(20, 60)}),
        snap(3, {GEN: engines(50, 70)}),
    ]
    intervals = intervals_from_snapshots(snapshots, NAMES)
    assert [iv.growth[GEN] for iv in intervals] == [50 + 20, 20 + 30, 30 + 10]
    assert [iv.resets for iv in intervals] == [0, 1, 0]


def test_a_new_created_time_is_a_restart_even_when_the_value_rose() -> None:
    created = GEN.removesuffix("_total") + "_created"
    snapshots = [
        snap(0, {GEN: engines(100), created: engines(1000.0)}),
        snap(1, {GEN: engines(300), created: engines(1000.5)}),  # restarted and already past 100
    ]
    (interval,) = intervals_from_snapshots(snapshots, NAMES)
    assert interval.growth[GEN] == 300 and interval.resets == 1


def test_a_series_that_appears_later_counts_from_zero_unless_created_before() -> None:
    created = GEN.removesuffix("_total") + "_created"
    snapshots = [
        snap(10, {GEN: engines(100), created: engines(1.0)}),
        # a new engine 1 (created after the first read): all of its 40 is new; engine 2 existed
        # before the first read (created at 5) but was not scraped then: nothing of it is counted
        snap(11, {GEN: engines(110, 40, 500), created: engines(1.0, 10.5, 5.0)}),
    ]
    (interval,) = intervals_from_snapshots(snapshots, NAMES)
    assert interval.growth[GEN] == 10 + 40


def test_per_position_counts_are_summed_per_position_and_give_the_draft_length() -> None:
    def per_pos(*by_engine: tuple[float, ...]) -> list:
        return [
            ({"engine": str(e), "position": str(i)}, v) for e, row in enumerate(by_engine) for i, v in enumerate(row)
        ]

    snapshots = [
        snap(0, {DRAFTS: engines(0, 0), PER_POS: per_pos((0, 0, 0), (0, 0, 0))}),
        snap(1, {DRAFTS: engines(100, 50), PER_POS: per_pos((70, 40, 20), (30, 20, 5))}),
    ]
    (interval,) = intervals_from_snapshots(snapshots, NAMES)
    assert interval.per_position == (100, 60, 25) and interval.positions == 3
    assert interval.growth[DRAFTS] == 150


def test_running_gauge_time_per_batch_size_keeps_label_sets_apart() -> None:
    # two engines: engine 0 runs 2 then 3 requests, engine 1 runs 1 throughout; reads 0.5 s apart
    snapshots = [
        snap(0.0, {GEN: engines(0, 0), RUNNING: engines(2, 1)}),
        snap(0.5, {GEN: engines(10, 5), RUNNING: engines(2, 1)}),
        snap(1.0, {GEN: engines(20, 10), RUNNING: engines(3, 1)}),
        snap(2.0, {GEN: engines(40, 20), RUNNING: engines(0, 1)}),
    ]
    window = summarize_window(intervals_from_snapshots(snapshots, NAMES), start=0.0, end=2.0, names=NAMES)
    # each sample stands for the time since the previous read
    assert window.concurrency_s == {2: 0.5, 1: 2.0, 3: 0.5, 0: 1.0}
    assert window.label_sets == 2
    assert window.generation_tokens_per_s == pytest.approx(60 / 2.0)


def test_windows_take_the_intervals_that_end_inside_them() -> None:
    snapshots = [snap(t, {GEN: engines(10.0 * t)}) for t in range(7)]
    intervals = intervals_from_snapshots(snapshots, NAMES)
    windows = split_windows(intervals, start=0.0, end=6.0, window_s=4.0, names=NAMES)
    assert [(w.start, w.end, w.delta.generation_tokens) for w in windows] == [(0.0, 4.0, 40.0), (4.0, 6.0, 20.0)]


def steady(per_step: tuple[float, ...], drafts: float, *, reads: int = 12, with_per_pos: bool = True):
    """Reads one second apart of a server drafting ``drafts`` steps a second at k=len(per_step)
    with acceptance ``per_step`` (S_1..S_k) exactly."""
    k = len(per_step)
    out = []
    for t in range(reads):
        n = drafts * t
        accepted = n * sum(per_step)
        rows = {
            GEN: engines(n * (1 + sum(per_step))),
            DRAFTS: engines(n),
            DRAFT_TOKENS: engines(n * k),
            ACCEPTED: engines(accepted),
            RUNNING: engines(1),
        }
        if with_per_pos:
            rows[PER_POS] = [({"engine": "0", "position": str(i)}, n * s) for i, s in enumerate(per_step)]
        out.append(snap(float(t), rows))
    return out


def test_per_position_acceptance_is_the_counts_over_the_drafts_with_intervals() -> None:
    truth = (0.8, 0.6, 0.45)
    window = summarize_window(intervals_from_snapshots(steady(truth, 1000), NAMES), start=0, end=11, names=NAMES)
    acceptance = window_acceptance(window, NAMES, k_max=6)
    assert acceptance is not None and acceptance.source == "per_position" and acceptance.running_k == 3
    fit = acceptance.fit
    assert [p.per_position for p in fit.positions] == pytest.approx(list(truth))
    assert all(p.per_position_low < s < p.per_position_high for p, s in zip(fit.positions, truth, strict=True))
    assert [p.source for p in fit.prediction] == ["measured"] * 3 + ["extrapolated"] * 3


def test_without_per_position_counters_the_mean_acceptance_length_is_kept() -> None:
    truth = (0.8, 0.6, 0.45)
    snapshots = steady(truth, 1000, with_per_pos=False)
    window = summarize_window(intervals_from_snapshots(snapshots, NAMES), start=0, end=11, names=NAMES)
    acceptance = window_acceptance(window, NAMES, k_max=6)
    assert acceptance is not None and acceptance.source == "aggregate" and acceptance.running_k == 3
    fitted = [p.per_position for p in acceptance.fit.prediction[:3]]
    assert sum(fitted) == pytest.approx(sum(truth), rel=1e-6)  # what the totals say, and all they say
    a = fitted[0]
    assert fitted == pytest.approx([a, a**2, a**3])  # geometric: every S_i is modelled
    assert all(p.source != "measured" for p in acceptance.fit.prediction)


def test_sglang_accept_length_gauge_gives_acceptance_at_the_named_k() -> None:
    names = series_names(engine_info("sglang"))
    gen, gauge = sglang.COUNTERS.generation_tokens, sglang.ACCEPT_LENGTH_GAUGE
    snapshots = [
        snap(float(t), {gen: [({}, 2400.0 * t)], gauge: [({}, 2.4)], sglang.NUM_RUNNING_REQS: [({}, 2)]})
        for t in range(5)
    ]
    window = summarize_window(intervals_from_snapshots(snapshots, names), start=0, end=4, names=names)
    assert window_acceptance(window, names, k_max=6) is None  # no k: SGLang does not publish it
    acceptance = window_acceptance(window, names, k_max=6, running_k=3)
    assert acceptance is not None and acceptance.source == "gauge"
    assert 1 + sum(p.per_position for p in acceptance.fit.prediction[:3]) == pytest.approx(2.4, rel=1e-6)
    assert window.concurrency_s == {2: 4.0}


def test_no_rig_reports_acceptance_and_how_to_get_a_rig() -> None:
    intervals = intervals_from_snapshots(steady((0.7, 0.4), 500), NAMES)
    report = analyse_windows(intervals, WatchSettings(names=NAMES, window_s=6.0), start=0.0, end=11.0)
    assert len(report.windows) == 2 and all(w.acceptance is not None for w in report.windows)
    assert all(w.recommendation is None for w in report.windows)
    assert any("no rig" in note and "specsweep study" in note for note in report.notes)


def test_llama_cpp_metric_names_are_recognised_with_its_load_gauge() -> None:
    info = engine_from_metric_names({llamacpp.COUNTERS.generation_tokens, llamacpp.REQUESTS_PROCESSING})
    assert info is not None and info.name == "llama.cpp"
    names = series_names(info)
    assert names.running == llamacpp.REQUESTS_PROCESSING
    assert llamacpp.COUNTERS.accepted_per_position in names.wanted()


def test_the_reader_keeps_each_series_last_value_between_calls() -> None:
    reader = IntervalReader(NAMES)
    assert reader.add(snap(0, {GEN: engines(5)})) is None
    assert reader.add(snap(1, {GEN: engines(9)})).growth[GEN] == 4
    assert reader.add(snap(2, {GEN: engines(3)})).growth[GEN] == 3  # restarted
    assert isinstance(SeriesNames(counters=vllm.COUNTERS).wanted(), tuple)
