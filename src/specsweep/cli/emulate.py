"""``specsweep emulate``: a vLLM-compatible server with speculative decoding and known truth."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import typer

from specsweep.cli.options import check_finite, check_levels
from specsweep.config import parse_concurrency
from specsweep.emulator.boot import EmulatorSettings, run_emulator
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import DEFAULT_PROFILE, bundled_profile_names, load_profile
from specsweep.emulator.traffic import check_schedule, load_schedule, mix_per_position, window_tokens_per_s
from specsweep.engines.vllm import parse_speculative_config
from specsweep.errors import ConfigError


def check_contexts(value: str | None) -> str | None:
    """A ``--context`` value such as ``1024,16384``: prompt lengths in tokens, whole numbers >= 1, no repeats."""
    if value is not None:
        try:
            parse_concurrency(value, flag="--context")
        except ConfigError as exc:
            raise typer.BadParameter(str(exc).replace("e.g. 1,4", "e.g. 1024,16384")) from None
    return value


# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = (
    "specsweep emulate --port 8000 --speculative-config '{\"num_speculative_tokens\":5}'",
    "specsweep emulate --print-truth --speculative-config '{\"num_speculative_tokens\":5}' --concurrency 1",
)


def emulate(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    speculative_config: str = typer.Option(
        None, "--speculative-config", help="vLLM's speculative config JSON; without it, no speculation."
    ),
    speculative_config_sc: str = typer.Option(None, "-sc", hidden=True, help="vLLM's short spelling of the same."),
    served_model_name: str = typer.Option(None, help="Model name clients must send (default: the profile's model)."),
    profile: str = typer.Option(DEFAULT_PROFILE, help="Bundled profile name or path to a profile TOML file."),
    time_scale: float = typer.Option(
        1.0, callback=check_finite, min=0.001, help="Run this many times faster than the modelled hardware."
    ),
    seed: int = typer.Option(0, help="Seed of the stochastic model."),
    max_num_seqs: int = typer.Option(None, min=1, help="Most sequences per engine step (default: the profile's)."),
    disable_log_stats: bool = typer.Option(
        False, "--disable-log-stats", help="As vLLM: no engine metrics on /metrics, no stats lines."
    ),
    print_truth: bool = typer.Option(
        False, "--print-truth", help="Print the model's ground truth as JSON and exit; no server."
    ),
    concurrency: str = typer.Option(
        "1,4", callback=check_levels, help="With --print-truth: concurrency levels, e.g. 1,4,16."
    ),
    temperature: float = typer.Option(
        None,
        callback=check_finite,
        min=0.0,
        max=2.0,
        help="With --print-truth: sampling temperature (default: the profile's reference).",
    ),
    max_tokens: int = typer.Option(600, min=1, help="With --print-truth: max_tokens of each request."),
    prompt_tokens: int = typer.Option(
        None, min=1, help="With --print-truth: prompt tokens per request (default: the bundled workload's mean)."
    ),
    context: str = typer.Option(
        None,
        callback=check_contexts,
        help="With --print-truth: the truth at each of these prompt lengths in tokens, e.g. 1024,16384 "
        "(a JSON object keyed by each).",
    ),
    trace: Path = typer.Option(None, help="Append each stream's chunk write times (JSON lines) to this file."),
    list_profiles: bool = typer.Option(False, "--list-profiles", help="List the bundled profiles and exit."),
    fail_boot_above_k: int = typer.Option(None, min=0, help="Fault: out of memory at boot when k exceeds this."),
    hang_at_boot: bool = typer.Option(False, "--hang-at-boot", help="Fault: never become ready."),
    crash_after_requests: int = typer.Option(None, min=0, help="Fault: the engine dies serving request N+1."),
    drop_stream_every: int = typer.Option(None, min=1, help="Fault: cut every Nth stream mid-response."),
    malformed_sse_every: int = typer.Option(
        None, min=1, help="Fault: every Nth stream carries one event cut in the middle of its JSON."
    ),
    omit_usage: bool = typer.Option(False, "--omit-usage", help="Fault: never send usage, whatever is asked."),
    http_500_every: int = typer.Option(None, min=1, help="Fault: every Nth request answers HTTP 500."),
    metrics_404: bool = typer.Option(False, "--metrics-404", help="Fault: /metrics answers 404."),
    metrics_without_spec: bool = typer.Option(
        False, "--metrics-without-spec", help="Fault: /metrics lacks the spec-decode counters."
    ),
    startup_seconds: float = typer.Option(
        None, callback=check_finite, min=0.0, help="Fault/slow start: modelled startup time in seconds."
    ),
    start_variation: float = typer.Option(
        None,
        callback=check_finite,
        min=0.0,
        help="Run-to-run variation: relative sd of a step-time factor drawn once per start (e.g. 0.1).",
    ),
    drift: float = typer.Option(
        None,
        callback=check_finite,
        min=0.0,
        help="Run-to-run variation: relative amplitude of a slow drift of the step time (e.g. 0.05).",
    ),
    traffic: str = typer.Option(
        None,
        help="Serve this traffic schedule itself (a bundled name such as day-night, or a TOML file): "
        "closed-loop streams whose number and content mix change per window "
        "(docs/watch.md#the-emulators-traffic-and-the-truth). "
        "With --print-truth: each window's truth.",
    ),
    api_key: str = typer.Option(
        None, help="As vLLM: /v1 endpoints want 'Authorization: Bearer KEY' (default: VLLM_API_KEY, when set)."
    ),
    start_index: int = typer.Option(
        0, min=0, help="Which start of a seeded study this is: draws this start's variation (studies pass the trial)."
    ),
) -> None:
    """Serve a vLLM-compatible emulator of a speculative-decoding server (or print its truth).

    Endpoints as vLLM: /v1/chat/completions, /v1/completions (streaming or not), /v1/models,
    /health, /version, /metrics. Validates --speculative-config as vLLM does and exits non-zero
    with the reason in its log when it is wrong. Profiles model a rig: see docs/emulator.md.
    """
    speculative_config = speculative_config or speculative_config_sc
    if list_profiles:
        for name in bundled_profile_names():
            loaded = load_profile(name)
            typer.echo(f"{name:28s} {loaded.description}")
        return
    rig = load_profile(Path(profile) if profile.endswith(".toml") else profile)
    rig = rig.with_faults(
        boot_fail_above_k=fail_boot_above_k,
        hang_at_boot=hang_at_boot,
        crash_after_requests=crash_after_requests,
        drop_stream_every=drop_stream_every,
        malformed_sse_every=malformed_sse_every,
        omit_usage=omit_usage,
        http_500_every=http_500_every,
        metrics_404=metrics_404,
        metrics_without_spec=metrics_without_spec,
        startup_s=startup_seconds,
    )
    rig = rig.with_variation(start_variation=start_variation, drift=drift)
    if max_num_seqs is not None:
        rig = replace(rig, max_num_seqs=max_num_seqs)
    spec = None
    if speculative_config:
        try:
            spec = parse_speculative_config(
                speculative_config, target_tensor_parallel_size=rig.tensor_parallel_size, version=rig.version
            )
        except ConfigError as exc:
            if print_truth:
                raise
            # vLLM fails at startup with the reason in its log: do the same.
            typer.echo(f"ERROR specsweep-emulator: Invalid speculative config: {exc}")
            raise typer.Exit(1) from None
    schedule = load_schedule(traffic) if traffic else None
    if schedule is not None:
        check_schedule(schedule, rig)
    if print_truth and schedule is not None:
        temp = schedule.temperature if schedule.temperature is not None else rig.reference_temperature
        rows = [
            {
                "window": w.name, "duration_s": w.duration_s, "streams": w.streams, "mix": w.mix,
                "per_position": mix_per_position(rig, spec, temp, w.mix),
                "output_tokens_per_s": window_tokens_per_s(rig, schedule, w, spec),
            }
            for w in schedule.window
        ]  # fmt: skip
        json.dump({"schedule": schedule.name, "temperature": temp, "windows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if context is not None and (not print_truth or schedule is not None or prompt_tokens is not None):
        raise ConfigError(
            "--context goes with --print-truth alone (not with --traffic or --prompt-tokens): "
            "a served request's context is its own prompt."
        )
    if print_truth:
        levels = parse_concurrency(concurrency)
        temp = rig.reference_temperature if temperature is None else temperature
        if context is None:
            prompts = {name: prompt_tokens or workload_prompt_tokens(name) for name in rig.classes}
            truth = compute_truth(rig, spec, temp, levels, max_tokens=max_tokens, prompt_tokens=prompts)
            json.dump({name: asdict(value) for name, value in truth.items()}, sys.stdout, indent=2)
        else:
            by_context = {}
            for tokens in parse_concurrency(context, flag="--context"):
                if tokens + max_tokens > rig.max_model_len:
                    raise ConfigError(
                        f"--context {tokens} with --max-tokens {max_tokens} passes the profile's "
                        f"max_model_len ({rig.max_model_len}); the server would refuse such a request."
                    )
                truth = compute_truth(
                    rig, spec, temp, levels, max_tokens=max_tokens, prompt_tokens=dict.fromkeys(rig.classes, tokens)
                )
                by_context[str(tokens)] = {name: asdict(value) for name, value in truth.items()}
            json.dump(by_context, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    settings = EmulatorSettings(
        host=host,
        port=port,
        profile=rig,
        spec=spec,
        spec_json=speculative_config,
        served_model_name=served_model_name,
        time_scale=time_scale,
        seed=seed,
        start_index=start_index,
        log_stats=not disable_log_stats,
        trace_path=str(trace) if trace else None,
        traffic=schedule,
        api_key=api_key,
    )
    raise typer.Exit(run_emulator(settings))
