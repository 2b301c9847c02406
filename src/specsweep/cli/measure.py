"""``specsweep measure``: one honest measurement of a running server, no starts."""

from __future__ import annotations

import json
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from specsweep.cli.options import check_duration, check_finite, check_levels, check_url, one_of, seconds_of
from specsweep.cli.printers import fitted_console, print_measurement
from specsweep.cli.rig_printers import print_rig_recommendation
from specsweep.config import parse_concurrency
from specsweep.context_prompts import load_workload_or_level
from specsweep.errors import RequestError
from specsweep.rigs.file import check_server_against_rig, load_rig
from specsweep.rigs.model import check_rig_context
from specsweep.rigs.stored import recommend_for_measurement, rig_drafter
from specsweep.runtime.client import api_key_from_env
from specsweep.runtime.identity import read_server_identity
from specsweep.runtime.measure import (
    LevelStarted,
    MeasureSettings,
    RequestDone,
    WarmingUp,
    run_measure,
    thin_levels,
)
from specsweep.runtime.store import measurement_to_dict, write_json_atomic
from specsweep.workload import parse_context_variant, too_small

MEASUREMENT_FILE = "measurement.json"  # what --out DIR holds


# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = ("specsweep measure --endpoint http://127.0.0.1:8000 --workload prose --concurrency 1,4",)


def measure(
    endpoint: str = typer.Option(..., callback=check_url, help="Base URL of the server, e.g. http://127.0.0.1:8000"),
    workload: str = typer.Option(
        "prose", help="prose, technical, or a JSONL file of your own; W@16k: W at a context level of 16k tokens."
    ),
    engine: str = typer.Option(None, help="vllm, sglang or llama.cpp (default: detected from /metrics)."),
    model: str = typer.Option(None, help="Model name to send (default: the first one /v1/models lists)."),
    concurrency: str = typer.Option(
        None,
        callback=check_levels,
        help="Closed-loop concurrency levels, e.g. 1,4,16 (default 1,4; with --rig, the rig's levels).",
    ),
    requests: int = typer.Option(32, min=1, help="Measured requests per level."),
    warmup: int = typer.Option(None, min=0, help="Warm-up requests per level (default: one per stream)."),
    max_tokens: int = typer.Option(600, min=1, help="max_tokens of every request."),
    temperature: float = typer.Option(
        0.0, callback=check_finite, min=0.0, max=2.0, help="Sampling temperature (use production's)."
    ),
    rate: float = typer.Option(
        None, callback=check_finite, min=0.001, help="Open loop: requests per second instead of levels."
    ),
    api: str = typer.Option(
        "chat",
        callback=one_of(("chat", "completions")),
        help="chat (/v1/chat/completions) or completions (/v1/completions).",
    ),
    api_key_env: str = typer.Option(None, help="Environment variable holding the bearer token."),
    seed: int = typer.Option(0, help="Seed of the prompt order."),
    timeout: str = typer.Option(
        "600s", callback=check_duration, help="How long one request may take: 600s, 10m, or seconds."
    ),
    out_dir: Path = typer.Option(
        None, "--out", help=f"Also write every figure and request to {MEASUREMENT_FILE} in this folder."
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print the measurement as JSON on stdout (the text goes to stderr)."
    ),
    json_path: Path = typer.Option(None, "--json-file", hidden=True, help="Old spelling: write the JSON to this file."),
    rig: Path = typer.Option(
        None, help="A rig file (studies/NAME/rig.json): also recommend k for this workload, with no start."
    ),
    drafter: str = typer.Option(
        None,
        help="With --rig: the running drafter, as the rig names it (e.g. 'dspark (probabilistic)'; "
        "specsweep rig lists them), when the rig has several.",
    ),
    server_args: str = typer.Option(
        None, help="With --rig: the command line the server was started with, to check against the rig's flags."
    ),
) -> None:
    """Measure a running server as the field report did, but exactly and in one command.

    Per level: warm-up, a /metrics snapshot, N streamed requests (exact token counts from
    usage, never chunk counts), a second snapshot. Prints single-stream and concurrent decode
    rates, TTFT, prefill, the server's own throughput beside the client's, and per-position
    draft acceptance from the counter differences. Nothing is started.

    With --rig: the server must be the rig's (engine, version, model; flags too with
    --server-args). The workload's acceptance curve fitted from the counters at the running k and
    the rig's step cost give the recommended k per concurrency level, with its band and the
    expected gain over the running configuration (docs/rigs.md).
    """
    loaded_rig = load_rig(rig) if rig is not None else None
    unchecked: tuple[str, ...] = ()
    context_note = None
    if loaded_rig is not None:
        # a context level the rig cannot answer is refused before the server is asked anything
        level = parse_context_variant(workload)[1] if not Path(workload).is_file() else None
        context_note = check_rig_context(loaded_rig, [level or 0], what=f"workload {workload}")
        identity = read_server_identity(endpoint, engine)  # what the server says it is
        args = shlex.split(server_args) if server_args else None
        unchecked = check_server_against_rig(loaded_rig, identity, server_args=args)
        # Which of the rig's drafters the server runs is settled before any request is sent.
        drafter = rig_drafter(loaded_rig, drafter).label
        if concurrency is None:
            concurrency = ",".join(str(b) for b in loaded_rig.concurrency_levels)
    settings = MeasureSettings(
        endpoint=endpoint,
        model=model,
        engine=engine,
        api=api,
        concurrency=parse_concurrency(concurrency or "1,4"),
        requests=requests,
        warmup=warmup,
        max_tokens=max_tokens,
        temperature=temperature,
        rate_per_s=rate,
        api_key=api_key_from_env(api_key_env),
        seed=seed,
        timeout_s=seconds_of(timeout, flag="--timeout"),
    )
    loaded = load_workload_or_level(workload)
    console = Console(stderr=True)
    thin = None if rate else thin_levels(settings.concurrency, settings.requests)
    for note in (thin, too_small(loaded, settings.requests), *loaded.notes):
        if note:  # with the report on stdout: stderr keeps one line for an error
            fitted_console(stderr=json_output).print(f"[yellow]note:[/yellow] {note}")
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    # Off a terminal the bar is not started at all: rich 13.0 (15.0 no longer) prints a blank line on
    # stopping even a disabled bar, and stderr must keep exactly one line for an error.
    with progress if console.is_terminal else nullcontext():
        tasks: dict[int | None, TaskID] = {}
        tokens: dict[int | None, int] = {}
        spans: dict[int | None, tuple[float, float]] = {}  # first request sent, last answer ended

        def on_event(event: WarmingUp | LevelStarted | RequestDone) -> None:
            level = event.concurrency
            name = f"{level} concurrent" if level else f"{rate}/s open loop"
            if isinstance(event, WarmingUp):
                tasks[level] = progress.add_task(f"{name}: warming up", total=settings.requests, rate="")
                tokens[level] = 0
            elif isinstance(event, LevelStarted):
                progress.update(tasks[level], description=f"{name}: measuring")
            elif isinstance(event, RequestDone):
                # from the requests' own stamps, in the rig's units as the summary gives them
                record = event.record
                tokens[level] += record.completion_tokens or 0
                spans[level] = (
                    min(spans.get(level, (record.started_at, 0.0))[0], record.started_at),
                    max(spans.get(level, (0.0, 0.0))[1], record.started_at + (record.latency_s or 0.0)),
                )
                elapsed = spans[level][1] - spans[level][0]
                live = f"{tokens[level] / elapsed:,.1f} tok/s" if elapsed > 0 else ""
                progress.update(tasks[level], advance=1, rate=live)

        result = run_measure(settings, loaded, on_event=on_event)
    out = fitted_console(stderr=json_output)
    print_measurement(out, result)
    record = measurement_to_dict(result)
    if json_output:
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
    for path in (out_dir / MEASUREMENT_FILE if out_dir is not None else None, json_path):
        if path is not None:
            write_json_atomic(path, record)
            out.print(f"wrote {path}")
    if result.error:  # one line: the cause, the levels left unmeasured, and where the rest is
        kept = " (levels measured before it are shown above)" if result.levels else ""
        raise RequestError(f"measurement stopped: {result.stop_line()}{kept}")
    if loaded_rig is not None:
        on_rig = recommend_for_measurement(loaded_rig, result, drafter=drafter, seed=seed)
        print_rig_recommendation(out, loaded_rig, rig, on_rig, unchecked=unchecked, note=context_note)
