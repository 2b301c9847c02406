"""``specsweep watch``: reading a server's metrics (a live poll of /metrics or a Prometheus range)
and handing them to the analysis (watch/windows.py) with the engine's names, the rig and its
drafter. Nothing is sent to the server but metric reads (docs/watch.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from specsweep.analysis.drafters import Drafter, find_drafter
from specsweep.engines.registry import EngineInfo, engine_from_metric_names, engine_info
from specsweep.errors import ConfigError, MetricsError
from specsweep.measurement.series import SeriesNames
from specsweep.rigs.model import Rig
from specsweep.runtime.prometheus import PrometheusReader, default_step_s, label_matchers
from specsweep.types import MetricsSnapshot, SpeculativeConfig


def series_names(engine: EngineInfo) -> SeriesNames:
    """What watch reads from one engine's metrics."""
    return SeriesNames(
        counters=engine.counters,
        finished_requests=engine.finished_requests,
        running=engine.running_gauge,
        waiting=engine.waiting_gauge,
        accept_length=engine.accept_length_gauge,
    )


def detect_engine(names: set[str], given: str | None, *, source: str) -> EngineInfo:
    """The engine named, or the one whose metric names appear; MetricsError when none does."""
    if given is not None:
        return engine_info(given)
    found = engine_from_metric_names(names)
    if found is None:
        raise MetricsError(
            f"{source} has no vLLM, llama.cpp or SGLang metrics (vllm:*, llamacpp:*, sglang:*): start the server with "
            "metrics on (llama-server --metrics, SGLang --enable-metrics; vLLM without --disable-log-stats)."
        )
    return found


def watch_drafter(rig: Rig, *, method: str | None, running_config: SpeculativeConfig | None) -> Drafter:
    """The rig's drafter the server runs: named by --drafter, by --running-config, or the rig's only one."""
    if method is None and running_config is not None:
        method = running_config.method
    sampling = running_config.draft_sample_method if running_config is not None else None
    return find_drafter(rig.drafters, method, draft_sample_method=sampling)


def check_rig_engine(rig: Rig, engine: EngineInfo) -> None:
    """Refuse a rig of another engine than the metrics' (vLLM and the emulator speak alike)."""
    family = {"emulator": "vllm"}
    if family.get(rig.identity.engine, rig.identity.engine) != family.get(engine.name, engine.name):
        raise ConfigError(
            f"the rig was measured on {rig.identity.engine}, the metrics are {engine.name}'s: a rig describes one "
            "setup; measure this one with specsweep study."
        )


def check_model_labels(rig: Rig, snapshots: Sequence[MetricsSnapshot], engine: EngineInfo) -> None:
    """Refuse series whose ``model_name`` label names another model than the rig's (where both say one)."""
    if rig.identity.model is None:
        return
    seen = {
        labels["model_name"]
        for snapshot in (*snapshots[:1], *snapshots[-1:])
        for labels, _ in snapshot.values(engine.counters.generation_tokens)
        if "model_name" in labels
    }
    other = sorted(seen - {rig.identity.model})
    if other:
        raise ConfigError(
            f"the series are for model {', '.join(other)}, the rig for {rig.identity.model}; narrow --selector "
            "to this rig's model, or measure a rig for that one."
        )


def read_prometheus_span(
    url: str, selector: str | None, *, start: float, end: float, step_s: float | None, engine: str | None
) -> tuple[EngineInfo, list[MetricsSnapshot]]:
    """The engine and every series watch reads, from a Prometheus server over [start, end]."""
    matchers = label_matchers(selector)
    with PrometheusReader(url) as prometheus:
        found = prometheus.series_names(matchers, start, end)
        if not found:
            raise ConfigError(
                f"Prometheus at {url} has no vLLM, llama.cpp or SGLang series matching {{{matchers}}} between "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start))} and "
                f"{time.strftime('%H:%M:%S', time.localtime(end))}: check --selector and the range."
            )
        info = detect_engine(found, engine, source=f"Prometheus at {url}")
        wanted = [name for name in series_names(info).wanted() if name in found]
        step = step_s or default_step_s(start, end)
        snapshots = prometheus.read_range(wanted, matchers, start=start, end=end, step_s=step)
    if len(snapshots) < 2:
        raise MetricsError(
            f"Prometheus at {url} holds fewer than two samples of {info.name}'s series in the range: widen it."
        )
    return info, snapshots
