"""The truth a watch test compares with: the emulator's model of a traffic window (emulator/traffic.py)
under every draft length, for the mix it nominally serves or the one it really served."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import httpx

from specsweep.emulator.model import acceptance_curve
from specsweep.emulator.profile import load_profile
from specsweep.emulator.traffic import TrafficSchedule, TrafficWindow, window_tokens_per_s
from specsweep.engines.vllm import validate_speculative_config

PROFILE = "dgx-spark-v4-flash"
RUNNING = {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"}
TEMPERATURE = 0.6


def spec(k: int):
    return validate_speculative_config({**RUNNING, "num_speculative_tokens": k}) if k else None


def true_rates(
    schedule: TrafficSchedule, window: TrafficWindow, mix: Mapping[str, float] | None = None
) -> dict[int, float]:
    """Modelled tok/s of the window under k = 0..8 (``mix``: request shares actually served)."""
    profile = load_profile(PROFILE)
    window = window if mix is None else replace(window, mix=dict(mix))
    return {k: window_tokens_per_s(profile, schedule, window, spec(k)) for k in range(0, 9)}


def request_mix(drafts_by_class: Mapping[str, float]) -> dict[str, float]:
    """Request shares from drafts per class at the running k: a request of class c takes
    (M - 1) / E_c(k) drafting steps, so requests go as drafts times E_c."""
    profile = load_profile(PROFILE)
    weights = {
        name: drafts * (1.0 + sum(acceptance_curve(profile, name, spec(5), TEMPERATURE)))
        for name, drafts in drafts_by_class.items()
        if drafts > 0
    }
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def served_mix_from_prometheus(url: str, start: float, end: float) -> dict[str, float]:
    """The request mix the emulator served in [start, end], from its own drafts-per-class counter
    (specsweep_emulator_drafts_total, an emulator-only truth) as Prometheus stored it."""

    def drafts(at: float) -> dict[str, float]:
        answer = httpx.get(url + "/api/v1/query", params={"query": "specsweep_emulator_drafts_total", "time": at})
        return {r["metric"]["content_class"]: float(r["value"][1]) for r in answer.json()["data"]["result"]}

    before, after = drafts(start), drafts(end)
    return request_mix({name: after[name] - before.get(name, 0.0) for name in after})


FAMILY_Z = 4.0  # two-sided 1 in 16,000 per comparison: some 50 per CI run (two suites) stay near 1 in 300


def assert_acceptance_matches(positions: list[dict], truth: list[float], *, context: object = "") -> None:
    """Measured S_i against the truth: every point within 0.02, and within FAMILY_Z standard errors
    of a binomial at the truth. The effective number of drafts is read from position 1's 95%
    interval (design effect included); the spread is the truth's, since an interval drawn around a
    low measurement is narrower than the one the truth has. The positions of one window miss
    together (a step that accepts at position 5 accepted at 2 too), so the bound is a family's."""
    measured = positions[: len(truth)]
    assert [p["source"] for p in measured] == ["measured"] * len(truth), context
    first = measured[0]
    se_first = (first["high"] - first["low"]) / (2 * 1.96)
    drafts = first["S"] * (1 - first["S"]) / se_first**2
    for p, s in zip(measured, truth, strict=True):
        se = (s * (1 - s) / drafts) ** 0.5
        assert abs(p["S"] - s) <= min(0.02, FAMILY_Z * se), (context, round(drafts), measured, truth)
