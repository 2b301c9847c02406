"""The fit of the one step model (analysis/step_model.py): variance components by their restricted
marginal likelihood times their priors, the costs by generalised least squares given them, and the
knee's place. docs/math.md states each step.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize
from scipy.linalg import block_diag

from specsweep.analysis.fits import inverse_hessian
from specsweep.analysis.start_effect import PREFILL_PRIOR_SD, SharedStart, prefill_lags, prefill_prior
from specsweep.analysis.step_design import (
    GAMMA_PRIOR_SD,
    Design,
    bounded_lstsq,
    design_of,
    independent_columns,
    mu,
    padded,
)
from specsweep.analysis.step_model import (
    MIN_LEVEL_SE,
    RIDGE_SD,
    Cell,
    CellKey,
    StepObservation,
    StepPosterior,
    step_priors,
)
from specsweep.errors import FitError
from specsweep.types import CapturedWidths, NoisePriors, RunNoisePrior


def fit_step_model(
    observations: Sequence[StepObservation],
    *,
    noise_prior: NoisePriors | None = None,
    captured_widths: CapturedWidths = CapturedWidths(),
    shared_start: SharedStart | None = None,
) -> StepPosterior:
    """The step model over every observation. FitError when nothing is usable. ``shared_start``:
    sigma_start and the degrees of freedom it is known on, from ``shared_start_sd`` over every
    workload the study's starts measured; it is then held, and only tau fitted here."""
    prior, tau = step_priors(noise_prior, captured_widths)
    group = _Group.of(observations, prior)
    if group is None:
        raise FitError("no measured level gives a step time: measure at least one configuration.")
    usable, se = group.observations, group.se
    z_start = _indicators([o.start for o in usable])

    def fitted(knee: float | None, log_sd: np.ndarray | None = None) -> _Fit:
        design = group.design(captured_widths, knee, prefill_prior=prefill_prior(shared_start))
        return _fit_components(group.y, se, [z_start], [group.z_cell], design, prior, tau, knee, log_sd, shared_start)

    def score(fit: _Fit) -> float:  # two more parameters with a knee, its place and slope (AIC)
        return fit.objective + (0.0 if fit.knee is None else 2.0)

    # Where a knee sits: every place between the widths measured ranked by the plain marginal
    # likelihood at the variance components of the fit without one, the best two refined between
    # their neighbours, and fitted whole.
    fit = fitted(None)
    at = np.log([fit.start_sd, fit.cell_sd])
    places = [knee for knee in _knees(usable, captured_widths) if knee is not None]
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
    by_cell: dict[CellKey, list[StepObservation]] = {}
    for o in usable:
        by_cell.setdefault(o.cell.key, []).append(o)
    return StepPosterior(
        methods=group.methods,
        sampled_methods=group.sampled,
        captured_widths=captured_widths,
        knee=fit.knee,
        theta=fit.theta,
        gamma=fit.gamma,
        scale=fit.scale,
        covariance=fit.covariance,
        start_sd=fit.start_sd,
        cell_sd=fit.cell_sd,
        level_se=float(np.sqrt(np.mean(se**2))),
        cells=group.cells,
        deviation=fit.deviation,
        deviation_cov=fit.deviation_cov,
        gain=fit.gain,
        observations=usable,
        log_times=group.y,
        drafted_share={key: float(np.mean([o.drafted_share for o in v])) for key, v in by_cell.items()},
        accepted_per_draft={key: float(np.mean([o.accepted_per_draft for o in v])) for key, v in by_cell.items()},
        df=max(len(usable) - fit.theta.size - fit.gamma.size, 0),
        spread_df=fit.spread_df,
        prefill=group.lags,
    )


def shared_start_sd(
    workloads: Sequence[Sequence[StepObservation]],
    *,
    noise_prior: NoisePriors | None = None,
    captured_widths: CapturedWidths = CapturedWidths(),
) -> SharedStart | None:
    """sigma_start, the degrees of freedom it is known on, and the prefill slope beta, from every
    workload at once: the same model, each workload with its own costs and its own tau (no knee),
    a start's effect in two parts: one shared by every workload the start measured, and one of
    each workload in it (a start that ran prose slow and technical fast), and one beta, since the
    machine's pace a prefill shows is the start's, not a workload's. One workload alone cannot tell
    a start's effect from a configuration's own deviation when each configuration had one start;
    across workloads, the part they share is the start's. sigma_start is both parts together, what
    one workload's fit reads. None: fewer than two workloads with a usable level."""
    prior, tau = step_priors(noise_prior, captured_widths)
    groups = [g for g in (_Group.of(w, prior) for w in workloads) if g is not None]
    if len(groups) < 2:
        return None
    designs = [g.design(captured_widths, None, lags=False) for g in groups]
    sampled = block_diag(*[d.sampled for d in designs])
    prior_sd = np.full(sampled.shape[1], GAMMA_PRIOR_SD)
    reads_prefill = any(g.lags is not None for g in groups)
    if reads_prefill:
        lags = np.concatenate([g.lags if g.lags is not None else np.zeros(g.y.size) for g in groups])
        sampled, prior_sd = np.column_stack([sampled, lags]), np.append(prior_sd, PREFILL_PRIOR_SD)
    design = Design(block_diag(*[d.features for d in designs]), sampled, prior_sd)
    z_cells = block_diag(*[g.z_cell for g in groups])
    edges = np.cumsum([0, *(g.z_cell.shape[1] for g in groups)])
    z_start = _indicators([o.start for g in groups for o in g.observations])
    z_own = _indicators([(o.start, w) for w, g in enumerate(groups) for o in g.observations])
    y, se = np.concatenate([g.y for g in groups]), np.concatenate([g.se for g in groups])
    blocks = [z_cells[:, a:b] for a, b in itertools.pairwise(edges)]
    fit = _fit_components(y, se, [z_start, z_own], blocks, design, prior, tau, None)
    if not reads_prefill:
        return SharedStart(fit.start_sd, fit.spread_df)
    slope_sd = math.sqrt(max(float(fit.covariance[-1, -1]), 0.0))
    return SharedStart(fit.start_sd, fit.spread_df, float(fit.gamma[-1]), slope_sd)


@dataclass(frozen=True, slots=True)
class _Group:
    """One workload's usable levels and what the fit reads of them."""

    observations: tuple[StepObservation, ...]
    methods: tuple[str, ...]
    sampled: tuple[str, ...]  # the methods measured with a non-greedy draft sampling
    y: np.ndarray  # log step times
    se: np.ndarray  # each level's own relative error
    cells: tuple[Cell, ...]
    z_cell: np.ndarray
    lags: np.ndarray | None  # each level's start's prefill lag (start_effect.prefill_lags; None: not read)

    @classmethod
    def of(cls, observations: Sequence[StepObservation], prior: RunNoisePrior) -> _Group | None:
        usable = tuple(
            o for o in observations if o.step_time_s > 0 and math.isfinite(o.step_time_s) and o.concurrency >= 1
        )
        if not usable:
            return None
        drafting = [o for o in usable if o.drafter is not None and o.num_speculative_tokens]
        methods = tuple(sorted({o.drafter.method for o in drafting if o.drafter is not None}))
        sampled = tuple(m for m in methods if any(
            o.drafter is not None and o.drafter.method == m and o.drafter.draft_sample_method != "greedy"
            for o in drafting
        ))  # fmt: skip
        cells = tuple(sorted({o.cell.key: o.cell for o in usable}.values(), key=lambda c: c.key))
        # a level's own error: from its requests' spread; not known (a study stored before it was
        # kept, a rig's derived level), the engine's usual noise
        se = np.array([max(o.relative_se if o.relative_se else prior.relative_sd, MIN_LEVEL_SE) for o in usable])
        z_cell = _indicators([o.cell.key for o in usable], [c.key for c in cells])
        y = np.log([o.step_time_s for o in usable])
        return cls(usable, methods, sampled, y, se, cells, z_cell, prefill_lags(usable))

    def design(
        self, widths: CapturedWidths, knee: float | None, *, lags: bool = True,
        prefill_prior: tuple[float, float] = (0.0, PREFILL_PRIOR_SD),
    ) -> Design:  # fmt: skip
        """With ``lags``, its starts' prefill lags where read, beta a priori ``prefill_prior`` (mean, sd)."""
        reads_context = any(o.context_tokens for o in self.observations)
        return design_of(
            [o.cell for o in self.observations], [o.drafted_share for o in self.observations], self.methods,
            self.sampled, widths, knee, reads_context, self.lags if lags else None, prefill_prior,
        )  # fmt: skip


def _indicators(labels: Sequence[Any], columns: Sequence[Any] | None = None) -> np.ndarray:
    """One column per distinct label (sorted, or ``columns``): 1 where a row has it."""
    columns = sorted(set(labels)) if columns is None else columns
    return np.array([[1.0 if label == column else 0.0 for column in columns] for label in labels])


def _knees(observations: Sequence[StepObservation], widths: CapturedWidths) -> list[float | None]:
    """Where a knee could sit: none, or at or between the verified widths measured, inside their range."""
    measured = sorted({padded(o.concurrency * (k + 1), widths.at(k)) for o in observations
                       for k in [o.cell.num_speculative_tokens]})  # fmt: skip
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
    spread_df: float


def _fit_components(
    y: np.ndarray,
    se: np.ndarray,
    z_starts: Sequence[np.ndarray],
    z_cells: Sequence[np.ndarray],
    design: Design,
    prior: RunNoisePrior,
    tau_prior: RunNoisePrior,
    knee: float | None,
    log_sd: np.ndarray | None = None,
    shared_start: SharedStart | None = None,
) -> _Fit:
    """Variance components by their restricted marginal likelihood times their priors; the mean by
    generalised least squares given them. ``z_starts``: the start effect's parts (sigma_start is
    their sizes together, a priori the start prior's), ``z_cells``: one block of cell columns per
    tau (one per workload). A part of the step the measurements cannot tell from the others (every level at
    one concurrency: a sequence's cost from a step's) is left out, at zero cost: the measured
    cells carry it, and an unmeasured one's deviation carries what it misses. ``shared_start``
    holds sigma_start (and its degrees of freedom) where every workload estimated it."""
    full = design
    kept = independent_columns(full.features)
    design = dataclasses.replace(full, features=full.features[:, kept])
    scale = np.maximum(design.features.max(axis=0), 1e-12)
    p = design.features.shape[1]
    outers = [z @ z.T for z in (*z_starts, *z_cells)]
    n_start = len(z_starts)  # the parts share the start prior: their total is a priori the engine's usual
    part_prior = dataclasses.replace(prior, relative_sd=prior.relative_sd / math.sqrt(n_start))
    z_cell = np.hstack(list(z_cells))
    warm: list[np.ndarray] = []

    def covariance(log_sd: np.ndarray) -> np.ndarray:
        v: np.ndarray = np.diag(se**2)
        for sd, outer in zip(np.exp(log_sd), outers, strict=True):
            v = v + sd * sd * outer
        return v

    def objective(log_sd: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float]:
        # restricted (the mean's information in), and plain marginal: only the plain one compares means
        v = covariance(log_sd)
        params, info, unscale = _gls(y, v, design, scale, warm[-1] if warm else None)
        warm.append(params)
        resid = y - np.log(np.maximum(mu(design, params[:p] / scale, params[p:]), 1e-12))
        _, logdet = np.linalg.slogdet(v)
        scaled_info = info / np.outer(unscale, unscale)  # of (theta * scale, gamma): well conditioned
        _, logdet_info = np.linalg.slogdet(scaled_info)
        value = 0.5 * (resid @ np.linalg.solve(v, resid) + logdet)
        for i, log_part in enumerate(log_sd):
            value -= _log_scaled_inv_chi2(math.exp(log_part), part_prior if i < n_start else tau_prior)
        return float(value + 0.5 * logdet_info), params, scaled_info, float(value)

    def criterion(z: np.ndarray) -> float:
        return objective(np.clip(z, math.log(1e-4), 0.0))[0]

    optimised = log_sd is None
    if log_sd is None and shared_start is not None:  # one start part, one tau, sigma_start held
        held = math.log(max(shared_start.sd, 1e-4))
        found = optimize.minimize_scalar(
            lambda t: criterion(np.array([held, t])), bounds=(math.log(1e-4), 0.0), method="bounded",
            options={"xatol": 0.02},
        )  # fmt: skip
        log_sd = np.array([held, float(found.x)])
    elif log_sd is None:
        result = optimize.minimize(
            criterion, np.log([*[part_prior.relative_sd] * n_start, *[tau_prior.relative_sd] * len(z_cells)]),
            method="Nelder-Mead", options={"xatol": 0.05, "fatol": 1e-3, "maxiter": 40 * len(outers)},
        )  # fmt: skip
        log_sd = result.x
    log_sd = np.clip(log_sd, math.log(1e-4), 0.0)
    _, params, scaled_info, value = objective(log_sd)
    if not optimised:
        spread_df = math.inf
    elif shared_start is not None:
        spread_df = shared_start.df
    else:
        spread_df = _spread_df(criterion, log_sd, n_start, prior.df)
    theta, gamma = params[:p] / scale, params[p:]
    v = covariance(log_sd)
    resid = y - np.log(np.maximum(mu(design, theta, gamma), 1e-12))
    # each cell column's tau^2: its workload's
    tau2 = np.concatenate(
        [np.full(z.shape[1], math.exp(2 * t)) for z, t in zip(z_cells, log_sd[n_start:], strict=True)]
    )
    v_inv = np.linalg.inv(v)
    gain = tau2[:, None] * (z_cell.T @ v_inv)
    deviation_cov = np.diag(tau2) - gain @ z_cell * tau2[None, :]
    covariance_params = np.linalg.inv(scaled_info)
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
        start_sd=math.sqrt(float(np.sum(np.exp(2 * log_sd[:n_start])))),
        cell_sd=math.exp(log_sd[n_start]),  # the first workload's: a fit of one workload has one
        deviation=gain @ resid,
        deviation_cov=(deviation_cov + deviation_cov.T) / 2,
        gain=gain,
        spread_df=spread_df,
    )


def _spread_df(criterion: Callable[[np.ndarray], float], at: np.ndarray, n_start: int, prior_df: float) -> float:
    """The degrees of freedom the start-to-start spread is known with: nu = 1 / (2 var(log sigma_start)),
    var from the criterion's curvature in the log sds (a chi-square estimate of a variance on nu
    degrees of freedom has var(log sigma) = 1 / (2 nu)); sigma_start of parts, by the delta method
    (d log sigma_start / d log part = the part's share of sigma_start^2). Never below the prior's
    own, never above 200."""
    cov = inverse_hessian(criterion, at, [(math.log(1e-4), 0.0)] * at.size)
    parts = np.exp(2 * at[:n_start])
    grad = np.concatenate([parts / parts.sum(), np.zeros(at.size - n_start)])
    var = max(float(grad @ cov @ grad), 1e-12)
    return float(min(max(1.0 / (2.0 * var), prior_df), 200.0))


def _gls(
    y: np.ndarray, v: np.ndarray, design: Design, scale: np.ndarray, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """theta >= 0 and gamma by Gauss-Newton on log mu against y under covariance v, with theta's
    ridge (each part a priori within ``RIDGE_SD`` whole steps) and gamma's normal priors; returns
    them and the information matrix (the Hessian of the criterion) in the features' own units."""
    x, g = design.features / scale, design.sampled
    p, q = x.shape[1], g.shape[1]
    chol = np.linalg.cholesky(np.linalg.inv(v))
    prior_sd = design.prior_sd if design.prior_sd is not None else np.full(q, GAMMA_PRIOR_SD)
    prior_mean = design.prior_mean if design.prior_mean is not None else np.zeros(q)
    mean_t = math.exp(float(np.mean(y)))
    if start is None:
        start = np.concatenate([[mean_t], np.zeros(p - 1 + q)])
    params = start.copy()
    prior_rows = np.vstack([
        np.column_stack([np.eye(p) / (RIDGE_SD * mean_t), np.zeros((p, q))]),
        np.column_stack([np.zeros((q, p)), np.diag(1.0 / prior_sd)]),
    ])  # fmt: skip
    for _ in range(20):
        jac = _jacobian(x, g, params, p)
        target = y - np.log(np.maximum(mu(Design(x, g), params[:p], params[p:]), 1e-12)) + jac @ params
        rhs = np.concatenate([chol.T @ target, np.zeros(p), prior_mean / prior_sd])
        new = bounded_lstsq(np.vstack([chol.T @ jac, prior_rows]), rhs, p)
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


def _log_scaled_inv_chi2(sd: float, prior: RunNoisePrior) -> float:
    """log density of the variance sd^2 under a scaled-inverse-chi-square prior (up to a constant),
    as a density of log sd."""
    nu, s2, var = prior.df, prior.relative_sd**2, sd * sd
    return -(nu / 2) * math.log(var) - nu * s2 / (2 * var)
