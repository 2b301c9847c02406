"""Net tokens per second against draft length: step time from measured rates, rate for any k.

An observation is one measured level: aggregate output tok/s at draft length k (0 = speculation
off) and concurrency B, with the tokens per step E measured in the same window. B streams each
emit E tokens per step, so the effective step time is T = B * E / rate. T depends on the server
and drafter, not on the text, so observations of every workload pool into one step-time curve
per (concurrency, drafter); a workload's acceptance then turns T into its rate:
R(k, B) = B * E_w(k) / T(k, B).

Step time per (B, drafter), measured points first:

- at a measured k, T is the weighted mean of its observations (graph-capture sizes make T
  step-shaped, so a measured point beats a line);
- elsewhere a line T = a + b k by weighted least squares on relative residuals (rate noise is
  roughly proportional to the rate), with b >= 0;
- with exactly two draft lengths the line has no residual degrees of freedom, so its noise is
  borrowed from the other fits (pooled relative sd);
- with one draft length the slope is unknown: its point is the line through the off point at
  the same B (all drafting cost charged per position, a cautious guess) or, without one, half
  the measured T per position; draws spread it uniformly between flat and twice that. The band
  is wide and says so.
- with the run-to-run noise known, greedy and probabilistic drafting of one method share one line
  with one factor between them where their points fit it (``_joint_lines``).
- a line fitted through exactly three draft lengths cannot be tested for a bend: at a measured k
  the step time is the line and the measurement, each weighed by its variance, a bend's being
  ``BEND_SD`` (``StepTimeFit.line_share``). Noisy starts lean on the line that pools them,
  steady ones on what they measured.
- a drafter that looks its drafts up in the text (the engine's vocabulary says which) drafts only
  where the text matches: its step time is no line in k, so its measured points always stand for
  themselves and the line serves only the draft lengths not measured.
- a drafter whose points misfit their line, but fit it once one draft length measured in a single
  start is left out (and no other single one would do): the line is fitted without it, and that
  draft length (a lone start) is an unlucky start or a real step. One start cannot say which, so
  its draws take the line or its measurement at even odds, and a repeat is what settles it.

Rates for any k from these fits with acceptance draws: analysis/rates.py.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from scipy import stats

from specsweep.analysis.drafters import OFF, Candidate, Drafter, candidate_of
from specsweep.errors import FitError
from specsweep.types import MeasuredConfig

FALLBACK_RELATIVE_SD = 0.07  # run-to-run spread of the user report's three single-stream runs
LINE_FIT_LEVEL = 0.95  # a line misfits its points when their lack-of-fit chi-square is above this quantile
BEND_SD = 0.02  # relative miss of a line through three draft lengths that a padded far one can hide at the short ones

Weighed = TypeVar("Weighed", float, np.ndarray)  # a step time or its draws


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputObservation:
    """One measured level: rate and tokens per step at (k, concurrency, drafter)."""

    num_speculative_tokens: int  # 0 = speculation off
    concurrency: int
    output_tokens_per_s: float  # aggregate, client side
    tokens_per_step: float = 1.0  # E measured in the same window (1 with speculation off)
    drafter: Drafter | None = None
    workload: str = ""
    weight: float = 1.0  # relative trust in the line fit, e.g. requests measured

    @property
    def step_time_s(self) -> float:
        return self.concurrency * self.tokens_per_step / self.output_tokens_per_s


def study_observations(configs: Sequence[MeasuredConfig], workload: str) -> list[ThroughputObservation]:
    """Every measured level of one workload as a throughput observation, weighted by its requests
    (a per-batch-size table gives each level the k it ran). The search and the report both build
    their step-time models from these."""
    out = []
    for config in configs:
        for concurrency, row in config.results.get(workload, {}).items():
            rate = row.output_tokens_per_s
            if not rate or rate <= 0:
                continue
            candidate = candidate_of(config.spec, concurrency)
            tokens_per_step = 1.0
            if not candidate.off:
                length = row.mean_acceptance_length
                if not length:
                    continue  # drafted but no acceptance: its step time is unknown
                tokens_per_step = float(length)
            out.append(
                ThroughputObservation(
                    num_speculative_tokens=candidate.num_speculative_tokens,
                    concurrency=concurrency,
                    output_tokens_per_s=float(rate),
                    tokens_per_step=tokens_per_step,
                    drafter=candidate.drafter,
                    workload=workload,
                    weight=float(row.requests or 1),
                )
            )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimePoint:
    """Measured step time at one k: weighted mean over its observations."""

    num_speculative_tokens: int
    step_time_s: float
    observations: int
    weight: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeFit:
    """Step time against k at one concurrency for one drafter (or for speculation off)."""

    concurrency: int
    drafter: Drafter | None
    points: tuple[StepTimePoint, ...]
    intercept_s: float
    slope_s_per_token: float
    covariance: tuple[tuple[float, float], tuple[float, float]]  # of (intercept, slope), relative noise folded in
    relative_sd: float  # noise of one observation's step time, as a fraction
    residual_df: int
    basis: str  # how the line was obtained, for the report
    wide_band: bool
    # The line through four or more draft lengths agrees with their measured means within the
    # noise (through three: ``bend_untested``): it is then the better estimate at a measured k too
    # (it pools every start). Where it misfits (graph-capture steps, a drafter that drafts only
    # where the text matches), each measured point stands for itself.
    line_fits: bool = False
    # The same test failed: the measured means are off the line by more than the run-to-run noise.
    misfit: bool = False
    # The drafter looks its drafts up in the text: no line in k whatever the test says (misfit too).
    looks_up: bool = False
    shaped_like: Drafter | None = None  # measured at one draft length, shaped like this sibling's line
    # One line for both draft samplings of a method: this drafter's steps are ``sibling_factor``
    # times those of ``scaled_from``, whose line pools both. ``joint_covariance`` is that of
    # (intercept, slope, log factor) fitted together: the factor is confounded with the line the
    # other drafter's points pin, so it is drawn with it (``joint_step_time_draws``).
    scaled_from: Drafter | None = None
    sibling_factor: float = 1.0
    joint_covariance: tuple[tuple[float, ...], ...] = ()
    # Both draft samplings on one factor, through three draft lengths (too few to test their line
    # for a bend): at each measured k, the mean of both samplings' starts there in this drafter's
    # step units, which ``step_time_s`` weighs against the line.
    pooled_points: tuple[StepTimePoint, ...] = ()
    # The line fits three draft lengths, too few to test it for a bend: at a measured k the step
    # time is the line and the measurement weighed by their variances (``line_share``).
    bend_untested: bool = False
    # The draft length of a lone start that breaks the line: the other draft lengths fit a line
    # without it, and one start cannot tell an unlucky start from a real step there. Its draws take
    # that line or its own measurement at even odds, so a repeat of it is valued as what settles it.
    lone_start_k: int | None = None

    @property
    def sibling_factor_sd(self) -> float:
        """Relative sd of the factor to ``scaled_from`` (0 when the drafter has its own line)."""
        return math.sqrt(self.joint_covariance[2][2]) if self.joint_covariance else 0.0

    @property
    def lone_start(self) -> StepTimePoint | None:
        """The point measured in the lone start, if there is one."""
        return next((p for p in self.points if p.num_speculative_tokens == self.lone_start_k), None)

    def step_time_s(self, k: int) -> tuple[float, str]:
        """Point T(k) and where it came from ("measured": k was measured, by this drafter or, on one
        factor, by its sibling in the same steps; or "line")."""
        line = max(self.intercept_s + self.slope_s_per_token * k, 1e-9)
        point = self.point_at(k)
        if point is None:
            return line, "line"
        if self.line_fits:
            return line, "measured"
        return (self.weighed(point, line, point.step_time_s) if self.bend_untested else point.step_time_s), "measured"

    def point_at(self, k: int) -> StepTimePoint | None:
        """The measured point at k: both samplings' starts where they share a factor, else this drafter's."""
        return next((p for p in (*self.pooled_points, *self.points) if p.num_speculative_tokens == k), None)

    def line_share(self, point: StepTimePoint) -> float:
        """Where a line through three draft lengths cannot be tested for a bend: the weight of the
        line at a measured point, its noise variance over that plus a bend's (``BEND_SD``). Noisy
        starts lean on the line that pools them; steady ones on what they measured."""
        variance = self.relative_sd**2 / point.observations
        return variance / (variance + BEND_SD**2)

    def weighed(self, point: StepTimePoint, line: Weighed, measured: Weighed) -> Weighed:
        """The line and the measurement at ``point`` (values or draws), weighed by ``line_share``."""
        share = self.line_share(point)
        return share * line + (1 - share) * measured


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputModel:
    """Step-time fits for every measured (concurrency, drafter), and the observations behind them."""

    fits: tuple[StepTimeFit, ...]
    observations: tuple[ThroughputObservation, ...]
    pooled_relative_sd: float
    concurrency_levels: tuple[int, ...]

    def fit_for(self, concurrency: int, drafter: Drafter | None) -> StepTimeFit | None:
        for fit in self.fits:
            if fit.concurrency == concurrency and fit.drafter == drafter:
                return fit
        return None

    def measured_tokens_per_s(self, candidate: Candidate, *, concurrency: int, workload: str) -> float | None:
        """Mean measured rate of one configuration for a workload at a concurrency, if measured."""
        rates = [
            o.output_tokens_per_s
            for o in self.observations
            if o.concurrency == concurrency and o.workload == workload and _candidate(o) == candidate
        ]
        return float(np.mean(rates)) if rates else None


def _candidate(observation: ThroughputObservation) -> Candidate:
    if observation.num_speculative_tokens == 0 or observation.drafter is None:
        return OFF
    return Candidate(drafter=observation.drafter, num_speculative_tokens=observation.num_speculative_tokens)


def fit_throughput_model(
    observations: Sequence[ThroughputObservation],
    *,
    fallback_relative_sd: float = FALLBACK_RELATIVE_SD,
    run_noise: tuple[float, int] | None = None,
    lookups: Collection[Drafter] = (),
) -> ThroughputModel:
    """Step time per (concurrency, drafter) from measured rates. FitError when nothing is usable.

    ``run_noise``: (relative sd, degrees of freedom) of one measurement from server starts of the
    same configuration (analysis/noise.py). When given it is the model's pooled noise: a measured
    point is as good as a repeat says, whatever misfit a line across draft lengths shows (a
    line's own residuals still widen its band where they are larger).

    ``lookups``: drafters that look their drafts up in the text (the engine's vocabulary says
    which). They draft only where the text matches, so their step time is no line in k whatever a
    noise test says: their measured points always stand for themselves."""
    usable = []
    for o in observations:
        values = (o.output_tokens_per_s, o.tokens_per_step, o.weight)
        if o.concurrency < 1 or o.num_speculative_tokens < 0 or not all(math.isfinite(v) and v > 0 for v in values):
            raise FitError(
                f"observation at k={o.num_speculative_tokens}, concurrency {o.concurrency} needs a positive "
                "rate, tokens per step and weight; leave out levels that produced no tokens."
            )
        usable.append(o)
    if not usable:
        raise FitError("no throughput observations: measure at least one configuration.")
    groups: dict[tuple[int, Drafter | None], list[ThroughputObservation]] = {}
    for o in usable:
        key = (o.concurrency, None if _candidate(o).off else o.drafter)
        groups.setdefault(key, []).append(o)
    points = {key: _points(group) for key, group in groups.items()}
    (pooled, pooled_df), fits = run_noise or _pooled_sd(points, fallback_relative_sd), []
    order = sorted(points.items(), key=lambda kv: (kv[0][0], _order(kv[0][1])))
    # Lines through two or more draft lengths first: a drafter measured at one draft length takes
    # the shape of its sibling's (the same method, the other draft sampling) where it has one.
    lines: dict[tuple[int, Drafter | None], StepTimeFit] = {}
    if run_noise is not None:
        lines.update(_joint_lines(points, pooled, pooled_df))
    for (concurrency, drafter), pts in order:
        if (concurrency, drafter) in lines:
            continue
        if drafter is None or len({p.num_speculative_tokens for p, _, _ in pts}) >= 2:
            off_points = points.get((concurrency, None)) if drafter is not None else None
            lines[(concurrency, drafter)] = _fit_line(
                concurrency, drafter, pts, off_points, pooled, pooled_df, pool=run_noise is not None,
                looks_up=drafter in lookups,
            )  # fmt: skip
    for (concurrency, drafter), pts in order:
        if (concurrency, drafter) in lines:
            continue
        sibling = next(
            (
                fit
                for (level, other), fit in lines.items()
                if level == concurrency and other is not None and drafter is not None
                and other.method == drafter.method and other != drafter and not fit.wide_band and fit.intercept_s > 0
            ),
            None,
        )  # fmt: skip
        if sibling is not None:
            lines[(concurrency, drafter)] = _shaped_like(sibling, drafter, pts[0][0], pooled, pooled_df)
        else:
            off_points = points.get((concurrency, None))
            lines[(concurrency, drafter)] = _fit_line(
                concurrency, drafter, pts, off_points, pooled, pooled_df, pool=run_noise is not None
            )
    fits = [lines[key] for key, _ in order]
    return ThroughputModel(
        fits=tuple(fits),
        observations=tuple(usable),
        pooled_relative_sd=pooled,
        concurrency_levels=tuple(sorted({o.concurrency for o in usable})),
    )


def _order(drafter: Drafter | None) -> tuple[str, str]:
    """Speculation off first, then the drafters in their order."""
    return ("", "") if drafter is None else (drafter.method, drafter.draft_sample_method)


def _points(group: list[ThroughputObservation]) -> list[tuple[StepTimePoint, np.ndarray, np.ndarray]]:
    """Per k: the point, and the raw step times and weights behind it."""
    out = []
    for k in sorted({o.num_speculative_tokens for o in group}):
        at_k = [o for o in group if o.num_speculative_tokens == k]
        times = np.array([o.step_time_s for o in at_k])
        weights = np.array([o.weight for o in at_k])
        point = StepTimePoint(
            num_speculative_tokens=k,
            step_time_s=float(np.average(times, weights=weights)),
            observations=len(at_k),
            weight=float(weights.sum()),
        )
        out.append((point, times, weights))
    return out


def _wls(ks: np.ndarray, times: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(a, b), (X'WX)^-1, weighted sum of squared relative residuals, residual df; b >= 0."""
    w = weights / np.mean(weights) / times**2
    design = np.column_stack([np.ones_like(ks), ks])
    normal = design.T @ (design * w[:, None])
    coef = np.linalg.solve(normal, design.T @ (w * times))
    if coef[1] < 0:  # step time cannot fall with k: a flat line instead
        coef = np.array([np.sum(w * times) / np.sum(w), 0.0])
    residual = float(np.sum(w * (times - design @ coef) ** 2))
    return coef, np.linalg.inv(normal), residual, ks.size - 2


def _pooled_sd(
    points: Mapping[tuple[int, Drafter | None], list[tuple[StepTimePoint, np.ndarray, np.ndarray]]], fallback: float
) -> tuple[float, int]:
    """Relative sd of one observation, pooled over every fit with residual degrees of freedom,
    and those degrees of freedom (0 with the fallback)."""
    total, df = 0.0, 0
    for pts in points.values():
        ks, times, weights = _stack(pts)
        if np.unique(ks).size >= 2 and ks.size > 2:
            _, _, residual, dof = _wls(ks, times, weights)
            total, df = total + residual, df + dof
        elif np.unique(ks).size == 1 and ks.size >= 2:  # repeats at one k
            w = weights / np.mean(weights)
            mean = np.average(times, weights=w)
            total, df = total + float(np.sum(w * ((times - mean) / mean) ** 2)), df + ks.size - 1
    return (math.sqrt(total / df), df) if df > 0 else (fallback, 0)


def _stack(pts: list[tuple[StepTimePoint, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ks = np.concatenate([np.full(t.size, p.num_speculative_tokens, dtype=float) for p, t, _ in pts])
    return ks, np.concatenate([t for _, t, _ in pts]), np.concatenate([w for _, _, w in pts])


def _fit_line(
    concurrency: int,
    drafter: Drafter | None,
    pts: list[tuple[StepTimePoint, np.ndarray, np.ndarray]],
    off_points: list[tuple[StepTimePoint, np.ndarray, np.ndarray]] | None,
    pooled: float,
    pooled_df: int,
    *,
    pool: bool = False,
    looks_up: bool = False,
) -> StepTimeFit:
    """One line; its noise is the study's pooled noise (one measurement noise for the whole
    study, estimated from every fit's residuals), or the line's own when that is larger. A drafter
    that ``looks_up`` its drafts is never a line in k: its measured points stand for themselves."""
    ks, times, weights = _stack(pts)
    points = tuple(p for p, _, _ in pts)
    if drafter is None:  # speculation off: measured only, nothing to extrapolate
        t0 = points[0].step_time_s
        return _record(
            concurrency, None, points, t0, 0.0, np.zeros((2, 2)), pooled, pooled_df, "measured; no draft length to fit",
            False,
        )  # fmt: skip
    if np.unique(ks).size >= 2:
        coef, inverse, residual, own_df = _wls(ks, times, weights)
        sd = max(math.sqrt(residual / own_df), pooled) if own_df > 0 else pooled
        # Only a known run-to-run noise can say a line fits its points: the fallback's 7% would pass
        # a step-shaped T as a line and overwrite what was measured.
        consistent = pool and not looks_up and _line_fits(points, coef, pooled)
        fits = consistent and _bend_testable(points)
        misfit = pool and len(points) >= 3 and not consistent
        lone = _lone_start(pts, pooled) if misfit and not looks_up else None
        if looks_up and len(points) >= 3:
            basis = (
                f"weighted least squares over {len(points)} draft lengths; the drafter looks its drafts up, so its "
                "step time is no line in k: measured points stand for themselves"
            )
            fit = _record(concurrency, drafter, points, coef[0], coef[1], inverse * sd**2, sd, pooled_df, basis, False)
            return replace(fit, misfit=pool, looks_up=True)
        if lone is not None:
            coef, inverse, residual, own_df = _wls(*_stack([e for e in pts if e[0] is not lone]))
            sd = max(math.sqrt(residual / own_df), pooled) if own_df > 0 else pooled
            basis = (
                f"weighted least squares over {len(points) - 1} draft lengths, which fit it, and k="
                f"{lone.num_speculative_tokens} measured in one start {_miss(lone, coef):+.0%} off it: an unlucky "
                "start or a real step, at even odds until a repeat tells; measured points stand for themselves"
            )
            fit = _record(concurrency, drafter, points, coef[0], coef[1], inverse * sd**2, sd, pooled_df, basis, False)
            return replace(fit, misfit=True, lone_start_k=lone.num_speculative_tokens)
        if len(points) < 3 or not pool:
            basis = (
                f"weighted least squares over {len(points)} draft lengths"
                if len(points) >= 3
                else "line through two draft lengths; noise from the other fits"
            )
        elif fits:
            basis = f"weighted least squares over {len(points)} draft lengths (they fit it: the line is used at each)"
        elif consistent:
            basis = (
                f"weighted least squares over {len(points)} draft lengths, which fit it, too few to test it for a "
                "bend: at a measured k the line and the measurement are weighed by the noise"
            )
        else:
            basis = (
                f"weighted least squares over {len(points)} draft lengths, which misfit it beyond the noise: "
                "measured points stand for themselves"
            )
        fit = _record(
            concurrency, drafter, points, coef[0], coef[1], inverse * sd**2, sd, pooled_df, basis, False, fits
        )
        return replace(fit, misfit=misfit, bend_untested=consistent and not fits)
    k1, t1 = points[0].num_speculative_tokens, points[0].step_time_s
    if off_points:
        slope = max((t1 - off_points[0][0].step_time_s) / k1, 0.0)
        basis = "one draft length: slope through the off point, drawn between flat and twice that"
    else:
        slope = t1 / (2 * k1)
        basis = "one draft length, no off point: slope drawn between flat and proportional to k"
    # For one-point fits the covariance holds the slope's uniform spread (variance of U[0, 2b]).
    covariance = np.array([[0.0, 0.0], [0.0, slope**2 / 3]])
    return _record(concurrency, drafter, points, t1 - slope * k1, slope, covariance, pooled, pooled_df, basis, True)


def _joint_lines(
    points: Mapping[tuple[int, Drafter | None], list[tuple[StepTimePoint, np.ndarray, np.ndarray]]],
    pooled: float,
    pooled_df: int,
) -> dict[tuple[int, Drafter | None], StepTimeFit]:
    """One line per (concurrency, method) through both draft samplings, where both were measured
    at a common draft length and the pooled points fit it within the run-to-run noise.

    Greedy and probabilistic drafting run the same draft and verify passes; sampling the drafts
    stochastically costs the same share of every step, so T_p(k) = c T_g(k) with one factor c per
    level (the assumption analysis/noise.py reads sibling pairs by). c is the weighted mean log
    ratio at the draft lengths both measured; the probabilistic points divided by it join the
    greedy ones in one line, so each start informs every draft length of both, and one unlucky
    start no longer decides a configuration on its own. Where the pooled points misfit (their
    chi-square above the 95th percentile, K - 3 degrees of freedom: the line and the factor),
    each drafter keeps its own fit. Over exactly three draft lengths (too few to test the line for
    a bend, ``_bend_testable``) the two keep the factor, and at each measured k the mean of both
    samplings' starts there is weighed against the line (``StepTimeFit.line_share``)."""
    out: dict[tuple[int, Drafter | None], StepTimeFit] = {}
    for (concurrency, greedy), g_pts in points.items():
        if greedy is None or greedy.draft_sample_method != "greedy":
            continue
        stochastic = Drafter(method=greedy.method, draft_sample_method="probabilistic")
        p_pts = points.get((concurrency, stochastic))
        if not p_pts:
            continue
        g_at = {p.num_speculative_tokens: p for p, _, _ in g_pts}
        shared = [(g_at[p.num_speculative_tokens], p) for p, _, _ in p_pts if p.num_speculative_tokens in g_at]
        if not shared:
            continue
        if len({p.num_speculative_tokens for p, _, _ in [*g_pts, *p_pts]}) < 3:
            continue
        # A start from the log ratios where both were measured, then the factor and the line in turn:
        # the factor is the probabilistic points' mean log ratio to the line that the greedy and the
        # scaled probabilistic points fit (a fixed point in a few rounds).
        weights = [1 / (1 / g.observations + 1 / p.observations) for g, p in shared]
        log_c = sum(w * math.log(p.step_time_s / g.step_time_s) for w, (g, p) in zip(weights, shared, strict=True))
        log_c /= sum(weights)
        starts_p = sum(p.observations for p, _, _ in p_pts)
        for _ in range(20):
            coef, _, _, _ = _wls(*_stack(_scaled_join(g_pts, p_pts, math.exp(log_c))))
            lines_at = [(p, coef[0] + coef[1] * p.num_speculative_tokens) for p, _, _ in p_pts]
            if min(line for _, line in lines_at) <= 0:
                break
            updated = sum(p.observations * math.log(p.step_time_s / line) for p, line in lines_at) / starts_p
            converged = abs(updated - log_c) < 1e-9
            log_c = updated
            if converged:
                break
        factor = math.exp(log_c)
        joint = _scaled_join(g_pts, p_pts, factor)
        coef, _, residual, own_df = _wls(*_stack(joint))
        if not _line_fits([p for p, _, _ in joint], coef, pooled, extra_parameters=1):
            continue
        sd = max(math.sqrt(residual / (own_df - 1)), pooled) if own_df > 1 else pooled
        covariance = _joint_covariance(g_pts, p_pts, coef) * sd**2
        # the probabilistic line (c a, c b) from (a, b, log c), by the delta method
        scale = np.array([[factor, 0.0, factor * coef[0]], [0.0, factor, factor * coef[1]]])
        starts = sum(p.observations for p, _, _ in joint)
        testable = _bend_testable([p for p, _, _ in joint])
        if testable:
            basis = (
                f"one line through both draft samplings of {greedy.method} ({len(joint)} points, {starts} starts; "
                f"probabilistic steps x{factor:.3f}): it fits them, so it is used at each k"
            )
            per_k: tuple[StepTimePoint, ...] = ()
        else:
            basis = (
                f"one factor between both draft samplings of {greedy.method} ({len(joint)} points, {starts} starts; "
                f"probabilistic steps x{factor:.3f}); three draft lengths are too few to test their line for a "
                "bend, so at a measured k the line and the mean of both samplings' starts there are weighed by the "
                "noise"
            )
            per_k = _pooled_per_k(joint)
        g_fit = _record(
            concurrency, greedy, tuple(p for p, _, _ in g_pts), coef[0], coef[1], covariance[:2, :2], sd, pooled_df,
            basis, False, testable,
        )  # fmt: skip
        p_fit = _record(
            concurrency, stochastic, tuple(p for p, _, _ in p_pts), coef[0] * factor, coef[1] * factor,
            scale @ covariance @ scale.T, sd, pooled_df, basis, False, testable,
        )  # fmt: skip
        out[(concurrency, greedy)] = replace(g_fit, pooled_points=per_k, bend_untested=not testable)
        out[(concurrency, stochastic)] = replace(
            p_fit,
            bend_untested=not testable,
            pooled_points=tuple(replace(p, step_time_s=p.step_time_s * factor) for p in per_k),
            scaled_from=greedy,
            sibling_factor=factor,
            joint_covariance=tuple(tuple(float(v) for v in row) for row in covariance),
        )
    return out


def _pooled_per_k(joint: list[tuple[StepTimePoint, np.ndarray, np.ndarray]]) -> tuple[StepTimePoint, ...]:
    """Per draft length, the weighted mean of every start in ``joint`` (greedy points and the
    probabilistic ones in greedy units) at it: one point per k with the starts of both."""
    out = []
    for k in sorted({p.num_speculative_tokens for p, _, _ in joint}):
        at_k = [(p, t, w) for p, t, w in joint if p.num_speculative_tokens == k]
        times, weights = np.concatenate([t for _, t, _ in at_k]), np.concatenate([w for _, _, w in at_k])
        out.append(
            StepTimePoint(
                num_speculative_tokens=k,
                step_time_s=float(np.average(times, weights=weights)),
                observations=sum(p.observations for p, _, _ in at_k),
                weight=float(weights.sum()),
            )
        )
    return tuple(out)


def _joint_covariance(
    greedy: list[tuple[StepTimePoint, np.ndarray, np.ndarray]],
    stochastic: list[tuple[StepTimePoint, np.ndarray, np.ndarray]],
    coef: np.ndarray,
) -> np.ndarray:
    """(J'WJ)^-1 of (a, b, log c) for log T = log(a + b k) + log c [probabilistic], over every start
    of both drafters with their relative weights: the covariance per unit relative noise. The
    factor and the line are fitted from the same starts, so the factor is only as sure as the line
    is where the probabilistic starts sit; the noise over the root of their count leaves that out."""
    rows, weights = [], []
    for is_stochastic, pts in ((0.0, greedy), (1.0, stochastic)):
        for point, _, w in pts:
            line = coef[0] + coef[1] * point.num_speculative_tokens
            for weight in w:
                rows.append([1 / line, point.num_speculative_tokens / line, is_stochastic])
                weights.append(weight)
    design, w = np.array(rows), np.array(weights) / np.mean(weights)
    return np.linalg.inv(design.T @ (design * w[:, None]))


def _scaled_join(
    greedy: list[tuple[StepTimePoint, np.ndarray, np.ndarray]],
    stochastic: list[tuple[StepTimePoint, np.ndarray, np.ndarray]],
    factor: float,
) -> list[tuple[StepTimePoint, np.ndarray, np.ndarray]]:
    """The greedy points and the probabilistic ones divided by ``factor``: one drafter's points."""
    scaled = [(replace(p, step_time_s=p.step_time_s / factor), times / factor, w) for p, times, w in stochastic]
    return [*greedy, *scaled]


def _shaped_like(
    sibling: StepTimeFit, drafter: Drafter | None, anchor: StepTimePoint, pooled: float, pooled_df: int
) -> StepTimeFit:
    """A drafter measured at one draft length k1, shaped like its sibling's line through two or more:
    T(k) = T(k1) (1 + r k) / (1 + r k1) with the sibling's relative slope r = b / a.

    Drawing the drafts another way changes every step by a near-constant share (sampling work,
    the draft probabilities the verifier reads), so the relative slope carries over. Its
    covariance, by the delta method, holds the anchor's noise (the pooled noise over the square
    root of its observations) and the sibling's uncertainty of r."""
    k1, t1 = anchor.num_speculative_tokens, anchor.step_time_s
    a, b = sibling.intercept_s, sibling.slope_s_per_token
    (vaa, vab), (_, vbb) = sibling.covariance
    r = b / a
    var_r = max(vbb / a**2 - 2 * b * vab / a**3 + b**2 * vaa / a**4, 0.0)
    var_t = (pooled * t1) ** 2 / anchor.observations
    d = 1 + r * k1
    jacobian = np.array([[1 / d, -t1 * k1 / d**2], [r / d, t1 / d**2]])
    covariance = jacobian @ np.diag([var_t, var_r]) @ jacobian.T
    label = sibling.drafter.label if sibling.drafter is not None else "its sibling"
    basis = f"one draft length, shaped like {label}'s line (the same step time per drafted token, relative)"
    fit = _record(
        sibling.concurrency, drafter, (anchor,), t1 / d, t1 * r / d, covariance, pooled, pooled_df, basis, False
    )
    return replace(fit, shaped_like=sibling.drafter)


def _lone_start(pts: list[tuple[StepTimePoint, np.ndarray, np.ndarray]], noise: float) -> StepTimePoint | None:
    """The one draft length, measured in a single start, without which the others (three or more)
    fit their line within the run-to-run ``noise``. None when no point does, or when more than one
    would: then the misfit is shape, not one start."""
    found = []
    for entry in pts:
        if entry[0].observations != 1:
            continue
        rest = [e for e in pts if e is not entry]
        if len(rest) >= 3 and _line_fits([p for p, _, _ in rest], _wls(*_stack(rest))[0], noise):
            found.append(entry[0])
    return found[0] if len(found) == 1 else None


def _miss(point: StepTimePoint, coef: np.ndarray) -> float:
    """A point's relative miss from the line ``coef``."""
    line = coef[0] + coef[1] * point.num_speculative_tokens
    return point.step_time_s / line - 1 if line > 0 else math.inf


def _line_fits(points: Sequence[StepTimePoint], coef: np.ndarray, noise: float, *, extra_parameters: int = 0) -> bool:
    """Whether the measured means at three or more draft lengths agree with the line within the run-
    to-run noise: the chi-square of their relative misses (each over noise / sqrt(starts)) below its
    95th percentile with K - 2 degrees of freedom, fewer by ``extra_parameters`` fitted besides the
    line, and, over four or more draft lengths, no bend upward beyond the noise (``_curvature_z``
    below the one-sided 95th percentile). The bends known to matter are upward: a longer draft pads
    to a wider CUDA graph or turns a memory-bound verify pass compute-bound, and one far point on
    such a curve steepens the line at the short draft lengths by less than one start's noise at
    each point, which the chi-square over every point is too blunt to see."""
    df = len(points) - 2 - extra_parameters
    if len(points) < 3 or df < 1 or noise <= 0:
        return False
    chi2 = 0.0
    for p in points:
        line = coef[0] + coef[1] * p.num_speculative_tokens
        if line <= 0:
            return False
        chi2 += p.observations * ((p.step_time_s - line) / line / noise) ** 2
    if chi2 > float(stats.chi2.ppf(LINE_FIT_LEVEL, df)):
        return False
    return _curvature_z(points, noise) <= float(stats.norm.ppf(LINE_FIT_LEVEL))


def _bend_testable(points: Sequence[StepTimePoint]) -> bool:
    """Whether the points span four or more draft lengths, so a bend upward could show against the
    noise. Through three, a far draft length that pads to a wider graph steepens the line at the
    short ones and nothing can say so: the line then fills the gaps, and at a measured point it is
    weighed against the measurement (``StepTimeFit.line_share``) instead of replacing it."""
    return len({p.num_speculative_tokens for p in points}) >= 4


def _curvature_z(points: Sequence[StepTimePoint], noise: float) -> float:
    """z of the quadratic term c of T(k) = a + b k + c k^2, fitted on relative misses like the line,
    at the run-to-run ``noise``; 0 with fewer than four draft lengths (nothing left to test it)."""
    ks = np.array([p.num_speculative_tokens for p in points], dtype=float)
    if np.unique(ks).size < 4:
        return 0.0
    times = np.array([p.step_time_s for p in points])
    n = np.array([p.observations for p in points], dtype=float)
    design = np.column_stack([np.ones_like(ks), ks, ks**2])
    fitted = times
    for _ in range(3):  # relative noise: weights by the fitted time, refined
        w = n / fitted**2
        normal = design.T @ (design * w[:, None])
        coef = np.linalg.solve(normal, design.T @ (w * times))
        fitted = np.maximum(design @ coef, 1e-9)
    return float(coef[2] / (noise * math.sqrt(np.linalg.inv(normal)[2, 2])))


def _record(
    concurrency: int,
    drafter: Drafter | None,
    points: tuple[StepTimePoint, ...],
    a: float,
    b: float,
    covariance: np.ndarray,
    sd: float,
    df: int,
    basis: str,
    wide: bool,
    line_fits: bool = False,
) -> StepTimeFit:
    return StepTimeFit(
        concurrency=concurrency,
        drafter=drafter,
        points=points,
        intercept_s=float(a),
        slope_s_per_token=float(b),
        covariance=(
            (float(covariance[0, 0]), float(covariance[0, 1])),
            (float(covariance[1, 0]), float(covariance[1, 1])),
        ),
        relative_sd=float(sd),
        residual_df=int(df),
        basis=basis,
        wide_band=wide,
        line_fits=line_fits,
    )


def step_time_draws(
    fit: StepTimeFit,
    ks: Sequence[int],
    *,
    draws: int,
    rng: np.random.Generator,
    slope_share: np.ndarray | None = None,
) -> np.ndarray:
    """Draws of T at each k, shape (draws, len(ks)): measured points by their own noise, the line elsewhere.

    ``slope_share``: for a one-draft-length fit, where its unknown slope falls between flat (0)
    and twice the guess (1), per draw; siblings measured at one draft length each share it, as
    they share their shape (analysis/rates.py)."""
    out = np.empty((draws, len(ks)))
    # With the noise estimated from df residuals, deviations follow Student's t, not the normal.
    scale = np.sqrt(fit.residual_df / rng.chisquare(fit.residual_df, size=draws)) if fit.residual_df > 0 else 1.0
    if fit.wide_band:
        anchor = fit.points[0]
        t1 = anchor.step_time_s * (1 + fit.relative_sd / math.sqrt(anchor.observations) * rng.standard_normal(draws))
        share = rng.uniform(0.0, 1.0, size=draws) if slope_share is None else slope_share
        slope = 2 * fit.slope_s_per_token * share
        intercept = t1 - slope * anchor.num_speculative_tokens
    else:
        centre = np.array([fit.intercept_s, fit.slope_s_per_token])
        deviation = rng.multivariate_normal([0.0, 0.0], fit.covariance, size=draws, method="eigh")
        coef = centre + deviation * np.atleast_1d(scale)[:, None] if fit.residual_df > 0 else centre + deviation
        intercept, slope = coef[:, 0], np.maximum(coef[:, 1], 0.0)
    measured = {p.num_speculative_tokens: p for p in fit.points}
    for j, k in enumerate(ks):
        point = measured.get(k)
        if fit.wide_band and point is not None:
            out[:, j] = t1
        elif point is not None and not fit.line_fits:
            noise = fit.relative_sd / math.sqrt(point.observations)
            out[:, j] = point.step_time_s * (1 + noise * scale * rng.standard_normal(draws))
            if fit.bend_untested:
                out[:, j] = fit.weighed(point, intercept + slope * k, out[:, j])
            if k == fit.lone_start_k:  # an unlucky start or a real step: either, at even odds
                out[:, j] = np.where(rng.random(draws) < 0.5, intercept + slope * k, out[:, j])
        else:
            out[:, j] = intercept + slope * k
    return np.maximum(out, 1e-9)


def joint_step_time_draws(
    greedy: StepTimeFit, scaled: StepTimeFit, ks: Sequence[int], *, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draws of T at each k for both draft samplings on one line, each (draws, len(ks)): the line and
    the factor between them drawn together from ``scaled.joint_covariance``, Student's t as in
    ``step_time_draws``, so a draw whose line runs low has the factor that makes up for it. Where
    the line is untested for a bend (``pooled_points``), each measured k's draw is the line's
    weighed against a draw of its pooled starts' mean at their own noise
    (``StepTimeFit.line_share``), and the factor scales it to the other sampling."""
    centre = np.array([greedy.intercept_s, greedy.slope_s_per_token, math.log(scaled.sibling_factor)])
    deviation = rng.multivariate_normal(np.zeros(3), np.array(scaled.joint_covariance), size=draws, method="eigh")
    df = scaled.residual_df
    t_scale = np.sqrt(df / rng.chisquare(df, size=draws)) if df > 0 else np.ones(draws)
    coef = centre + deviation * t_scale[:, None]
    k = np.asarray(ks, dtype=float)
    line = coef[:, :1] + np.maximum(coef[:, 1:2], 0.0) * k
    pooled = {p.num_speculative_tokens: p for p in greedy.pooled_points}
    for j, kj in enumerate(ks):
        if (point := pooled.get(kj)) is not None:
            noise = greedy.relative_sd / math.sqrt(point.observations)
            measured = point.step_time_s * (1 + noise * t_scale * rng.standard_normal(draws))
            line[:, j] = greedy.weighed(point, line[:, j], measured)
    line = np.maximum(line, 1e-9)
    return line, line * np.exp(coef[:, 2:3])
