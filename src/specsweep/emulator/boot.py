"""Running the emulator as a server process: startup, vLLM-style logs, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from aiohttp import web

from specsweep.emulator.engine import Engine, EngineStats
from specsweep.emulator.profile import Profile
from specsweep.emulator.self_load import SelfLoad
from specsweep.emulator.server import EmulatorApi
from specsweep.emulator.traffic import TrafficSchedule, check_schedule
from specsweep.errors import ConfigError
from specsweep.types import SpeculativeConfig

log = logging.getLogger("specsweep.emulator")

STATS_INTERVAL_S = 10.0  # modelled seconds between periodic stats lines, as vLLM


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorSettings:
    """Everything ``specsweep emulate`` was asked for."""

    host: str = "127.0.0.1"
    port: int = 8000
    profile: Profile
    spec: SpeculativeConfig | None
    spec_json: str | None
    served_model_name: str | None = None
    time_scale: float = 1.0
    seed: int = 0
    start_index: int = 0  # which start of a seeded study this is (draws its run-to-run variation)
    log_stats: bool = True
    trace_path: str | None = None  # JSON lines: each stream's first and last chunk write times
    traffic: TrafficSchedule | None = None  # serve this schedule's traffic itself (emulator/self_load.py)
    api_key: str | None = field(default=None, repr=False)  # as vLLM's --api-key (else VLLM_API_KEY)


def configure_logging() -> None:
    """vLLM's log line shape: LEVEL MM-DD HH:MM:SS [file:line] message."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
    )
    root = logging.getLogger("specsweep.emulator")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def check_settings(settings: EmulatorSettings) -> None:
    """Refuse what vLLM would refuse for this rig before the (slow) startup."""
    spec, profile = settings.spec, settings.profile
    if settings.traffic is not None:
        check_schedule(settings.traffic, profile)
    if spec is None:
        return
    method = spec.method or profile.methods[0]
    if method not in profile.methods:
        raise ConfigError(
            f"speculative_config.method {method!r} is not available for {profile.served_model_name} "
            f"in profile {profile.name!r}; it has: " + ", ".join(profile.methods) + "."
        )


def run_emulator(settings: EmulatorSettings) -> int:
    """Run until SIGINT/SIGTERM; return the process exit code."""
    configure_logging()
    try:
        check_settings(settings)
    except ConfigError as exc:
        log.error("ValueError: %s", exc)
        return 1
    try:
        return asyncio.run(_serve(settings))
    except KeyboardInterrupt:
        return 0


async def _serve(settings: EmulatorSettings) -> int:
    profile, spec = settings.profile, settings.spec
    scale = settings.time_scale
    name = settings.served_model_name or profile.served_model_name
    k = spec.num_speculative_tokens if spec and spec.num_speculative_tokens else 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    log.info("vLLM API server version %s (specsweep emulator, profile %s)", profile.version, profile.name)
    log.info(
        "non-default args: {'model': %r, 'served_model_name': %r, 'max_num_seqs': %d, "
        "'tensor_parallel_size': %d, 'speculative_config': %s}",
        profile.served_model_name,
        name,
        profile.max_num_seqs,
        profile.tensor_parallel_size,
        settings.spec_json,
    )
    startup_s = profile.boot_s
    log.info(
        "Loading weights for %s (modelled startup %.1f s at time scale %g).",
        profile.served_model_name,
        startup_s,
        scale,
    )
    if profile.faults.hang_at_boot:
        log.info("Loading safetensors checkpoint shards: 0%% Completed | 0/64")
        await stop.wait()  # a hang: never ready, never exits on its own
        return 0
    if await _wait(stop, startup_s / 2 / scale):
        return 0
    limit = profile.faults.boot_fail_above_k
    if limit is not None and k > limit:
        log.error(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.31 GiB. GPU 0 has a total "
            "capacity of 119.70 GiB of which 1.02 GiB is free. (num_speculative_tokens=%d needs more "
            "memory than this rig has; the largest that fits is %d)",
            k,
            limit,
        )
        log.error("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        return 1
    for rank, suggestion in enumerate(profile.rank_memory_suggestions):
        log.info(
            "(Worker_TP%d pid=%d) The current --gpu-memory-utilization=%.4f is equivalent to "
            "--gpu-memory-utilization=%.4f without CUDA graph memory profiling. To maintain the same "
            "effective KV cache size, set --gpu-memory-utilization=%.4f.",
            rank,
            os.getpid(),
            profile.gpu_memory_utilization,
            suggestion,
            suggestion,
        )
    if profile.fp8_default_kernel_warning:
        log.warning(
            "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! Config file not "
            "found at /opt/vllm/model_executor/layers/quantization/utils/configs/"
            "N=4096,K=12288,device_name=NVIDIA_GB10,dtype=fp8_w8a8,block_shape=[128,128].json"
        )
    kv_tokens = profile.kv_cache_tokens(k)
    log.info(
        "GPU KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
        f"{kv_tokens:,}",
        f"{profile.max_model_len:,}",
        kv_tokens / profile.max_model_len,
    )
    if await _wait(stop, startup_s / 2 / scale):
        return 0

    engine = Engine(profile, spec, time_scale=scale, seed=settings.seed, start_index=settings.start_index)
    try:
        trace = open(settings.trace_path, "a", buffering=1, encoding="utf-8") if settings.trace_path else None  # noqa: SIM115
    except OSError as exc:
        log.error("OSError: cannot open the trace file %s: %s", settings.trace_path, exc.strerror or exc)
        return 1
    api = EmulatorApi(engine, profile, name, log_stats=settings.log_stats, trace=trace, api_key=settings.api_key)
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        log.error("OSError: [Errno %s] could not bind %s:%d: %s", exc.errno, settings.host, settings.port, exc.strerror)
        await runner.cleanup()
        if trace is not None:
            trace.close()
        return 1
    engine_task = asyncio.create_task(engine.run())
    stats_task = asyncio.create_task(_log_stats(engine, api, scale)) if settings.log_stats else None
    traffic_task = None
    if settings.traffic is not None:
        schedule = settings.traffic
        temperature = profile.reference_temperature if schedule.temperature is None else schedule.temperature
        api.traffic = SelfLoad(engine, schedule, time_scale=scale, seed=settings.seed, temperature=temperature)
        traffic_task = asyncio.create_task(api.traffic.run())
        log.info(
            "Serving traffic schedule %r itself: %d windows over %.0f modelled seconds%s.",
            schedule.name, len(schedule.window), schedule.period_s, ", repeated" if schedule.repeat else "",
        )  # fmt: skip
    log.info("Starting vLLM API server 0 on http://%s:%d", settings.host, settings.port)
    log.info("Started server process [%d]", os.getpid())
    log.info("Waiting for application startup.")
    log.info("Application startup complete.")
    await stop.wait()
    log.info("Shutting down")
    for task in (traffic_task, engine_task, stats_task):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await runner.cleanup()
    if trace is not None:
        trace.close()
    log.info("Finished server process [%d]", os.getpid())
    return 0


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep, but return True at once if a stop signal came."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    return True


async def _log_stats(engine: Engine, api: EmulatorApi, scale: float) -> None:
    """vLLM's periodic throughput and SpecDecoding lines (skipped while idle)."""
    interval = STATS_INTERVAL_S / scale
    last = _snapshot(engine.stats)
    loop = asyncio.get_running_loop()
    last_time = loop.time()
    while True:
        await asyncio.sleep(interval)
        now = loop.time()
        current = _snapshot(engine.stats)
        elapsed = max(now - last_time, 1e-9)
        prompt = current[0] - last[0]
        generated = current[1] - last[1]
        if prompt or generated or engine.num_running or engine.num_waiting:
            log.info(
                "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: 0.0%%",
                prompt / elapsed,
                generated / elapsed,
                engine.num_running,
                engine.num_waiting,
                100 * api.kv_usage(),
            )
            drafts = current[2] - last[2]
            if drafts:
                drafted = current[3] - last[3]
                accepted = current[4] - last[4]
                per_pos = [(a - b) / drafts for a, b in zip(current[5], last[5], strict=True)]
                log.info(
                    "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
                    "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
                    "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
                    1 + accepted / drafts,
                    accepted / elapsed,
                    drafted / elapsed,
                    accepted,
                    drafted,
                    ", ".join(f"{rate:.3f}" for rate in per_pos),
                    100 * accepted / drafted if drafted else 0.0,
                )
        last, last_time = current, now


def _snapshot(stats: EngineStats) -> tuple[int, int, int, int, int, tuple[int, ...]]:
    return (
        stats.prompt_tokens,
        stats.generation_tokens,
        stats.num_drafts,
        stats.num_draft_tokens,
        stats.num_accepted_tokens,
        tuple(stats.accepted_per_pos),
    )
