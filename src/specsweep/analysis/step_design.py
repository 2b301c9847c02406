"""What a server step processes, as the one step model's features (analysis/step_model.py has
the model): per step the weights read once, each sequence's own work, the verified tokens padded
to a captured width, a knee's hinge, each drafter's draft positions and drafting step (paid by the
steps that draft), the context read; and the log factors: a probabilistic draft sampling's, and a
start's prefill lag (analysis/start_effect.py).

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize

from specsweep.analysis.start_effect import PREFILL_PRIOR_SD
from specsweep.types import CapturedWidths

if TYPE_CHECKING:
    from specsweep.analysis.step_model import Cell

GAMMA_PRIOR_SD = 0.10  # probabilistic over greedy step time: 1.00 to 1.09 on the rigs modelled so far


@dataclass(frozen=True, slots=True)
class Design:
    features: np.ndarray  # (n, p): what each step processes, per unit cost
    # (n, g): 1 where the step drafts probabilistically with that method (and its start's prefill lag)
    sampled: np.ndarray
    prior_sd: np.ndarray | None = None  # each of sampled's factors' prior sd (None: GAMMA_PRIOR_SD each)
    prior_mean: np.ndarray | None = None  # and mean (None: 0 each)


def mu(design: Design, theta: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """The step time each row of the design takes at costs ``theta`` and factors ``gamma``; given
    a row of them per draw, shape (draws, steps)."""
    out: np.ndarray = (theta @ design.features.T) * np.exp(gamma @ design.sampled.T)
    return out


def padded(tokens: int, widths: Sequence[int]) -> int:
    """The width a step of ``tokens`` verified tokens runs at: the smallest captured width that holds them."""
    return next((w for w in sorted(widths) if w >= tokens), tokens)


def design_of(
    cells: Sequence[Cell],
    shares: Sequence[float],
    methods: Sequence[str],
    sampled_methods: Sequence[str],
    widths: CapturedWidths,
    knee: float | None,
    reads_context: bool = False,
    prefill_lags: Sequence[float] | np.ndarray | None = None,
    prefill_prior: tuple[float, float] = (0.0, PREFILL_PRIOR_SD),
) -> Design:
    """Per step: 1 (the weights read), B (each sequence's own work), the tokens verified beyond one
    per sequence with the padding to a captured width (B k times the share of steps that drafted),
    the hinge above the knee, and per method the draft positions run and whether the step drafts,
    each times that share (only drafting steps pay them);
    with ``reads_context``, the context tokens read (B C), and per method those a drafter that
    scans the context reads again (B C where the step drafts, B C k once per draft position). The
    factors: per sampled method, 1 where the step drafts probabilistically; with ``prefill_lags``,
    each step's start's prefill lag."""
    rows, flags = [], []
    for cell, share in zip(cells, shares, strict=True):
        b, k = cell.concurrency, cell.num_speculative_tokens
        width = float(padded(math.ceil(b * (1 + k * share) - 1e-9), widths.at(k)))
        row = [1.0, float(b), width - b, *([max(width - knee, 0.0)] if knee is not None else [])]
        for m in methods:
            on = cell.drafter is not None and cell.drafter.method == m and k > 0
            row += [k * share, share] if on else [0.0, 0.0]
        if reads_context:
            read = float(b * cell.context_tokens)
            row.append(read)
            for m in methods:
                on = cell.drafter is not None and cell.drafter.method == m and k > 0
                row += [read, read * k] if on else [0.0, 0.0]
        rows.append(row)
        flags.append(
            [1.0 if cell.drafter is not None and k > 0 and cell.drafter.method == m
             and cell.drafter.draft_sample_method != "greedy" else 0.0 for m in sampled_methods]
        )  # fmt: skip
    prior_mean, prior_sd = np.zeros(len(sampled_methods)), np.full(len(sampled_methods), GAMMA_PRIOR_SD)
    if prefill_lags is not None:
        flags = [[*f, lag] for f, lag in zip(flags, prefill_lags, strict=True)]
        prior_mean, prior_sd = np.append(prior_mean, prefill_prior[0]), np.append(prior_sd, prefill_prior[1])
    return Design(
        np.array(rows, dtype=float).reshape(len(cells), -1),
        np.array(flags, dtype=float).reshape(len(cells), prior_sd.size),
        prior_sd,
        prior_mean,
    )


def independent_columns(features: np.ndarray) -> np.ndarray:
    """The columns, in order, that are not a combination of those before them."""
    scaled = features / np.maximum(np.abs(features).max(axis=0), 1e-12)
    kept: list[int] = []
    for j in range(scaled.shape[1]):
        trial = scaled[:, [*kept, j]]
        if np.linalg.matrix_rank(trial, tol=1e-8 * max(1.0, float(np.abs(trial).max()))) > len(kept):
            kept.append(j)
    return np.array(kept, dtype=int)


def bounded_lstsq(a: np.ndarray, b: np.ndarray, nonneg: int) -> np.ndarray:
    """Least squares with the first ``nonneg`` coefficients at or above zero. Bounded-variable
    least squares (an active-set method, exact in a few steps for these few coefficients): on the
    README study's problems it returns the trust-region default's solution about nine times faster
    (bench/step_fit_solver.py)."""
    lower = np.concatenate([np.zeros(nonneg), np.full(a.shape[1] - nonneg, -np.inf)])
    return np.asarray(optimize.lsq_linear(a, b, bounds=(lower, np.full(a.shape[1], np.inf)), method="bvls").x)
