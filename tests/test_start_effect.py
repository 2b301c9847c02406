"""A start's prefill lag as a covariate of its start effect (analysis/start_effect.py), checked
against the known truth of synthetic studies: the physics each level was drawn from."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from specsweep.analysis.drafters import Drafter
from specsweep.analysis.start_effect import StartPrefill, prefill_lags
from specsweep.analysis.step_fit import fit_step_model, shared_start_sd
from specsweep.analysis.step_model import Cell, StepObservation
from specsweep.analysis.throughput import study_observations
from specsweep.types import BootFacts, Configuration, LevelFigures, MeasuredConfig, SpeculativeConfig

NGRAM = Drafter(method="ngram")
DRAFTS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 4, 8, 4, 8)  # every k once, two of them three times


def truth(k: int) -> float:
    """A lookup drafter's step: off's 30 ms, a drafting step's fixed and per-position cost at the share it drafts."""
    return 0.030 + (0.0 if k == 0 else 0.5 * (0.030 + 0.0015 * k))


def study(seed: int, *, shows: bool, start_sd: float = 0.10) -> list[StepObservation]:
    """One start per entry of DRAFTS, each off its physics by its start's luck u. Its prefill runs
    at 500 tokens/s times exp(-u) where the prefill ``shows`` the luck, else at a pace of its own;
    either way with 2% of its own error."""
    rng = np.random.default_rng(seed)
    out = []
    for start, k in enumerate(DRAFTS):
        u = rng.normal(0.0, start_sd)
        pace = -u if shows else rng.normal(0.0, start_sd)
        out.append(StepObservation(
            concurrency=1, num_speculative_tokens=k, drafter=NGRAM if k else None, start=start,
            step_time_s=truth(k) * math.exp(u + rng.normal(0.0, 0.01)), relative_se=0.01,
            drafted_share=0.5 if k else 1.0,
            start_prefill=StartPrefill(tokens_per_s=500.0 * math.exp(pace + rng.normal(0.0, 0.02))),
        ))  # fmt: skip
    return out


def miss(observations: list[StepObservation]) -> tuple[float, float | None, float]:
    """How far the fitted step times of k = 0..8 are from the truth's against each other (the mean
    absolute log miss, less the miss they share: a typical start of a study is its starts' mean
    luck, which moves every configuration alike and no pick), the prefill slope, the start spread."""
    posterior = fit_step_model(observations)
    cells = [Cell(concurrency=1, num_speculative_tokens=k, drafter=NGRAM if k else None) for k in range(9)]
    errors = np.array([math.log(posterior.mean_s(c) / truth(c.num_speculative_tokens)) for c in cells])
    return float(np.mean(np.abs(errors - errors.mean()))), posterior.prefill_slope, posterior.start_sd


def without_prefill(observations: list[StepObservation]) -> list[StepObservation]:
    return [StepObservation(**{**{f: getattr(o, f) for f in o.__slots__}, "start_prefill": None}) for o in observations]


def test_a_prefill_that_shows_a_starts_luck_takes_it_out_of_the_comparison() -> None:
    """Starts 10% apart whose prefill shows their luck (as a real llama-server's did: correlation
    0.91): the slope is read near its truth, 1, the start spread left is about the prefill's own
    2% error, and the step times of k = 0..8 against each other are read at least twice as near their
    truth as without it."""
    found = [(miss(study(seed, shows=True)), miss(without_prefill(study(seed, shows=True)))) for seed in range(6)]
    slopes = [with_[1] for with_, _ in found]
    assert all(s is not None for s in slopes) and 0.7 < float(np.median(slopes)) < 1.3, slopes
    assert float(np.median([with_[2] for with_, _ in found])) < 0.05, found
    read, blind = np.mean([with_[0] for with_, _ in found]), np.mean([without[0] for _, without in found])
    assert read < 0.015 and read < 0.5 * blind, (read, blind)


def test_a_prefill_that_shows_nothing_of_a_starts_luck_costs_the_fit_nothing() -> None:
    """Where a start's prefill runs at a pace of its own (the emulator's: its prefill is not its
    start's luck), the slope is read near 0 and the step times as well as without it."""
    found = [(miss(study(seed, shows=False)), miss(without_prefill(study(seed, shows=False)))) for seed in range(6)]
    slopes = [with_[1] for with_, _ in found]
    assert all(s is not None for s in slopes) and abs(float(np.median(slopes))) < 0.3, slopes
    read, blind = np.mean([with_[0] for with_, _ in found]), np.mean([without[0] for _, without in found])
    assert read < 1.15 * blind + 0.002, (read, blind)


def test_the_workloads_of_a_study_share_one_slope() -> None:
    """Two workloads measured in the same starts: the study reads one slope from both, near the
    truth, with its spread; where no two starts' prefills compare, none."""
    first, second = study(0, shows=True), study(0, shows=True)
    shared = shared_start_sd([first, second])
    assert shared is not None and shared.prefill_slope is not None and shared.prefill_slope_sd is not None
    assert 0.7 < shared.prefill_slope < 1.3 and 0.0 < shared.prefill_slope_sd < 0.3
    blind = shared_start_sd([without_prefill(first), without_prefill(second)])
    assert blind is not None and blind.prefill_slope is None and blind.sd > shared.sd


def test_only_starts_whose_first_tokens_cost_alike_are_compared() -> None:
    """Lags are read within each group of starts alike; a group of one start, or none measured, has no lag."""

    def level(start: int, speed: float | None, alike: str) -> StepObservation:
        prefill = None if speed is None else StartPrefill(tokens_per_s=speed, alike=alike)
        return StepObservation(concurrency=1, num_speculative_tokens=0, drafter=None, step_time_s=0.03, start=start,
                               start_prefill=prefill)  # fmt: skip

    lags = prefill_lags([level(0, 400.0, ""), level(1, 100.0, ""), level(2, 50.0, "k=3 draft"), level(3, None, "")])
    assert lags is not None
    assert lags.tolist() == pytest.approx([-math.log(2.0), math.log(2.0), 0.0, 0.0])
    assert prefill_lags([level(0, 400.0, ""), level(1, 100.0, "k=3 draft")]) is None


def test_a_study_reads_each_starts_prefill_at_one_stream_with_the_starts_alike() -> None:
    """A start's prefill is its one-stream level's, of the workload as it is (a context level's
    requests share a cached prefix); starts whose first token costs what off's does compare with
    each other, any other start with its own configuration's only."""

    def config(trial: int, spec: SpeculativeConfig | None, alike: bool | None) -> MeasuredConfig:
        def rows(prefill: float) -> dict[int, LevelFigures]:
            return {level.concurrency: level for level in (
                dataclasses.replace(one, concurrency=c, prefill_tokens_per_s=prefill + trial + c) for c in (1, 4)
            )}  # fmt: skip

        one = LevelFigures(
            concurrency=1,
            output_tokens_per_s=40.0,
            whole_level_output_tokens_per_s=None,
            decode_tokens_per_s_p50=None,
            ttft_p95_s=None,
            errors=0,
            requests=4,
            mean_acceptance_length=1.5,
        )
        # the context level's own first tokens come from a cached prefix: far faster, and not read
        results = {"prose": rows(300.0), "prose@16k": rows(5000.0)}
        return MeasuredConfig(trial=trial, configuration=Configuration(spec=spec), objective=1.0, feasible=True,
                              results=results, boot=BootFacts(), startup_s=None, first_token_as_off=alike)  # fmt: skip

    lookup = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    draft = SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=3)
    configs = [config(0, None, True), config(1, lookup, True), config(2, draft, False), config(3, draft, None)]
    for name in ("prose", "prose@16k"):
        seen = {(o.start, o.concurrency): o.start_prefill for o in study_observations(configs, name)}
        assert all(p is not None and p.tokens_per_s == 301.0 + start for (start, _), p in seen.items())
        assert {start: p.alike for (start, _), p in seen.items() if p is not None} == {
            0: "",
            1: "",
            2: configs[2].key,
            3: configs[3].key,
        }
