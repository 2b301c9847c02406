"""What a start is expected to buy (analysis/value.py), against closed forms and its own definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.rates import RateSample
from specsweep.analysis.value import CellBelief, cell_loss, could_be_faster, start_values, within_tolerance

DRAFTER = Drafter(method="dspark", draft_sample_method="probabilistic")
A, B, C = (Candidate(drafter=DRAFTER, num_speculative_tokens=k) for k in (1, 2, 3))
DRAWS = 4000


def sample(columns: dict[Candidate, np.ndarray]) -> RateSample:
    draws = np.column_stack(list(columns.values()))
    return RateSample(
        concurrency=1,
        candidates=tuple(columns),
        tokens_per_step=np.ones(len(columns)),
        step_time_s=np.ones(len(columns)),
        step_time_source=("line",) * len(columns),
        tokens_per_s=draws.mean(axis=0),
        draws=draws,
    )


def cell(columns, measured, *, noise=1e-6, workload="prose", weight=1.0) -> CellBelief:
    return CellBelief(
        workload=workload, concurrency=1, weight=weight, sample=sample(columns), measured=frozenset(measured),
        noise=noise,
    )  # fmt: skip


def normal(mean: float, sd: float, seed: int = 0) -> np.ndarray:
    return mean + sd * stats.norm.ppf((np.arange(DRAWS) + 0.5) / DRAWS)[np.random.default_rng(seed).permutation(DRAWS)]


def test_an_exact_start_of_an_untried_configuration_buys_its_expected_excess_over_the_pick() -> None:
    """A measured at 100 exactly, B untried ~ N(101, 4^2), a start measures B exactly: after it the
    pick is the better of the two, so the start buys today's expected loss, E[((1 - tol) B - 100)+]."""
    tolerance = 0.01
    belief = cell({A: np.full(DRAWS, 100.0), B: normal(101.0, 4.0)}, {A})
    mean, sd, a = (1 - tolerance) * 101.0, (1 - tolerance) * 4.0, 100.0
    d = (mean - a) / sd
    closed = (mean - a) * stats.norm.cdf(d) + sd * stats.norm.pdf(d)
    assert cell_loss(belief, tolerance).loss_tokens_per_s == pytest.approx(closed, rel=0.02)
    (value,) = start_values([belief], [B], tolerance=tolerance)
    assert value.tokens_per_s == pytest.approx(closed, rel=0.05)
    assert value.share == pytest.approx(value.tokens_per_s / np.maximum(100.0, normal(101.0, 4.0)).mean(), rel=1e-6)
    assert value.by_cell == (("prose", 1, value.tokens_per_s, value.share),)


def test_a_noisier_start_buys_less() -> None:
    columns = {A: np.full(DRAWS, 100.0), B: normal(101.0, 4.0)}
    values = [
        start_values([cell(columns, {A}, noise=n)], [B], tolerance=0.01)[0].tokens_per_s for n in (0.0, 0.03, 0.1)
    ]
    assert values[0] > values[1] > values[2] > 0


def test_a_configuration_that_cannot_matter_buys_nothing() -> None:
    """C is 20% behind whatever happens, and unrelated to the others: measuring it changes no pick."""
    columns = {A: np.full(DRAWS, 100.0), B: normal(101.0, 4.0), C: normal(80.0, 2.0, seed=1)}
    (value,) = start_values([cell(columns, {A}, noise=0.02)], [C], tolerance=0.01)
    assert value.tokens_per_s == pytest.approx(0.0, abs=0.01)


def test_leaders_within_the_tolerance_are_not_worth_separating() -> None:
    """A and B measured, at most 0.5% apart either way in every draw: at a 1% tolerance either is
    fine, a repeat of either buys nothing, and the cell names the other as within the tolerance of
    the pick; at 0.1% a precise repeat is worth something."""
    base = normal(100.0, 1.0)
    columns = {A: base, B: base * (1.001 + 0.004 * normal(0.0, 1.0, seed=2).clip(-1, 1))}
    belief = cell(columns, {A, B}, noise=0.001)
    assert cell_loss(belief, 0.01).loss_tokens_per_s == 0.0
    assert all(v.tokens_per_s == 0.0 for v in start_values([belief], [A, B], tolerance=0.01))
    pick = cell_loss(belief, 0.01).pick
    assert pick == B  # a tie in loss goes to the faster on average
    assert within_tolerance(belief, B, 0.01) == (A,)
    assert within_tolerance(belief, B, 0.002) == ()
    assert max(v.tokens_per_s for v in start_values([belief], [A, B], tolerance=0.001)) > 0


def test_a_rival_that_could_be_faster_carries_its_upper_end_and_its_chance() -> None:
    """A picked at 100 exactly; B ~ N(101, 4): its ratio to A is B / 100, so its 95% upper end is
    1.01 + 1.96 x 0.04 and the chance it is more than 1% faster is P(B > 101) = 1/2. C ~ N(80, 2)
    cannot be; C ~ N(99, 2) instead can, with P(C > 101) = 1 - Phi(1), and not 5% faster."""
    columns = {A: np.full(DRAWS, 100.0), B: normal(101.0, 4.0), C: normal(80.0, 2.0, seed=1)}
    (rival,) = could_be_faster(cell(columns, {A}), A, 0.01)
    assert rival.candidate == B
    assert rival.most == pytest.approx(0.01 + stats.norm.ppf(0.975) * 0.04, abs=0.002)
    assert rival.chance == pytest.approx(0.5, abs=0.01)
    near = {A: np.full(DRAWS, 100.0), C: normal(99.0, 2.0, seed=1)}
    (rival,) = could_be_faster(cell(near, {A}), A, 0.01)
    assert rival.chance == pytest.approx(1 - stats.norm.cdf(1.0), abs=0.01)
    assert could_be_faster(cell(near, {A}), A, 0.05) == ()


def test_one_start_that_settles_two_cells_is_worth_both() -> None:
    """B may lead in both workloads' cells; C only in one: B's value sums its cells, and is the larger."""
    prose = cell({A: np.full(DRAWS, 100.0), B: normal(101.0, 4.0), C: normal(101.0, 4.0, seed=3)}, {A})
    technical = cell(
        {A: np.full(DRAWS, 50.0), B: normal(50.5, 2.0, seed=4), C: normal(40.0, 1.0, seed=5)}, {A}, workload="technical"
    )
    values = {v.candidate: v for v in start_values([prose, technical], [B, C], tolerance=0.01)}
    alone = {v.candidate: v for v in start_values([prose], [B, C], tolerance=0.01)}
    assert values[B].tokens_per_s == pytest.approx(sum(v for _, _, v, _ in values[B].by_cell))
    assert values[B].share == pytest.approx(sum(share for _, _, _, share in values[B].by_cell))
    assert {w for w, _, _, _ in values[B].by_cell} == {"prose", "technical"}
    assert values[B].tokens_per_s > alone[B].tokens_per_s
    assert values[B].tokens_per_s > values[C].tokens_per_s
