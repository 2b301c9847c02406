"""``specsweep watch``: tune from production traffic by reading the server's metrics only."""

from __future__ import annotations

import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live

from specsweep.cli.options import check_duration, check_url, one_of, seconds_of
from specsweep.cli.watch_printers import print_watch, watch_view
from specsweep.engines.registry import EngineInfo, max_num_seqs_flag
from specsweep.engines.sglang import adaptive_line
from specsweep.errors import ConfigError
from specsweep.measurement.series import intervals_from_snapshots
from specsweep.report.snippets import FORMATS, snippet_format_for
from specsweep.rigs.file import check_server_against_rig, load_rig
from specsweep.runtime.client import api_key_from_env
from specsweep.runtime.identity import read_server_identity
from specsweep.runtime.modelled_time import ServerClock
from specsweep.runtime.poll import poll_metrics
from specsweep.runtime.stop_signals import sigterm_as_interrupt
from specsweep.secrets import mask_url
from specsweep.watch.engines import (
    check_model_labels,
    check_rig_engine,
    read_prometheus_span,
    series_names,
    watch_drafter,
)
from specsweep.watch.live import LiveWatch
from specsweep.watch.report import (
    WatchFiles,
    context_from_line,
    interval_json,
    watch_json,
    window_json,
    write_watch_report,
)
from specsweep.watch.windows import WatchReport, WatchSettings, analyse_windows


def _moment(text: str, flag: str) -> float:
    """Unix seconds, or an ISO 8601 time such as 2026-05-01T08:00 (local time unless it says)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is neither unix seconds nor an ISO 8601 time.") from None


# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = ("specsweep watch --endpoint http://127.0.0.1:8000 --rig studies/emulator-technical/rig.json",)


def watch(
    endpoint: str = typer.Option(
        None, callback=check_url, help="Base URL of the running server: read its /metrics live."
    ),
    prometheus: str = typer.Option(
        None, callback=check_url, help="Base URL of a Prometheus server: read the same series over a range."
    ),
    selector: str = typer.Option(
        None,
        help='With --prometheus: label matchers of the server\'s series, e.g. \'{job="vllm",instance="gpu1:8000"}\'.',
    ),
    since: str = typer.Option(None, callback=check_duration, help="With --prometheus: the range up to now, e.g. 6h."),
    start: str = typer.Option(
        None, help="With --prometheus: the range's start (unix seconds or ISO 8601), instead of --since."
    ),
    end: str = typer.Option(None, help="With --prometheus and --start: the range's end (default: now)."),
    step: str = typer.Option(
        None, callback=check_duration, help="With --prometheus: the query step (default 1s, coarser for long ranges)."
    ),
    rig: Path = typer.Option(
        None, help="A rig file (studies/NAME/rig.json): predict and recommend (without: acceptance and load only)."
    ),
    drafter: str = typer.Option(
        None,
        help="The running drafter, as the rig names it (e.g. 'dspark (probabilistic)'; specsweep rig lists them), "
        "when the rig has several.",
    ),
    running_config: str = typer.Option(
        None, help="The spec config JSON the server runs: the snippet keeps its fields; needed for SGLang (its k)."
    ),
    server_args: str = typer.Option(None, help="The server's command line, to check against the rig's flags."),
    engine: str = typer.Option(None, help="vllm, llama.cpp or sglang (default: detected from the metric names)."),
    interval: str = typer.Option("10s", callback=check_duration, help="Live: seconds between reads of /metrics."),
    window: str = typer.Option(
        None, callback=check_duration, help="Length of each window (default: 1h; on the emulator: modelled time)."
    ),
    duration: str = typer.Option(
        None, callback=check_duration, help="Live: stop after this long (default: at Ctrl-C)."
    ),
    max_num_seqs: int = typer.Option(None, min=1, help="The server's max_num_seqs: where a per-batch-size table ends."),
    json_lines: bool = typer.Option(
        False, "--json", help="One JSON line per interval (live) or per window (Prometheus)."
    ),
    report: Path = typer.Option(
        None, "--out", help="Also write report.md, report.html, results.json and figures in this folder."
    ),
    old_report: Path = typer.Option(None, "--report", hidden=True, help="Old spelling of --out."),
    fmt: str = typer.Option(
        None,
        "--format",
        callback=one_of(FORMATS),
        help="Format of the snippet to paste: vllm, vllm-yaml, compose, sglang, llama.cpp or json "
        "(default: the engine's).",
    ),
    snippet_format: str = typer.Option(
        None, "--snippet-format", hidden=True, callback=one_of(FORMATS), help="Old spelling of --format."
    ),
    api_key_env: str = typer.Option(None, help="Live: environment variable holding the bearer token for /metrics."),
    seed: int = typer.Option(0, help="Seed of the predictions' draws."),
) -> None:
    """Tune from production traffic: read the server's own metrics, no synthetic load, no start.

    Live (--endpoint) reads /metrics every --interval and refreshes a compact view in place;
    with --prometheus it reads the same series from Prometheus over --since (or --start/--end) and
    reports once. Per window: per-position acceptance at the running k (the decay fit past it,
    said as extrapolated), the concurrency the server ran at (running-requests gauge samples) and
    the generated-token rate; with --rig, the predicted net tok/s of every k and per-batch-size
    table weighted by that concurrency, the recommendation, its gain over the running config and
    the snippet to paste. It says when windows want different configurations (docs/watch.md).
    """
    report, fmt = report or old_report, fmt or snippet_format
    if endpoint is None and prometheus is None:
        raise ConfigError("give --endpoint URL (read /metrics live) or --prometheus URL (read a range).")
    if prometheus is None and (selector or since or start or end or step):
        raise ConfigError("--selector, --since, --start, --end and --step go with --prometheus.")
    if prometheus is not None and (since is None) == (start is None):
        raise ConfigError("with --prometheus give the range: --since 6h, or --start (and --end).")
    loaded = load_rig(rig) if rig is not None else None
    raw: dict = {}
    if running_config:
        try:
            raw = json.loads(running_config)
        except ValueError as exc:
            raise ConfigError(f"--running-config is not JSON ({str(exc).split(';')[0]}).") from None
        except RecursionError:
            raise ConfigError("--running-config is nested too deeply to read.") from None
        if not isinstance(raw, dict):
            raise ConfigError("--running-config must be a JSON object, as --speculative-config takes.")
    window_s = seconds_of(window, flag="--window") if window else 3600.0
    clock = ServerClock()
    unchecked: tuple[str, ...] = ()
    adaptive = None  # SGLang's adaptive mode, as the server says
    if endpoint is not None:
        identity = read_server_identity(endpoint, engine)
        clock, adaptive = identity.clock, identity.adaptive
        if loaded is not None:
            unchecked = check_server_against_rig(
                loaded, identity, server_args=shlex.split(server_args) if server_args else None
            )
    out = Console(soft_wrap=True, stderr=json_lines)
    if adaptive is not None:
        out.print(adaptive_line(adaptive), markup=False, highlight=False)

    def settings_for(info: EngineInfo) -> WatchSettings:
        spec = info.validate_spec(raw) if running_config else None
        if loaded is not None:
            check_rig_engine(loaded, info)
        chosen = watch_drafter(loaded, method=drafter, running_config=spec) if loaded is not None else None
        most = max_num_seqs or (max_num_seqs_flag(loaded.identity.server_args or ()) if loaded else None)
        return WatchSettings(
            names=series_names(info), engine=info.name, per_batch_size_tables=info.per_batch_size_tables,
            rig=loaded, drafter=chosen, running_config=spec, window_s=window_s, clock=clock.name,
            max_num_seqs=most, seed=seed,
        )  # fmt: skip

    if prometheus is not None:
        stop = _moment(end, "--end") if end else time.time()
        begin = stop - seconds_of(since, flag="--since") if since else _moment(start, "--start")
        if stop <= begin:
            raise ConfigError("the range ends before it starts: check --start and --end.")
        info, snapshots = read_prometheus_span(
            prometheus, selector, start=begin, end=stop,
            step_s=seconds_of(step, flag="--step") if step else None, engine=engine,
        )  # fmt: skip
        if loaded is not None:
            check_model_labels(loaded, snapshots, info)
        settings = settings_for(info)
        # on the emulator (known from --endpoint) the range runs on its modelled clock from --start on
        snapshots = [clock.anchored_snapshot(begin, snapshot) for snapshot in snapshots]
        intervals = intervals_from_snapshots(snapshots, settings.names)
        result = analyse_windows(intervals, settings, start=begin, end=clock.anchored(begin, stop))
        chosen_format = fmt or snippet_format_for(info.name)
        if json_lines:
            for item in result.windows:
                sys.stdout.write(json.dumps({"kind": "window", **window_json(item, chosen_format)}) + "\n")
            sys.stdout.write(json.dumps({"kind": "span", **watch_json(result, chosen_format)}) + "\n")
        shown = f"Prometheus at {mask_url(prometheus)}"  # its userinfo masked wherever it is shown
        print_watch(out, result, chosen_format, source=f"{shown} {selector or '{}'}", unchecked=unchecked)
        if report is not None:
            files = write_watch_report(result, report, source=shown, fmt=chosen_format)
            _say_files(out, result, files)
        return
    _live(
        endpoint, settings_for, engine=engine, interval_s=seconds_of(interval, flag="--interval"),
        duration_s=seconds_of(duration, flag="--duration") if duration else None, json_lines=json_lines,
        report=report, fmt=fmt, out=out, api_key=api_key_from_env(api_key_env), unchecked=unchecked,
    )  # fmt: skip


def _live(endpoint, settings_for, *, engine, interval_s, duration_s, json_lines, report, fmt, out, api_key, unchecked):
    shown = mask_url(endpoint)  # its userinfo masked wherever it is shown
    state = LiveWatch(settings_for, engine=engine, source=f"{shown}/metrics")
    view = Live(console=out, auto_refresh=False, transient=False) if out.is_terminal and not json_lines else None

    def on_snapshot(event) -> None:
        update = state.add(event)
        chosen_format = fmt or snippet_format_for(state.settings.engine if state.settings else "vllm")
        if json_lines and update.interval is not None:
            sys.stdout.write(json.dumps(interval_json(update.interval, update.report, chosen_format)) + "\n")
            sys.stdout.flush()
        if view is not None and update.report is not None:
            view.update(watch_view(update.report, chosen_format, source=shown), refresh=True)

    try:
        with sigterm_as_interrupt():  # Ctrl-C or SIGTERM, even where SIGINT came in ignored
            if view is not None:
                view.start()
            poll_metrics(endpoint, interval_s=interval_s, wanted=state.wanted, on_snapshot=on_snapshot,
                         duration_s=duration_s, api_key=api_key)  # fmt: skip
    except KeyboardInterrupt:
        pass  # the normal way to stop watching: the summary follows
    finally:
        if view is not None:
            view.stop()
    result = state.report()
    if result is None:
        raise ConfigError("watch stopped before two reads of /metrics: nothing to report.")
    chosen_format = fmt or snippet_format_for(result.engine)
    if json_lines:  # the windows as they closed and the span: what the Prometheus mode ends with too
        sys.stdout.write(json.dumps({"kind": "span", **watch_json(result, chosen_format)}) + "\n")
    print_watch(out, result, chosen_format, source=shown, unchecked=unchecked)
    if report is not None:
        files = write_watch_report(result, report, source=shown, fmt=chosen_format)
        _say_files(out, result, files)


def _say_files(out: Console, result: WatchReport, files: WatchFiles) -> None:
    out.print(f"wrote {files.markdown}, {files.html}, {files.results} and {len(files.figures)} figures")
    if (line := context_from_line(result, files.folder)) is not None:
        out.print(line, highlight=False)
