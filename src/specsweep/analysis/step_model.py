"""One model of what a server step costs, fitted over every measured level of every start.

A measured level gives the effective time of one step, t = B E / R (B streams, E tokens per step,
aggregate rate R). Its logarithm is

    log t = log mu(x; theta, gamma) + beta lag_start + u_start + delta_cell + eps

- ``mu`` is what the step processes, each part at a non-negative cost (theta >= 0):
  ``mu = exp(gamma_m [probabilistic]) * (theta_0 + theta_seq B + theta_ver (W - B) + theta_knee (W - h)+
  + sum_m q (theta_pos,m k + theta_fixed,m [k > 0])
  + theta_ctx B C + sum_m (theta_scan,m B C [k > 0] + theta_scan_pos,m B C k))``,
  with W the verified tokens B (1 + k q) padded to the smallest width the engine captured a graph
  for (none given: unpadded), q the share of steps that drafted (1, but for a drafter that looks
  its drafts up: it drafts only where the text matches; its counters say how often), and h the
  knee where a memory-bound step turns compute-bound (chosen by the marginal likelihood among the
  widths measured, or none). Draft costs belong to the drafter's method
  and are paid by the steps that draft (share q; a step that drafts nothing is speculation off's);
  the draft sampling scales a step by one factor gamma_m per method. C is the context level
  each sequence attends over beyond its workload's own prompt (0: the workload as it is): a
  step reads each sequence's KV cache once (theta_ctx), and a drafter that scans the context
  reads it again, once per step or once per draft position. The context parts are in the model
  only where a study measured a context level; one start's levels at every context share its
  start effect, so a context adds levels to one fit, not a fit of its own.
- ``lag_start``: how much slower the level's start prefilled than the typical start alike
  (analysis/start_effect.py; absent where no two starts alike were measured), at a slope beta
  fitted once per study: the part of a start's luck its first tokens show.
- ``u_start ~ N(0, sigma_start^2)``: every level of one server start moves together (the run-to-run
  noise beyond what its prefill lag shows).
- ``delta_cell ~ N(0, tau^2)``: what the physics misses at one (concurrency, drafter, k), shared by
  every start of it. Its size tau is estimated from the data; a measured cell leans on its own
  measurements as far as they outweigh tau, an unmeasured one carries tau whole.
- ``eps ~ N(0, se_i^2)``: the level's own measurement error from its requests' spread (not known:
  the engine's usual noise).

Priors (docs/math.md; each figure beside its constant below): sigma_start and tau
scaled-inverse-chi-square at the engine's figures (``types.NoisePriors``, read by
``step_priors``; the emulator's tau is ``TAU_PRIOR``; at least ``TAU_PRIOR_WIDTHS_UNKNOWN``),
gamma_m normal at 0, beta normal at 0 (``start_effect.PREFILL_PRIOR_SD``; in one workload's fit of
a study, the study's estimate), theta a weak ridge that only pins directions the data leave free. Variance
components maximise the restricted marginal likelihood times their priors; theta and gamma are
then the generalised least squares fit given them, with their covariance from its Hessian (a
Laplace approximation). Draws (``StepPosterior.draws``) are Student-t, since a few starts
estimate sigma_start.

Its fit: analysis/step_fit.py. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specsweep.analysis.drafters import Drafter
from specsweep.analysis.start_effect import StartPrefill
from specsweep.analysis.step_design import Design, design_of, mu
from specsweep.types import CapturedWidths, NoisePriors, RunNoisePrior

TAU_PRIOR = RunNoisePrior(
    relative_sd=0.01, df=2,
    source="what the physics misses on the rigs' own truth: 0.86% rms at most (bench/step_model_misfit.py)",
)  # fmt: skip
# Where a server captured graphs at widths no known rule says, the physics runs its steps unpadded
# and a staircase of padded widths is left to the deviations: the miss a 12% pad at the far draft
# length leaves at the short ones of a line through them.
TAU_PRIOR_WIDTHS_UNKNOWN = RunNoisePrior(
    relative_sd=0.02, df=2, source="a 12% pad at the far draft length misses a line by up to 2% at the short ones"
)
START_PRIOR = RunNoisePrior(relative_sd=0.05, df=2, source="no engine named: a start-to-start spread of 5%")
RIDGE_SD = 100.0  # a ridge only for numerical stability: each part a priori within a hundred whole steps
MIN_LEVEL_SE = 0.002  # a level's own error is never taken as smaller than this
REJECTION_ROUNDS = 32  # rounds of draws of the parts held to theta >= 0 before the rest are clipped


def step_priors(noise: NoisePriors | None, widths: CapturedWidths) -> tuple[RunNoisePrior, RunNoisePrior]:
    """sigma_start's prior and tau's: the engine's (no engine named: ``START_PRIOR``; no deviation
    named: the physics' own miss, ``TAU_PRIOR``), tau's at least ``TAU_PRIOR_WIDTHS_UNKNOWN`` where
    the server captured graphs at widths no known rule gives."""
    tau = (noise.deviation if noise is not None else None) or TAU_PRIOR
    if widths.unknown and TAU_PRIOR_WIDTHS_UNKNOWN.relative_sd > tau.relative_sd:
        tau = TAU_PRIOR_WIDTHS_UNKNOWN
    return (noise.start if noise is not None else START_PRIOR), tau


@dataclass(frozen=True, slots=True, kw_only=True)
class StepObservation:
    """One measured level: its effective step time and what the step processed."""

    concurrency: int
    num_speculative_tokens: int  # 0: speculation off
    drafter: Drafter | None
    step_time_s: float
    start: int  # the server start it was measured in
    relative_se: float | None = None  # the level's own error from its requests (None: unknown)
    drafted_share: float = 1.0  # share of steps that drafted (a lookup drafter's counters say it)
    context_tokens: int = 0  # the context level its sequences attend over (0: the workload's own prompt)
    tokens_per_step: float = 1.0  # E over every step, drafting or not (1: not known, or speculation off)
    start_prefill: StartPrefill | None = None  # how fast its start prefilled (None: not measured)

    @property
    def accepted_per_draft(self) -> float:
        """Tokens a drafting step accepted: E = 1 + q A (0 where nothing drafted)."""
        return (self.tokens_per_step - 1.0) / self.drafted_share if self.drafted_share > 0 else 0.0

    @property
    def cell(self) -> Cell:
        off = self.num_speculative_tokens == 0 or self.drafter is None
        return Cell(concurrency=self.concurrency, drafter=None if off else self.drafter,
                    num_speculative_tokens=0 if off else self.num_speculative_tokens,
                    context_tokens=self.context_tokens)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Cell:
    """A configuration at one concurrency and context level: what a step time is predicted for."""

    concurrency: int
    num_speculative_tokens: int
    drafter: Drafter | None = field(default=None, compare=False)
    context_tokens: int = 0

    @property
    def key(self) -> CellKey:
        d = self.drafter
        return (
            self.concurrency,
            self.num_speculative_tokens,
            d.method if d else "",
            d.draft_sample_method if d else "",
            self.context_tokens,
        )


CellKey = tuple[int, int, str, str, int]  # concurrency, k, method, draft sampling, context level


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StepPosterior:
    """The fitted step model: point step times and joint draws for any cell (equal when fitted to
    the same observations with the same widths: the fit is deterministic)."""

    methods: tuple[str, ...]
    sampled_methods: tuple[str, ...]  # methods with a probabilistic factor
    captured_widths: CapturedWidths
    knee: float | None
    theta: np.ndarray
    gamma: np.ndarray
    scale: np.ndarray  # each feature's largest value measured: theta * scale is a part's largest cost
    covariance: np.ndarray  # of (theta * scale, gamma)
    start_sd: float  # sigma_start: the run-to-run noise of a start
    cell_sd: float  # tau: what the physics misses at one cell
    level_se: float  # a typical level's own error
    cells: tuple[Cell, ...]  # measured cells
    deviation: np.ndarray  # posterior mean of each measured cell's delta
    deviation_cov: np.ndarray  # and its covariance
    gain: np.ndarray  # (cells, observations): delta's mean as a linear map of the residuals
    observations: tuple[StepObservation, ...]
    log_times: np.ndarray
    drafted_share: dict[CellKey, float]
    accepted_per_draft: dict[CellKey, float]  # tokens a drafting step accepted, (E - 1) / q, per measured cell
    df: int  # observations beyond the parameters of the mean
    spread_df: float = math.inf  # what sigma_start is known with: draws are Student-t on these degrees of freedom
    # each observation's prefill lag (``prefill_lags``), read by the last factor of gamma (None: not read)
    prefill: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepPosterior):
            return NotImplemented
        return self.observations == other.observations and self.captured_widths == other.captured_widths

    def __hash__(self) -> int:
        return hash((self.observations, self.captured_widths))

    @property
    def run_sd(self) -> float:
        """What one start's measurement of a configuration varies by: the start and the level's own error."""
        return math.sqrt(self.start_sd**2 + self.level_se**2)

    @property
    def draw_df(self) -> float:
        """The degrees of freedom of the draws (Satterthwaite): a measurement's variance is the
        start's sigma_start^2, known on ``spread_df``, and the level's own se^2, known from its
        requests; the sum is known on spread_df / r^2, r the start's share of it. Where starts move
        little beside the levels' own error, the draws are all but normal."""
        share = self.start_sd**2 / max(self.run_sd**2, 1e-300)
        return math.inf if math.isinf(self.spread_df) or share <= 0 else min(self.spread_df / share**2, 1e6)

    @property
    def sampling_factors(self) -> np.ndarray:
        """gamma_m: each sampled method's log factor of a probabilistic step over a greedy one."""
        return self.gamma[: len(self.sampled_methods)]

    @property
    def prefill_slope(self) -> float | None:
        """beta: a start's log step time per log of its prefill lag (None: not read)."""
        return None if self.prefill is None else float(self.gamma[-1])

    @property
    def reads_context(self) -> bool:
        """The study measured a context level: the model has its context parts."""
        return any(o.context_tokens for o in self.observations)

    def measured(self, cell: Cell) -> bool:
        return any(c.key == cell.key for c in self.cells)

    def physics_s(self, cell: Cell, accepted: float | None = None) -> float:
        """The step time the model's parts give ``cell``, without its deviation (``accepted``: see ``share``)."""
        return float(mu(self._design([cell], [self.share(cell, accepted)]), self.theta, self.gamma)[0])

    def mean_s(self, cell: Cell, accepted: float | None = None) -> float:
        """The step time of ``cell`` in a typical start: the physics and, where measured, its deviation."""
        base = self.physics_s(cell, accepted)
        index = self._cell_index(cell)
        return base * math.exp(float(self.deviation[index])) if index is not None else base

    def draws(
        self,
        cells: Sequence[Cell],
        *,
        draws: int,
        rng: np.random.Generator,
        accepted: Sequence[float | None] | None = None,
    ) -> np.ndarray:
        """Joint draws of the step time at each cell in a typical start, shape (draws, len(cells))
        (``accepted``: per cell, see ``share``)."""
        wide, sampled = self._part_draws(draws, rng)
        p = self.theta.size
        theta = sampled[:, :p] / self.scale
        gamma = sampled[:, p:]
        design_obs = self._design(
            [o.cell for o in self.observations], [o.drafted_share for o in self.observations], self.prefill
        )
        # each draw's residuals give each measured cell's deviation (its mean), plus its own spread
        mu_obs = np.log(np.maximum(mu(design_obs, theta, gamma), 1e-12))
        dev = np.zeros((draws, len(self.cells)))
        if self.cells:
            dev = (self.log_times[None, :] - mu_obs) @ self.gain.T
            dev += wide[:, None] * (rng.standard_normal((draws, len(self.cells))) @ _sqrt_psd(self.deviation_cov).T)
        shares = [self.share(c, a) for c, a in zip(cells, accepted or [None] * len(cells), strict=True)]
        out = mu(self._design(cells, shares), theta, gamma)
        fresh = rng.standard_normal((draws, len(cells))) * self.cell_sd  # the physics miss: not the starts
        for j, cell in enumerate(cells):
            index = self._cell_index(cell)
            out[:, j] *= np.exp(dev[:, index] if index is not None else fresh[:, j])
        floored: np.ndarray = np.maximum(out, self.floor_s)
        return floored

    def _part_draws(self, draws: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draws of (theta * scale, gamma) from the fit's normal approximation held to theta >= 0
        (no part of a step costs less than nothing), each with its Student-t width factor.

        Student-t, not normal: what the measurements say (the parts, the measured cells' deviations)
        rests on sigma_start estimated from a few starts, so each draw scales those spreads by one
        factor sqrt(nu / chi2_nu) on the draws' df; an unmeasured cell's miss, tau, is no start's.
        Parts the data cannot tell apart (one stream: a verified token against a draft position
        and the drafting step) have a wide joint spread along which every measured step keeps its
        time. Clipping each part at zero on its own would cut that line one-sidedly and lengthen
        every drafting step's draws (by 14% at the median on a real llama-server's n-gram study,
        the fit's own step times at their 5th percentile); a draw is therefore kept whole or drawn
        again (rejection: the normal truncated to theta >= 0). Where few draws would ever be kept,
        the remainder is clipped as a last resort."""
        params = np.concatenate([self.theta * self.scale, self.gamma])
        p, nu = self.theta.size, self.draw_df
        kept_wide: list[np.ndarray] = []
        kept: list[np.ndarray] = []
        count = 0
        for _ in range(REJECTION_ROUNDS):
            wide = np.ones(draws) if math.isinf(nu) else np.sqrt(nu / rng.chisquare(nu, draws))
            sampled = params + wide[:, None] * rng.multivariate_normal(
                np.zeros(params.size), self.covariance, size=draws, method="eigh"
            )
            ok = np.all(sampled[:, :p] >= 0.0, axis=1)
            kept_wide.append(wide[ok])
            kept.append(sampled[ok])
            count += int(ok.sum())
            if count >= draws:
                return np.concatenate(kept_wide)[:draws], np.concatenate(kept)[:draws]
        short = draws - count
        sampled[:short, :p] = np.maximum(sampled[:short, :p], 0.0)
        return np.concatenate([*kept_wide, wide[:short]]), np.concatenate([*kept, sampled[:short]])

    @property
    def floor_s(self) -> float:
        """No step is drawn faster than half the fastest step measured: every step reads the weights
        once, and the cheapest measured (usually speculation off at the fewest streams) did little
        more. Without it, a draw whose parts all clip to zero would give a rate of 1e12 tok/s."""
        return 0.5 * float(np.exp(np.min(self.log_times))) if self.log_times.size else 1e-12

    def _cell_index(self, cell: Cell) -> int | None:
        return next((i for i, c in enumerate(self.cells) if c.key == cell.key), None)

    def _design(
        self,
        cells: Sequence[Cell],
        shares: Sequence[float] | None = None,
        lags: Sequence[float] | np.ndarray | None = None,
    ) -> Design:
        """The design of ``cells`` (``lags``: their starts' prefill lags; none given, a typical start's, 0)."""
        if shares is None:
            shares = [self.share(c) for c in cells]
        if self.prefill is not None and lags is None:
            lags = [0.0] * len(cells)
        return design_of(
            cells, shares, self.methods, self.sampled_methods, self.captured_widths, self.knee, self.reads_context,
            lags,
        )  # fmt: skip

    def share(self, cell: Cell, accepted: float | None = None) -> float:
        """The share q of a cell's steps that draft in a typical text, measured there or not.

        A drafter that looks its drafts up drafts only where the text matches. The steps that do
        not draft emit one token each, so the output's tokens where nothing matched take
        ``c = (1 - q) / E`` steps per output token, and which tokens those are is the text's, not
        the draft length's: c is one number across k, and each start's c is one draw of it (the
        engine's outputs differ by configuration; on a real llama-server's n-gram studies c centred
        on 0.22 at k = 3..8, one start in four off by 0.05 to 0.08 either way, where q fell from
        0.50 to 0.34 with k). At a draft length whose drafting steps accept ``accepted`` tokens
        (S_1 + ... + S_k), E = 1 + q accepted, so ``q = (1 - c) / (1 + c accepted)``, c the mean
        over the drafter's drafting levels (at this concurrency and context first). Without
        ``accepted``: a measured cell's own q, else the nearest measured draft length's accepted
        tokens. A draft length the engine drafted nothing at keeps q = 0; a drafter that drafts
        at every step has c = 0 and q = 1."""
        own = self.drafted_share.get(cell.key)
        if own == 0.0 or (own is not None and accepted is None):
            return own
        _, k, method, sampling, context = cell.key
        mine = [key for key in self.drafted_share if key[2:4] == (method, sampling) and key[1] > 0]
        mine = [key for key in mine if self.drafted_share[key] > 0] or mine
        if not mine:
            return 1.0

        def distance(key: CellKey) -> tuple[bool, bool]:
            return key[0] != cell.concurrency, key[4] != context

        nearest = min(distance(key) for key in mine)
        group = [key for key in mine if distance(key) == nearest]
        shares = [self.drafted_share[key] for key in group]
        lengths = [self.accepted_per_draft.get(key, 0.0) for key in group]
        steps = float(np.mean([(1.0 - q) / (1.0 + q * a) for q, a in zip(shares, lengths, strict=True)]))
        if accepted is None:
            accepted = lengths[min(range(len(group)), key=lambda i: abs(group[i][1] - k))]
        return (1.0 - steps) / (1.0 + steps * max(accepted, 0.0))


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    if matrix.size == 0:
        return matrix
    values, vectors = np.linalg.eigh(matrix)
    root: np.ndarray = vectors * np.sqrt(np.maximum(values, 0.0))
    return root
