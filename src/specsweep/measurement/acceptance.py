"""Acceptance along the draft: unconditional S_i, conditional p_i, expected tokens per step.

Notation (docs/math.md#notation): A is the number of drafted tokens accepted in one verification step,
S_i = P(A >= i) for i = 1..k, p_i = S_i / S_(i-1) with S_0 = 1, and a step emits A + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def expected_tokens_per_step(per_position: Sequence[float], k: int | None = None) -> float:
    """E(k) = 1 + sum_{i<=k} S_i: exact for chain drafters, with no independence assumption."""
    rates = list(per_position) if k is None else list(per_position)[:k]
    if k is not None and k > len(per_position):
        raise ValueError(f"need S_1..S_{k}, have {len(per_position)} positions")
    return 1.0 + float(sum(rates))


def conditional_from_unconditional(per_position: Sequence[float]) -> list[float]:
    """p_i = S_i / S_(i-1); a position after one that was never reached gets NaN."""
    out: list[float] = []
    previous = 1.0
    for rate in per_position:
        out.append(rate / previous if previous > 0 else float("nan"))
        previous = rate
    return out


def unconditional_from_conditional(conditional: Sequence[float]) -> list[float]:
    """S_i = p_1 * ... * p_i."""
    return [float(x) for x in np.cumprod(np.asarray(conditional, dtype=float))]


def accepted_length_distribution(per_position: Sequence[float]) -> np.ndarray:
    """P(A = j) for j = 0..k from S_1..S_k (S must be non-increasing, within 0..1)."""
    survival = np.concatenate(([1.0], np.asarray(per_position, dtype=float), [0.0]))
    probs = survival[:-1] - survival[1:]
    if np.any(probs < -1e-12):
        raise ValueError("per-position acceptance must be non-increasing")
    clipped: np.ndarray = np.clip(probs, 0.0, 1.0)
    return clipped
