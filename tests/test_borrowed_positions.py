"""A drafter measured at few positions borrows the rest from its other draft sampling, measured
further: the lender's rates moved by one logit shift (analysis/positions.py). The truths here are
curves written down directly; the counts are binomial draws from them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit

from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.analysis.positions import DEPARTURE_PRIOR, lend_positions, per_position_draws, point_per_position

K_MAX = 8


def counts(conditional: np.ndarray, drafts: int, rng: np.random.Generator) -> tuple[float, list[float]]:
    reached, out = drafts, []
    for p in conditional:
        reached = int(rng.binomial(reached, p))
        out.append(float(reached))
    return float(drafts), out


def fitted(conditional: np.ndarray, drafts: int, seed: int) -> AcceptanceFit:
    drafts_n, accepted = counts(conditional, drafts, np.random.default_rng(seed))
    return fit_acceptance(num_drafts=drafts_n, accepted_per_position=accepted, k_max=K_MAX, seed=seed)


# probabilistic drafting's rates fall along the draft, then flatten: no decay family is this shape
PROBABILISTIC = np.array([0.80, 0.74, 0.70, 0.52, 0.50, 0.49, 0.48, 0.48])
SHIFT = -0.45  # greedy's logit below probabilistic's, the same at every position
GREEDY = expit(logit(PROBABILISTIC) + SHIFT)


def test_positions_past_k_follow_the_lender_moved_by_the_shift() -> None:
    """Probabilistic measured at k = 3 only, greedy at k = 8: probabilistic's S_4..S_8 come from
    greedy's measured rates moved back by the shift, near the truth and inside their band, where its
    own curve carried past k = 3 misses the fall at position 4."""
    truth = np.cumprod(PROBABILISTIC)
    own = fitted(PROBABILISTIC[:3], 4000, seed=1)
    lender = fitted(GREEDY, 4000, seed=2)
    lent = lend_positions(own, lender)
    assert lent.borrowed is not None
    assert lent.borrowed.shift == pytest.approx(-SHIFT, abs=0.15)
    point = point_per_position(lent)
    np.testing.assert_allclose(point[:3], np.asarray(own.accepted_per_position) / own.num_drafts)
    assert np.max(np.abs(point[3:] - truth[3:])) < 0.03
    alone = point_per_position(own)
    assert np.max(np.abs(alone[3:] - truth[3:])) > 2 * np.max(np.abs(point[3:] - truth[3:]))
    low = np.array([p.per_position_low for p in lent.prediction])
    high = np.array([p.per_position_high for p in lent.prediction])
    assert np.all((low <= truth) & (truth <= high))
    assert [p.source for p in lent.prediction] == ["measured"] * 3 + ["borrowed"] * 5


def test_a_borrowed_position_is_less_certain_than_the_lenders_own_and_draws_repeat() -> None:
    own = fitted(PROBABILISTIC[:3], 4000, seed=3)
    lender = fitted(GREEDY, 4000, seed=4)
    lent = lend_positions(own, lender)
    spread = np.std(per_position_draws(lent, draws=2000, seed=5), axis=0)
    lender_spread = np.std(per_position_draws(lender, draws=2000, seed=5), axis=0)
    assert np.all(spread[3:] > lender_spread[3:])
    np.testing.assert_allclose(
        per_position_draws(lent, draws=300, seed=6), per_position_draws(lent, draws=300, seed=6), rtol=1e-12
    )


def test_a_shape_the_shift_does_not_hold_widens_the_borrowed_band() -> None:
    """When the two samplings differ by more than one shift at the shared positions, the departure
    is estimated from them, above the prior, and the borrowed band widens with it."""
    lender = fitted(GREEDY, 20000, seed=7)
    same_shape = lend_positions(fitted(PROBABILISTIC[:3], 20000, seed=8), lender)
    bent = PROBABILISTIC[:3] * np.array([1.0, 0.82, 1.15])  # rates the shift cannot follow
    other_shape = lend_positions(fitted(bent, 20000, seed=8), lender)
    assert same_shape.borrowed is not None and other_shape.borrowed is not None
    assert same_shape.borrowed.departure_sd == pytest.approx(DEPARTURE_PRIOR)
    assert other_shape.borrowed.departure_sd > 3 * DEPARTURE_PRIOR

    def width(fit: AcceptanceFit) -> float:
        return fit.prediction[7].per_position_high - fit.prediction[7].per_position_low

    assert width(other_shape) > 1.5 * width(same_shape)


def test_nothing_is_borrowed_from_a_lender_measured_no_further() -> None:
    own = fitted(PROBABILISTIC[:5], 2000, seed=9)
    shorter = fitted(GREEDY[:4], 2000, seed=10)
    assert lend_positions(own, shorter) is own
    assert lend_positions(own, fitted(GREEDY[:5], 2000, seed=11)) is own


def test_a_lender_whose_drafts_were_never_accepted_gives_finite_predictions() -> None:
    """Positions the lender never reached have no rate of their own: no NaN reaches the borrower."""
    own = fit_acceptance(num_drafts=100, accepted_per_position=[30, 10], k_max=6)
    lender = fit_acceptance(num_drafts=100, accepted_per_position=[0, 0, 0, 0], k_max=6)
    lent = lend_positions(own, lender)
    assert lent.borrowed is not None
    assert all(np.isfinite([p.per_position_low, p.per_position, p.per_position_high]).all() for p in lent.prediction)
    assert all(0 <= p.per_position <= 0.1 for p in lent.prediction[2:])  # past the own 10%, never more
