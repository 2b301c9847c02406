"""One model of what a server step costs, fitted over every measured level of every start.

A measured level gives the effective time of one step, t = B E / R (B streams, E tokens per step,
aggregate rate R). Its logarithm is

    log t = log mu(x; theta, gamma) + u_start + delta_cell + eps

- ``mu`` is what the step processes, each part at a non-negative cost (theta >= 0):
  ``mu = exp(gamma_m [probabilistic]) * (theta_0 + theta_seq B + theta_ver W + theta_knee (W - h)+
  + sum_m (theta_draft,m D + theta_pos,m k + theta_fixed,m [k > 0]))``,
  with W the verified tokens B (k + 1) padded to the smallest width the engine captured a graph
  for (none given: unpadded), D the drafted tokens B k times the share of steps that drafted (a
  drafter that looks its drafts up drafts only where the text matches; its counters say how
  often), and h the knee where a memory-bound step turns compute-bound (chosen by the marginal
  likelihood among the widths measured, or none). Draft costs belong to the drafter's method;
  the draft sampling scales a step by one factor gamma_m per method.
- ``u_start ~ N(0, sigma_start^2)``: every level of one server start moves together (the run-to-run
  noise).
- ``delta_cell ~ N(0, tau^2)``: what the physics misses at one (concurrency, drafter, k), shared by
  every start of it. Its size tau is estimated from the data; a measured cell leans on its own
  measurements as far as they outweigh tau, an unmeasured one carries tau whole.
- ``eps ~ N(0, se_i^2)``: the level's own measurement error from its requests' spread.

Priors (stated in docs/math.md): sigma_start is scaled-inverse-chi-square at the engine's usual
run noise (``RunNoisePrior``); tau at ``TAU_PRIOR`` (the 2% a 12% pad at a far draft length hides
at the short ones through a line); gamma_m normal at 0 with sd ``GAMMA_PRIOR_SD``; theta a weak
ridge that only pins directions the data leave free. Variance components maximise the restricted
marginal likelihood times their priors; theta and gamma are then the generalised least squares
fit given them, with their covariance from its Hessian (a Laplace approximation). Draws of a
step time draw theta and gamma, then each measured cell's deviation given the residuals, and an
unmeasured cell's from N(0, tau^2).

Pure: no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from specsweep.analysis.drafters import Drafter
from specsweep.errors import FitError
from specsweep.types import RunNoisePrior

TAU_PRIOR = RunNoisePrior(
    relative_sd=0.02, df=2, source="a 12% pad at the far draft length misses a line by up to 2% at the short ones"
)
START_PRIOR = RunNoisePrior(relative_sd=0.05, df=2, source="no engine named: a start-to-start spread of 5%")
GAMMA_PRIOR_SD = 0.10  # probabilistic over greedy step time: 1.00 to 1.09 on the rigs modelled so far
RIDGE_SD = 1.0  # each part of a step is a priori within the size of a whole step: pins what the data leave free
MIN_LEVEL_SE = 0.002  # a level's own error is never taken as smaller than this


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

    @property
    def cell(self) -> Cell:
        off = self.num_speculative_tokens == 0 or self.drafter is None
        return Cell(concurrency=self.concurrency, drafter=None if off else self.drafter,
                    num_speculative_tokens=0 if off else self.num_speculative_tokens)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Cell:
    """A configuration at one concurrency: what a step time is predicted for."""

    concurrency: int
    num_speculative_tokens: int
    drafter: Drafter | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[int, int, str, str]:
        d = self.drafter
        return (
            self.concurrency,
            self.num_speculative_tokens,
            d.method if d else "",
            d.draft_sample_method if d else "",
        )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StepPosterior:
    """The fitted step model: point step times and joint draws for any cell (equal when fitted to
    the same observations with the same widths: the fit is deterministic)."""

    methods: tuple[str, ...]
    sampled_methods: tuple[str, ...]  # methods with a probabilistic factor
    captured_widths: tuple[int, ...]
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
    drafted_share: dict[tuple[int, int, str, str], float]
    df: int  # observations beyond the parameters of the mean

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

    def measured(self, cell: Cell) -> bool:
        return any(c.key == cell.key for c in self.cells)

    def physics_s(self, cell: Cell) -> float:
        """The step time the model's parts give ``cell``, without its deviation."""
        return float(_mu(self._design([cell]), self.theta, self.gamma)[0])

    def mean_s(self, cell: Cell) -> float:
        """The step time of ``cell`` in a typical start: the physics and, where measured, its deviation."""
        base = self.physics_s(cell)
        index = self._cell_index(cell)
        return base * math.exp(float(self.deviation[index])) if index is not None else base

    def draws(self, cells: Sequence[Cell], *, draws: int, rng: np.random.Generator) -> np.ndarray:
        """Joint draws of the step time at each cell in a typical start, shape (draws, len(cells))."""
        params = np.concatenate([self.theta * self.scale, self.gamma])
        sampled = rng.multivariate_normal(params, self.covariance, size=draws, method="eigh")
        p = self.theta.size
        theta, gamma = (
            np.maximum(sampled[:, :p], 0.0) / self.scale,
            sampled[:, p:],
        )  # no part of a step costs less than nothing
        design_obs = self._design([o.cell for o in self.observations], [o.drafted_share for o in self.observations])
        # each draw's residuals give each measured cell's deviation (its mean), plus its own spread
        mu_obs = np.log(np.maximum(_mu_draws(design_obs, theta, gamma), 1e-12))
        dev = np.zeros((draws, len(self.cells)))
        if self.cells:
            dev = (self.log_times[None, :] - mu_obs) @ self.gain.T
            dev += rng.standard_normal((draws, len(self.cells))) @ _sqrt_psd(self.deviation_cov).T
        out = _mu_draws(self._design(cells), theta, gamma)
        fresh = rng.standard_normal((draws, len(cells))) * self.cell_sd
        for j, cell in enumerate(cells):
            index = self._cell_index(cell)
            out[:, j] *= np.exp(dev[:, index] if index is not None else fresh[:, j])
        return np.maximum(out, 1e-12)

    def _cell_index(self, cell: Cell) -> int | None:
        return next((i for i, c in enumerate(self.cells) if c.key == cell.key), None)

    def _design(self, cells: Sequence[Cell], shares: Sequence[float] | None = None) -> _Design:
        if shares is None:
            shares = [self.share(c) for c in cells]
        return _design(cells, shares, self.methods, self.sampled_methods, self.captured_widths, self.knee)

    def share(self, cell: Cell) -> float:
        """The share of a cell's steps that draft: as measured there, else as measured at the same
        drafter's nearest draft length (at this concurrency first), else every step."""
        if cell.key in self.drafted_share:
            return self.drafted_share[cell.key]
        _, k, method, sampling = cell.key
        mine = [(key, v) for key, v in self.drafted_share.items() if key[2:] == (method, sampling) and key[1] > 0]
        if not mine:
            return 1.0
        nearest = min(mine, key=lambda kv: (kv[0][0] != cell.concurrency, abs(kv[0][1] - k)))
        return nearest[1]


@dataclass(frozen=True, slots=True)
class _Design:
    features: np.ndarray  # (n, p): what each step processes, per unit cost
    sampled: np.ndarray  # (n, g): 1 where the step drafts probabilistically with that method


def _mu(design: _Design, theta: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    return (design.features @ theta) * np.exp(design.sampled @ gamma)


def _mu_draws(design: _Design, theta: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """mu for each row of ``theta`` and ``gamma`` (draws): shape (draws, steps)."""
    return (theta @ design.features.T) * np.exp(gamma @ design.sampled.T)


def padded(tokens: int, widths: Sequence[int]) -> int:
    """The width a step of ``tokens`` verified tokens runs at: the smallest captured width that holds them."""
    return next((w for w in sorted(widths) if w >= tokens), tokens)


def _design(
    cells: Sequence[Cell],
    shares: Sequence[float],
    methods: Sequence[str],
    sampled_methods: Sequence[str],
    widths: Sequence[int],
    knee: float | None,
) -> _Design:
    """Per step: 1 (the weights read), B (each sequence's own work), the tokens verified beyond one
    per sequence with the padding to a captured width (B k times the share of steps that drafted),
    the hinge above the knee, and per method the draft positions run and whether the step drafts."""
    rows, flags = [], []
    for cell, share in zip(cells, shares, strict=True):
        b, k = cell.concurrency, cell.num_speculative_tokens
        width = float(padded(math.ceil(b * (1 + k * share) - 1e-9), widths))
        row = [1.0, float(b), width - b, *([max(width - knee, 0.0)] if knee is not None else [])]
        for m in methods:
            on = cell.drafter is not None and cell.drafter.method == m and k > 0
            row += [float(k), 1.0] if on else [0.0, 0.0]
        rows.append(row)
        flags.append(
            [1.0 if cell.drafter is not None and k > 0 and cell.drafter.method == m
             and cell.drafter.draft_sample_method != "greedy" else 0.0 for m in sampled_methods]
        )  # fmt: skip
    return _Design(
        np.array(rows, dtype=float).reshape(len(cells), -1), np.array(flags, dtype=float).reshape(len(cells), -1)
    )


def fit_step_model(
    observations: Sequence[StepObservation],
    *,
    start_prior: RunNoisePrior | None = None,
    captured_widths: Sequence[int] = (),
) -> StepPosterior:
    """The step model over every observation. FitError when nothing is usable."""
    usable = [o for o in observations if o.step_time_s > 0 and math.isfinite(o.step_time_s) and o.concurrency >= 1]
    if not usable:
        raise FitError("no measured level gives a step time: measure at least one configuration.")
    prior = start_prior or START_PRIOR
    methods = tuple(sorted({o.drafter.method for o in usable if o.drafter is not None and o.num_speculative_tokens}))
    sampled = tuple(
        m for m in methods
        if any(o.drafter is not None and o.drafter.method == m and o.drafter.draft_sample_method != "greedy"
               and o.num_speculative_tokens for o in usable)
    )  # fmt: skip
    y = np.log([o.step_time_s for o in usable])
    se = np.array([max(o.relative_se or 0.0, MIN_LEVEL_SE) for o in usable])
    starts = sorted({o.start for o in usable})
    z_start = np.array([[1.0 if o.start == s else 0.0 for s in starts] for o in usable])
    cells = sorted({o.cell.key: o.cell for o in usable}.values(), key=lambda c: c.key)
    keys = [c.key for c in cells]
    z_cell = np.array([[1.0 if o.cell.key == key else 0.0 for key in keys] for o in usable])
    shares = [o.drafted_share for o in usable]
    widths = tuple(sorted(set(captured_widths)))

    def fitted(knee: float | None, log_sd: np.ndarray | None = None) -> _Fit:
        design = _design([o.cell for o in usable], shares, methods, sampled, widths, knee)
        return _fit_components(y, se, z_start, z_cell, design, prior, knee, log_sd)

    def score(fit: _Fit) -> float:  # two more parameters with a knee, its place and slope (AIC)
        return fit.objective + (0.0 if fit.knee is None else 2.0)

    # Where a knee sits: every place between the widths measured ranked by the plain marginal
    # likelihood at the variance components of the fit without one, the best two refined between
    # their neighbours, and fitted whole.
    fit = fitted(None)
    at = np.log([fit.start_sd, fit.cell_sd])
    places = _knees(usable, widths)[1:]
    for start in sorted(places, key=lambda knee: score(fitted(knee, at)))[:2]:
        place, i = start, places.index(start)
        low, high = places[max(i - 1, 0)], places[min(i + 1, len(places) - 1)]
        if high > low:
            found = optimize.minimize_scalar(
                lambda knee: score(fitted(float(knee), at)), bounds=(low, high), method="bounded",
                options={"xatol": 0.25},
            )  # fmt: skip
            place = float(found.x) if score(fitted(float(found.x), at)) < score(fitted(place, at)) else place
        candidate = fitted(place)
        if score(candidate) < score(fit):
            fit = candidate
    share_of: dict[tuple[int, int, str, str], list[float]] = {}
    for o in usable:
        share_of.setdefault(o.cell.key, []).append(o.drafted_share)
    return StepPosterior(
        methods=methods,
        sampled_methods=sampled,
        captured_widths=widths,
        knee=fit.knee,
        theta=fit.theta,
        gamma=fit.gamma,
        scale=fit.scale,
        covariance=fit.covariance,
        start_sd=fit.start_sd,
        cell_sd=fit.cell_sd,
        level_se=float(np.sqrt(np.mean(se**2))),
        cells=tuple(cells),
        deviation=fit.deviation,
        deviation_cov=fit.deviation_cov,
        gain=fit.gain,
        observations=tuple(usable),
        log_times=y,
        drafted_share={key: float(np.mean(v)) for key, v in share_of.items()},
        df=max(len(usable) - fit.theta.size - fit.gamma.size, 0),
    )


def _knees(observations: Sequence[StepObservation], widths: Sequence[int]) -> list[float | None]:
    """Where a knee could sit: none, or at or between the verified widths measured, inside their range."""
    measured = sorted({padded(o.concurrency * (o.cell.num_speculative_tokens + 1), widths) for o in observations})
    if len(measured) < 4:
        return [None]
    places = sorted({*measured[1:-1], *((a + b) / 2 for a, b in itertools.pairwise(measured))})
    return [None, *(float(w) for w in places)]


@dataclass(frozen=True, slots=True)
class _Fit:
    objective: float
    knee: float | None
    theta: np.ndarray
    gamma: np.ndarray
    scale: np.ndarray
    covariance: np.ndarray
    start_sd: float
    cell_sd: float
    deviation: np.ndarray
    deviation_cov: np.ndarray
    gain: np.ndarray


def _fit_components(
    y: np.ndarray,
    se: np.ndarray,
    z_start: np.ndarray,
    z_cell: np.ndarray,
    design: _Design,
    prior: RunNoisePrior,
    knee: float | None,
    log_sd: np.ndarray | None = None,
) -> _Fit:
    """Variance components by their restricted marginal likelihood times their priors; the mean by
    generalised least squares given them. A part of the step the measurements cannot tell from the
    others (every level at one concurrency: a sequence's cost from a step's) is left out, at zero
    cost: the measured cells carry it, and an unmeasured one's deviation carries what it misses."""
    full = design
    kept = _independent_columns(full.features)
    design = _Design(full.features[:, kept], full.sampled)
    scale = np.maximum(design.features.max(axis=0), 1e-12)
    p = design.features.shape[1]
    warm: list[np.ndarray] = []

    def covariance(log_sd: np.ndarray) -> np.ndarray:
        s, t = np.exp(log_sd)
        return s * s * z_start @ z_start.T + t * t * z_cell @ z_cell.T + np.diag(se**2)

    def objective(log_sd: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float]:
        # restricted (the mean's information in), and plain marginal: only the plain one compares means
        v = covariance(log_sd)
        params, info, _ = _gls(y, v, design, scale, warm[-1] if warm else None)
        warm.append(params)
        resid = y - np.log(np.maximum(_mu(design, params[:p] / scale, params[p:]), 1e-12))
        _, logdet = np.linalg.slogdet(v)
        _, logdet_info = np.linalg.slogdet(info / np.outer(*(2 * [np.concatenate([scale, np.ones(params.size - p)])])))
        value = 0.5 * (resid @ np.linalg.solve(v, resid) + logdet)
        for sd, belief in ((math.exp(log_sd[0]), prior), (math.exp(log_sd[1]), TAU_PRIOR)):
            value -= _log_scaled_inv_chi2(sd, belief)
        return float(value + 0.5 * logdet_info), params, info, float(value)

    if log_sd is None:
        result = optimize.minimize(
            lambda z: objective(np.clip(z, math.log(1e-4), 0.0))[0],
            np.log([prior.relative_sd, TAU_PRIOR.relative_sd]),
            method="Nelder-Mead",
            options={"xatol": 0.05, "fatol": 1e-3, "maxiter": 80},
        )
        log_sd = result.x
    log_sd = np.clip(log_sd, math.log(1e-4), 0.0)
    _, params, info, value = objective(log_sd)
    theta, gamma = params[:p] / scale, params[p:]
    v = covariance(log_sd)
    resid = y - np.log(np.maximum(_mu(design, theta, gamma), 1e-12))
    tau2 = math.exp(2 * log_sd[1])
    v_inv = np.linalg.inv(v)
    gain = tau2 * z_cell.T @ v_inv
    deviation_cov = tau2 * np.eye(z_cell.shape[1]) - tau2 * tau2 * z_cell.T @ v_inv @ z_cell
    scaled_info = info / np.outer(*(2 * [np.concatenate([scale, np.ones(params.size - p)])]))
    covariance_params = np.linalg.inv(scaled_info)  # of (theta * scale, gamma): well conditioned
    # back to every part, the ones left out at zero cost and no spread
    every = full.features.shape[1]
    index = np.concatenate([kept, every + np.arange(gamma.size)])
    covariance_full = np.zeros((every + gamma.size, every + gamma.size))
    covariance_full[np.ix_(index, index)] = (covariance_params + covariance_params.T) / 2
    theta_full, scale_full = np.zeros(every), np.ones(every)
    theta_full[kept], scale_full[kept] = theta, scale
    return _Fit(
        objective=value,
        knee=knee,
        theta=theta_full,
        gamma=gamma,
        scale=scale_full,
        covariance=covariance_full,
        start_sd=math.exp(log_sd[0]),
        cell_sd=math.sqrt(tau2),
        deviation=gain @ resid,
        deviation_cov=(deviation_cov + deviation_cov.T) / 2,
        gain=gain,
    )


def _independent_columns(features: np.ndarray) -> np.ndarray:
    """The columns, in order, that are not a combination of those before them."""
    scaled = features / np.maximum(np.abs(features).max(axis=0), 1e-12)
    kept: list[int] = []
    for j in range(scaled.shape[1]):
        trial = scaled[:, [*kept, j]]
        if np.linalg.matrix_rank(trial, tol=1e-8 * max(1.0, float(np.abs(trial).max()))) > len(kept):
            kept.append(j)
    return np.array(kept, dtype=int)


def _gls(
    y: np.ndarray, v: np.ndarray, design: _Design, scale: np.ndarray, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """theta >= 0 and gamma by Gauss-Newton on log mu against y under covariance v, with theta's
    ridge (each part a priori within ``RIDGE_SD`` whole steps) and gamma's normal prior; returns
    them and the information matrix (the Hessian of the criterion) in the features' own units."""
    x, g = design.features / scale, design.sampled
    p, q = x.shape[1], g.shape[1]
    chol = np.linalg.cholesky(np.linalg.inv(v))
    mean_t = math.exp(float(np.mean(y)))
    if start is None:
        start = np.concatenate([[mean_t], np.zeros(p - 1 + q)])
    params = start.copy()
    prior_rows = np.vstack([
        np.column_stack([np.eye(p) / (RIDGE_SD * mean_t), np.zeros((p, q))]),
        np.column_stack([np.zeros((q, p)), np.eye(q) / GAMMA_PRIOR_SD]),
    ])  # fmt: skip
    for _ in range(20):
        jac = _jacobian(x, g, params, p)
        target = y - np.log(np.maximum(_mu(_Design(x, g), params[:p], params[p:]), 1e-12)) + jac @ params
        new = _bounded_lstsq(
            np.vstack([chol.T @ jac, prior_rows]), np.concatenate([chol.T @ target, np.zeros(p + q)]), p
        )
        done = np.max(np.abs(new - params)) < 1e-7 * (1 + np.max(np.abs(new)))
        params = new
        if done:
            break
    jac = _jacobian(x, g, params, p)
    info = jac.T @ np.linalg.solve(v, jac) + prior_rows.T @ prior_rows
    unscale = np.concatenate([scale, np.ones(q)])  # scaled theta = theta * scale
    return params, info * np.outer(unscale, unscale), unscale


def _jacobian(x: np.ndarray, g: np.ndarray, params: np.ndarray, p: int) -> np.ndarray:
    """d log mu / d (theta, gamma)."""
    mu = np.maximum(x @ params[:p], 1e-12)
    return np.column_stack([x / mu[:, None], g])


def _bounded_lstsq(a: np.ndarray, b: np.ndarray, nonneg: int) -> np.ndarray:
    """Least squares with the first ``nonneg`` coefficients at or above zero."""
    lower = np.concatenate([np.zeros(nonneg), np.full(a.shape[1] - nonneg, -np.inf)])
    return np.asarray(optimize.lsq_linear(a, b, bounds=(lower, np.full(a.shape[1], np.inf))).x)


def _log_scaled_inv_chi2(sd: float, prior: RunNoisePrior) -> float:
    """log density of the variance sd^2 under a scaled-inverse-chi-square prior (up to a constant),
    as a density of log sd."""
    nu, s2, var = prior.df, prior.relative_sd**2, sd * sd
    return -(nu / 2) * math.log(var) - nu * s2 / (2 * var)


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    if matrix.size == 0:
        return matrix
    values, vectors = np.linalg.eigh(matrix)
    return vectors * np.sqrt(np.maximum(values, 0.0))
