"""The emulator's stochastic model, as pure functions: acceptance, step time, ground truth.

Acceptance. A profile gives S_1..S_n per content class at its reference temperature with
probabilistic drafting. For another temperature T and draft method, every conditional rate p_i
moves on the logit scale:

    logit p_i(T, probabilistic) = logit p_i(ref) - temperature_logit_slope * (T - T_ref)
    logit p_i(T, greedy)        = logit p_i(T, probabilistic) - greedy_logit_penalty * T

so the two methods are identical at T = 0. Positions past the profile's list repeat the last
conditional rate. ``rejection_sample_method: synthetic`` replaces all of this with the forced
rates, as vLLM does. Each verification step draws A (accepted drafts) independently with
P(A >= i) = S_i exactly.

Timing. One engine step decodes every running sequence together and takes
StepTiming's T(k, B) modelled seconds; a step that admits new requests also pays their prefill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.analysis.acceptance import (
    conditional_from_unconditional,
    expected_tokens_per_step,
    unconditional_from_conditional,
)
from specsweep.emulator.profile import Profile
from specsweep.types import SpeculativeConfig

_EPS = 1e-9


def _logit(p: float) -> float:
    p = min(max(p, _EPS), 1.0 - _EPS)
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def acceptance_curve(
    profile: Profile,
    content_class: str,
    spec: SpeculativeConfig | None,
    temperature: float,
    k: int | None = None,
) -> list[float]:
    """S_1..S_k for one content class under a spec config at a sampling temperature."""
    if spec is None or not spec.num_speculative_tokens:
        return []
    k = spec.num_speculative_tokens if k is None else k
    if spec.rejection_sample_method == "synthetic":
        return _synthetic_curve(spec, k)
    base = list(profile.classes[content_class].per_position)
    conditional = conditional_from_unconditional(base)
    while len(conditional) < k:
        conditional.append(conditional[-1])
    shift = -profile.temperature_logit_slope * (temperature - profile.reference_temperature)
    if spec.draft_sample_method == "greedy":
        shift -= profile.greedy_logit_penalty * temperature
    moved = [_sigmoid(_logit(p) + shift) if p > 0 else 0.0 for p in conditional[:k]]
    return unconditional_from_conditional(moved)


def _synthetic_curve(spec: SpeculativeConfig, k: int) -> list[float]:
    if spec.synthetic_acceptance_rates is not None:
        return list(spec.synthetic_acceptance_rates)[:k]
    # A mean acceptance length L (bonus included) as a geometric curve with 1 + sum a^i = L.
    target = (spec.synthetic_acceptance_length or 1.0) - 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            low = mid
        else:
            high = mid
    return [low**i for i in range(1, k + 1)]


def step_time_s(profile: Profile, spec: SpeculativeConfig | None, k: int, batch_size: int) -> float:
    """Modelled seconds of one decode step of ``batch_size`` sequences drafting k tokens each."""
    if batch_size <= 0:
        return 0.0
    t = profile.timing
    seconds = (
        t.base_s
        + t.per_sequence_s * batch_size
        + t.verify_token_s * batch_size * (k + 1)
        + t.draft_position_s * k * (1.0 + t.draft_batch_slope * (batch_size - 1))
    )
    if k > 0 and spec is not None and spec.draft_sample_method == "probabilistic":
        seconds *= t.probabilistic_factor
    return seconds


def prefill_time_s(profile: Profile, prompt_tokens: int) -> float:
    """Modelled seconds to prefill one prompt."""
    return prompt_tokens / profile.timing.prefill_tokens_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelTruth:
    """Steady-state behaviour at one concurrency level (modelled time, TTFT excluded)."""

    concurrency: int
    batch_size: int  # sequences per step: concurrency capped by max_num_seqs
    num_speculative_tokens: int  # k in force at that batch size
    step_time_s: float
    output_tokens_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassTruth:
    """What the model predicts for one content class."""

    per_position: list[float]
    expected_tokens_per_step: float
    levels: list[LevelTruth]


def compute_truth(
    profile: Profile,
    spec: SpeculativeConfig | None,
    temperature: float,
    concurrency_levels: Sequence[int],
) -> dict[str, ClassTruth]:
    """The ground truth the emulator's behaviour converges to, per content class."""
    out: dict[str, ClassTruth] = {}
    for name in profile.classes:
        per_position = acceptance_curve(profile, name, spec, temperature)
        levels = []
        for concurrency in concurrency_levels:
            batch = min(concurrency, profile.max_num_seqs)
            k = spec.k_for_batch_size(batch) if spec is not None else 0
            expected = expected_tokens_per_step(per_position, k)
            step = step_time_s(profile, spec, k, batch)
            levels.append(
                LevelTruth(
                    concurrency=concurrency,
                    batch_size=batch,
                    num_speculative_tokens=k,
                    step_time_s=step,
                    output_tokens_per_s=batch * expected / step,
                )
            )
        out[name] = ClassTruth(
            per_position=per_position,
            expected_tokens_per_step=expected_tokens_per_step(per_position),
            levels=levels,
        )
    return out
