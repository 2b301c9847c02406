"""Scraping ``/metrics`` and reading it with prometheus_client's parser."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specsweep.errors import MetricsError, RequestError
from specsweep.runtime.client import AUTH_REFUSED, auth_refused_message
from specsweep.types import MetricsSnapshot


def parse_metrics_text(text: str, *, taken_at: float = 0.0) -> MetricsSnapshot:
    """Prometheus text exposition -> MetricsSnapshot; MetricsError if it does not parse."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"/metrics is not valid Prometheus text ({exc}).") from None
    return MetricsSnapshot(taken_at=taken_at, samples={k: tuple(v) for k, v in samples.items()})


async def scrape_metrics(http: httpx.AsyncClient, path: str = "/metrics") -> MetricsSnapshot:
    """GET the metrics endpoint and parse it; MetricsError with the reason when that fails."""
    try:
        response = await http.get(path, timeout=30.0)
    except httpx.HTTPError as exc:
        raise MetricsError(f"could not read {path}: {type(exc).__name__}: {exc}") from None
    if response.status_code in AUTH_REFUSED:
        key_sent = "Authorization" in http.headers
        raise RequestError(auth_refused_message(str(response.url), response.status_code, key_sent=key_sent))
    if response.status_code != 200:
        raise MetricsError(
            f"{path} answered HTTP {response.status_code}; start the server with metrics on "
            "(llama-server needs --metrics; vLLM must not have --disable-log-stats)."
        )
    return parse_metrics_text(response.text, taken_at=time.perf_counter())
