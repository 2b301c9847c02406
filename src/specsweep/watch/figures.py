"""The figures of a watch report, as data (tests assert on them) that report/figures.py draws:
acceptance per window, the concurrency each window ran at, and the predicted gain of every k."""

from __future__ import annotations

from specsweep.report.figures import FigureData, Panel, Series
from specsweep.watch.windows import WatchReport


def _name(number: int) -> str:
    return f"window {number}"


def acceptance_by_window_data(report: WatchReport) -> FigureData:
    """S_i against position per window: measured with Wilson bars, the fitted curve with its band past them."""
    series: list[Series] = []
    for number, window in enumerate(report.windows, 1):
        if window.acceptance is None:
            continue
        fit = window.acceptance.fit
        if fit.positions:
            series.append(
                Series(
                    label=f"{_name(number)}: measured",
                    x=tuple(float(p.position) for p in fit.positions),
                    y=tuple(p.per_position for p in fit.positions),
                    low=tuple(p.per_position_low for p in fit.positions),
                    high=tuple(p.per_position_high for p in fit.positions),
                    style="points",
                )
            )
        series.append(
            Series(
                label=f"{_name(number)}: {fit.chosen}"
                + ("" if fit.positions else " (from the mean acceptance length)"),
                x=tuple(float(p.num_speculative_tokens) for p in fit.prediction),
                y=tuple(p.per_position for p in fit.prediction),
                low=tuple(p.per_position_low for p in fit.prediction),
                high=tuple(p.per_position_high for p in fit.prediction),
                style="band",
            )
        )
    panel = Panel(title="per-position acceptance", xlabel="position i", ylabel="S_i", series=tuple(series))
    return FigureData(title="Acceptance per window", panels=(panel,))


def concurrency_data(report: WatchReport) -> FigureData:
    """Share of each window's time at every running batch size (0: idle), bars side by side."""
    count = max(len(report.windows), 1)
    width = 0.8 / count
    series = []
    for number, window in enumerate(report.windows, 1):
        shares = window.window.concurrency_shares()
        offset = (number - 1 - (count - 1) / 2) * width
        series.append(
            Series(
                label=_name(number),
                x=tuple(b + offset for b in shares),
                y=tuple(100.0 * s for s in shares.values()),
                style="bars",
                width=width,
            )
        )
    panel = Panel(
        title="running requests (gauge samples)", xlabel="batch size", ylabel="% of time", series=tuple(series)
    )
    return FigureData(title="Concurrency per window", panels=(panel,))


def gain_data(report: WatchReport) -> FigureData:
    """Left: each single k's predicted rate over the running configuration, per window. Right: the
    recommendation's predicted gain per window, with its band."""
    curves: list[Series] = []
    x, y, low, high = [], [], [], []
    for number, window in enumerate(report.windows, 1):
        rec = window.recommendation
        if rec is None or rec.running is None:
            continue
        base = rec.running.tokens_per_s
        singles = [r for r in rec.rates if r.single]
        curves.append(
            Series(
                label=_name(number),
                x=tuple(float(next(iter(r.k_by_batch.values()))) for r in singles),
                y=tuple(100.0 * (r.tokens_per_s / base - 1.0) for r in singles),
                low=tuple(100.0 * (r.tokens_per_s_low / base - 1.0) for r in singles),
                high=tuple(100.0 * (r.tokens_per_s_high / base - 1.0) for r in singles),
                style="band",
            )
        )
        if rec.gain is not None:
            x.append(float(number))
            y.append(100.0 * rec.gain)
            low.append(100.0 * (rec.gain_low or 0.0))
            high.append(100.0 * (rec.gain_high or 0.0))
    by_k = Panel(
        title="every k over the running config", xlabel="k (0: off)", ylabel="predicted %", series=tuple(curves)
    )
    chosen = Series(label="recommended", x=tuple(x), y=tuple(y), low=tuple(low), high=tuple(high), style="points")
    per_window = Panel(title="recommendation over the running config", xlabel="window", ylabel="predicted gain %",
                       series=(chosen,) if x else ())  # fmt: skip
    return FigureData(title="Predicted gain", panels=(by_k, per_window))
