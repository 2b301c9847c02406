"""Reading metric series from a Prometheus server's HTTP API, as snapshots.

``/api/v1/series`` says which engine series a selector matches over a time range;
``/api/v1/query_range`` gives each series' value at every step of the range. One query per
sample name, all on the same step grid, so the answers line up into one MetricsSnapshot per
step (taken_at: the step's unix time), the shape a live poll of /metrics has too.

A step answers with the series' latest sample at or before it (Prometheus' look-back), so a
step shorter than the scrape interval repeats samples (harmless: a counter does not grow
between them, and a gauge sample then stands for its whole interval) and a longer one skips
some (a counter's growth is unchanged; a gauge is sampled more thinly).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx

from specsweep.errors import ConfigError, MetricsError
from specsweep.types import MetricsSnapshot

MAX_POINTS = 10_000  # Prometheus refuses a range query of more than 11,000 points per series
ENGINE_NAMES = r"(vllm|llamacpp|sglang):.+"
_MATCHER = re.compile(r'^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"')


def label_matchers(selector: str | None) -> str:
    """The label matchers of ``{job="vllm", ...}`` without the braces ('' for none); ConfigError when
    the selector names a metric or is not a brace-enclosed matcher list."""
    text = (selector or "").strip()
    if not text or text == "{}":
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise ConfigError(
            f'--selector {text!r} must be label matchers in braces, such as \'{{job="vllm",instance="gpu1:8000"}}\' '
            "(watch adds the metric names itself)."
        )
    inner = text[1:-1].strip().rstrip(",")
    if inner and not _MATCHER.match(inner):
        raise ConfigError(f'--selector {text!r} does not start with a label matcher such as job="vllm".')
    return inner


def default_step_s(start: float, end: float) -> float:
    """One second, or coarser when the range would pass Prometheus' points limit."""
    return float(max(1, math.ceil((end - start) / MAX_POINTS)))


class PrometheusReader:
    """A Prometheus server's HTTP API (``transport`` for tests of protocol edge cases)."""

    def __init__(self, url: str, *, timeout_s: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def _get(self, path: str, params: dict[str, Any], *, what: str) -> Any:
        try:
            response = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise MetricsError(f"could not reach Prometheus at {self.url}: {type(exc).__name__}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise MetricsError(
                f"{self.url}{path} answered HTTP {response.status_code} without Prometheus' JSON: is "
                f"{self.url} a Prometheus server (its HTTP API, not a /metrics endpoint)?"
            )
        if body["status"] != "success":
            message = str(body.get("error") or body.get("errorType") or "no reason given")
            if response.status_code == 400 or body.get("errorType") == "bad_data":
                raise ConfigError(f"Prometheus refused {what}: {message}")
            raise MetricsError(f"Prometheus answered HTTP {response.status_code} to {what}: {message}")
        return body.get("data")

    def series_names(self, matchers: str, start: float, end: float) -> set[str]:
        """The engine sample names (vllm:, llamacpp:, sglang:) that the matchers select in the range."""
        match = f'{{__name__=~"{ENGINE_NAMES}"{"," + matchers if matchers else ""}}}'
        data = self._get(
            "/api/v1/series", {"match[]": match, "start": start, "end": end}, what=f"the selector {{{matchers}}}"
        )
        return {str(row.get("__name__")) for row in data or () if isinstance(row, dict) and row.get("__name__")}

    def read_range(
        self, names: Sequence[str], matchers: str, *, start: float, end: float, step_s: float
    ) -> list[MetricsSnapshot]:
        """Every named series the matchers select, as one snapshot per step of [start, end]."""
        if (end - start) / step_s > MAX_POINTS + 1000:
            raise ConfigError(
                f"a step of {step_s:g} s over {end - start:.0f} s passes Prometheus' 11,000 points per series; "
                "use a longer --step or a shorter range."
            )
        samples: dict[float, dict[str, list[tuple[dict[str, str], float]]]] = defaultdict(lambda: defaultdict(list))
        for name in names:
            query = f'{{__name__="{name}"{"," + matchers if matchers else ""}}}'
            params = {"query": query, "start": start, "end": end, "step": step_s}
            data = self._get("/api/v1/query_range", params, what=f"the query {query}")
            for series in (data or {}).get("result", ()):
                labels = {k: str(v) for k, v in series.get("metric", {}).items() if k != "__name__"}
                for stamp, text in series.get("values", ()):
                    value = float(text)
                    if math.isfinite(value):
                        samples[round(float(stamp), 3)][name].append((labels, value))
        return [
            MetricsSnapshot(taken_at=stamp, samples={n: tuple(v) for n, v in by_name.items()})
            for stamp, by_name in sorted(samples.items())
        ]
