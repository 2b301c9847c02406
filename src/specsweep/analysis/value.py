"""What a server start is expected to buy: the reduction of the user's loss it brings, before it is run.

The user's loss in a cell (one workload at one concurrency level) is what the configuration the
study would paste there gives up against the best configuration of the searched space, in tok/s,
where that shortfall exceeds the tolerance (a difference under it is one the user does not care
about):

    L(a) = max(0, (1 - tolerance) R(best) - R(a))

The study can paste only what it measured, so its pick in a cell is the measured configuration
with the least expected loss. What the study knows of every rate is a set of joint draws
(analysis/rates.py: acceptance draws times step-time draws, paired across configurations), so the
expected loss of the pick is a mean over draws.

A start measures one configuration in every cell at once, each rate with the run-to-run noise of
its workload. Its value is the expected loss now minus the expected loss after seeing what it
would measure (a preposterior: the value of the information, plus, for an untried configuration,
that it may then be pasted). Each possible measurement updates the draws by a linear (ensemble
Kalman) step: a draw moves with the measured configuration's deviation, in proportion to how the
two covary across the draws, so a start at k = 2 also tells about k = 1 and k = 3 of the same
step-time line. Cells are summed: one start that settles several cells is worth their sum, in
tok/s and, each cell's part as a share of that cell's best rate, in shares (every operating
point counts alike, the slow single stream as much as the busy batch).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from specsweep.analysis.drafters import Candidate
from specsweep.analysis.rates import RateSample

OBSERVATIONS = 256  # simulated measurements per start and cell (stratified: the values' own noise stays small)


@dataclass(frozen=True, slots=True, kw_only=True)
class CellBelief:
    """What the study knows of one cell: joint draws of every runnable configuration's rate."""

    workload: str
    concurrency: int
    weight: float  # the workload's weight in the objective, relative to the mean weight
    sample: RateSample  # only configurations the study could still run or paste
    measured: frozenset[Candidate]  # what a paste may run here
    noise: float  # relative sd of one server start's measurement of a rate here

    def column(self, candidate: Candidate) -> int | None:
        try:
            return self.sample.candidates.index(candidate)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CellLoss:
    """A cell's pick (the measured configuration with the least expected loss) and that loss."""

    pick: Candidate | None  # None: nothing measured here yet
    loss_tokens_per_s: float  # expected, weighted


@dataclass(frozen=True, slots=True, kw_only=True)
class StartValue:
    """One start's expected loss reduction, summed over the cells, and where it comes from."""

    candidate: Candidate
    tokens_per_s: float  # weighted tok/s, summed over cells
    share: float  # summed over cells, each cell's part over its best rate (weighted)
    by_cell: tuple[tuple[str, int, float, float], ...]  # (workload, concurrency, tok/s, share), largest share first


def losses(draws: np.ndarray, tolerance: float) -> np.ndarray:
    """Per draw and configuration (the last axis), the loss against the draw's best."""
    loss: np.ndarray = np.maximum((1.0 - tolerance) * draws.max(axis=-1, keepdims=True) - draws, 0.0)
    return loss


def pick(draws: np.ndarray, eligible: Sequence[int], tolerance: float) -> tuple[int, float]:
    """The one rule that picks: among the ``eligible`` columns of joint rate draws (the
    configurations a paste may run: measured ones), the one with the least expected loss against
    each draw's best column, less the tolerance; a tie in loss goes to the faster. Returns the
    column and its expected loss. The search's stop, the recommendation and the paste read it."""
    expected = losses(draws, tolerance)[:, list(eligible)].mean(axis=0)
    means = draws[:, list(eligible)].mean(axis=0)
    i = min(range(len(eligible)), key=lambda i: (expected[i], -means[i]))
    return eligible[i], float(expected[i])


def cell_loss(cell: CellBelief, tolerance: float) -> CellLoss:
    """The pick of a cell and its expected loss."""
    columns = [j for j, c in enumerate(cell.sample.candidates) if c in cell.measured]
    if not columns:  # nothing a paste may run yet: all of the best rate is lost
        return CellLoss(pick=None, loss_tokens_per_s=float(cell.sample.draws.max(axis=1).mean()) * cell.weight)
    chosen, loss = pick(cell.sample.draws, columns, tolerance)
    return CellLoss(pick=cell.sample.candidates[chosen], loss_tokens_per_s=loss * cell.weight)


def start_values(
    cells: Sequence[CellBelief], candidates: Collection[Candidate], *, tolerance: float
) -> list[StartValue]:
    """The value of a start of each candidate (see the module doc), highest first."""
    best = [float(c.sample.draws.max(axis=1).mean()) for c in cells]
    out = []
    for candidate in candidates:
        rows = []
        for index, cell in enumerate(cells):
            value = _cell_value(cell, candidate, tolerance, OBSERVATIONS, 7919 * index)
            if value > 0:
                rows.append((cell.workload, cell.concurrency, value * cell.weight, value * cell.weight / best[index]))
        out.append(
            StartValue(
                candidate=candidate,
                tokens_per_s=sum(r[2] for r in rows),
                share=sum(r[3] for r in rows),
                by_cell=tuple(sorted(rows, key=lambda r: -r[3])),
            )
        )
    return sorted(out, key=lambda v: -v.tokens_per_s)


def _cell_value(cell: CellBelief, candidate: Candidate, tolerance: float, observations: int, seed: int) -> float:
    """Expected loss now minus expected loss after one start of ``candidate`` (unweighted tok/s)."""
    x = cell.column(candidate)
    if x is None:
        return 0.0
    draws = cell.sample.draws
    eligible = [j for j, c in enumerate(cell.sample.candidates) if c in cell.measured]
    now = losses(draws, tolerance).mean(axis=0)
    loss_now = float(now[eligible].min()) if eligible else float(draws.max(axis=1).mean())
    after = sorted({*eligible, x})
    rng = np.random.default_rng(seed)
    rate = draws[:, x]
    centred = draws - draws.mean(axis=0)
    spread = rate - rate.mean()
    covariance = centred.T @ spread / max(len(rate) - 1, 1)
    observation_sd = cell.noise * float(rate.mean())
    gain = covariance / (float(spread @ spread) / max(len(rate) - 1, 1) + observation_sd**2)
    # Simulated measurements: a draw taken as the truth, plus one start's noise, both stratified
    # (every draw in turn; the noise at evenly spaced quantiles, shuffled) so candidates compare
    # on the same footing.
    truths = np.arange(observations) % len(rate)
    quantiles = (np.arange(observations) + 0.5) / observations
    measured = rate[truths] + observation_sd * rng.permutation(ndtri(quantiles))
    # Each draw moves by its own predicted measurement's miss (perturbed observations keep the spread).
    predicted = rate + observation_sd * rng.standard_normal(len(rate))
    innovation = measured[:, None] - predicted[None, :]  # (observations, draws)
    updated = draws[None, :, :] + innovation[:, :, None] * gain[None, None, :]
    expected = losses(updated, tolerance).mean(axis=1)  # (observations, configurations)
    loss_after = float(expected[:, after].min(axis=1).mean())
    return max(loss_now - loss_after, 0.0)


def leader_confidence(cells: int, confidence: float = 0.95) -> float:
    """The confidence each cell's comparisons are made at so that the leaders a study names hold the
    true best in all ``cells`` at once with ``confidence`` (Bonferroni over the cells): a study
    names leaders in every cell it reports, and at 95% each, one cell in twenty would name a pick
    alone that is not the best. Four cells: 98.75% each."""
    return 1.0 - (1.0 - confidence) / max(cells, 1)


def within_tolerance(
    cell: CellBelief, pick: Candidate, tolerance: float, confidence: float = 0.95
) -> tuple[Candidate, ...]:
    """Measured rivals of ``pick`` that are neither more than the tolerance faster nor slower: the
    paired ratio's interval lies within 1 +- tolerance (either is fine, whichever runs)."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    bands = [(c, np.percentile(ratio, [tail, 100.0 - tail])) for c, ratio in _ratios(cell, pick) if c in cell.measured]
    return tuple(c for c, (low, high) in bands if low >= 1.0 - tolerance and high <= 1.0 + tolerance)


def _ratios(cell: CellBelief, pick: Candidate) -> list[tuple[Candidate, np.ndarray]]:
    """Every other configuration's rate over ``pick``'s, per joint draw (none where ``pick`` is no column)."""
    j = cell.column(pick)
    if j is None:
        return []
    draws = cell.sample.draws
    return [(c, draws[:, i] / draws[:, j]) for i, c in enumerate(cell.sample.candidates) if c != pick]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rival:
    """A configuration that could be more than the tolerance faster than a cell's pick."""

    candidate: Candidate
    most: float  # the paired ratio's upper end, minus 1: how much faster it could be
    chance: float  # the share of draws where it is more than the tolerance faster


def could_be_faster(cell: CellBelief, pick: Candidate, tolerance: float, confidence: float = 0.95) -> tuple[Rival, ...]:
    """Rivals of ``pick`` whose paired ratio's upper end lies beyond ``1 + tolerance``, with that end
    and the chance they are more than the tolerance faster; the most first."""
    upper = 100.0 - (1.0 - confidence) / 2.0 * 100.0
    out = []
    for c, ratio in _ratios(cell, pick):
        high = float(np.percentile(ratio, upper))
        if high > 1.0 + tolerance:
            out.append(Rival(candidate=c, most=high - 1.0, chance=float(np.mean(ratio > 1.0 + tolerance))))
    return tuple(sorted(out, key=lambda r: -r.most))
