"""The emulator's ``/metrics``: vLLM's names, types and labels, written by prometheus_client."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from specsweep.engines import vllm

if TYPE_CHECKING:
    from specsweep.emulator.engine import Engine

LABELS = ["engine", "model_name"]  # vLLM prints labels in alphabetical order


class Histogram:
    """Bucket counts, a sum and a count: cheap enough to observe on every emitted chunk."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class EngineCollector:
    """A prometheus_client collector that reads an Engine's counters at scrape time."""

    def __init__(
        self, engine: Engine, model_name: str, kv_usage: Callable[[], float], *, spec_counters: bool = True
    ) -> None:
        self._engine = engine
        self._spec_counters = spec_counters
        self._labels = ["0", model_name]
        self._created = time.time()
        self._kv_usage = kv_usage

    def collect(self) -> Iterator[Metric]:
        engine, labels, created = self._engine, self._labels, self._created
        stats = engine.stats

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value, created=created)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge(vllm.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", engine.num_running)
        yield gauge(vllm.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", engine.num_waiting)
        yield gauge(vllm.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", self._kv_usage())
        yield counter(vllm.PROMPT_TOKENS, "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter(vllm.GENERATION_TOKENS, "Number of generation tokens processed.", stats.generation_tokens)
        finished = CounterMetricFamily(
            vllm.REQUEST_SUCCESS, "Count of successfully processed requests.", labels=[*LABELS, "finished_reason"]
        )
        for reason in ("abort", "length", "stop"):
            finished.add_metric([*labels, reason], stats.requests_finished.get(reason, 0), created=created)
        yield finished
        if self._spec_counters and engine.spec is not None and engine.spec.num_speculative_tokens:
            yield counter(vllm.SPEC_NUM_DRAFTS, "Number of spec decoding drafts.", stats.num_drafts)
            yield counter(vllm.SPEC_NUM_DRAFT_TOKENS, "Number of draft tokens.", stats.num_draft_tokens)
            yield counter(vllm.SPEC_NUM_ACCEPTED, "Number of accepted tokens.", stats.num_accepted_tokens)
            per_pos = CounterMetricFamily(
                vllm.SPEC_ACCEPTED_PER_POS,
                "Accepted tokens per draft position.",
                labels=[*LABELS, "position"],
            )
            for position, value in enumerate(stats.accepted_per_pos):
                per_pos.add_metric([*labels, str(position)], value, created=created)
            yield per_pos
        # The emulator's own truth: drafts per content class (the mix it actually served).
        by_class = CounterMetricFamily(
            "specsweep_emulator_drafts", "Drafts per content class.", labels=[*LABELS, "content_class"]
        )
        for name, count in sorted(stats.drafts_by_class.items()):
            by_class.add_metric([*labels, name], count, created=created)
        yield by_class
        # The emulator's own health: wall seconds its schedule asked for and took while busy.
        yield counter(
            "specsweep_emulator_scheduled_seconds", "Wall seconds the step schedule asked for.", stats.scheduled_s
        )
        yield counter("specsweep_emulator_elapsed_seconds", "Wall seconds the scheduled steps took.", stats.elapsed_s)
        for name, doc, histogram in (
            (vllm.TTFT_SECONDS, "Histogram of time to first token in seconds.", stats.ttft_s),
            (vllm.ITL_SECONDS, "Histogram of inter-token latency in seconds.", stats.itl_s),
            (vllm.E2E_SECONDS, "Histogram of e2e request latency in seconds.", stats.e2e_s),
        ):
            family = HistogramMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, histogram.cumulative_buckets(), histogram.total)
            yield family


def render_metrics(collector: EngineCollector) -> bytes:
    """Prometheus text exposition of the engine's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
