"""Net tokens per second for any k: acceptance draws times step-time draws.

R(k, B) = B * E(k) / T(k, B) (analysis/throughput.py). Draws: acceptance draws times step-time
draws, one joint draw index across every k and drafter at a concurrency, so differences between
k's are paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.fits import AcceptanceFit, band, per_position_draws, point_per_position
from specsweep.analysis.throughput import StepTimeFit, ThroughputModel, joint_step_time_draws, step_time_draws
from specsweep.errors import FitError


@dataclass(frozen=True, slots=True, kw_only=True)
class RateSample:
    """Point rates and joint draws for candidates at one concurrency (arrays: not for JSON)."""

    concurrency: int
    candidates: tuple[Candidate, ...]
    tokens_per_step: np.ndarray  # (candidates,)
    step_time_s: np.ndarray  # (candidates,)
    step_time_source: tuple[str, ...]
    tokens_per_s: np.ndarray  # (candidates,)
    draws: np.ndarray  # (draws, candidates), one joint draw per row


AcceptanceInput = AcceptanceFit | Sequence[float]


def sample_rates(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    k_min: int = 1,
    k_max: int | None = None,
    draws: int = 400,
    seed: int = 0,
    acceptance_scale: Mapping[Drafter, Mapping[int, float]] | None = None,
    workload: str | None = None,
) -> RateSample:
    """R(k) = B E_w(k) / T(k) for off and every drafter's k = k_min..k_max at one measured concurrency.

    ``acceptance`` gives each drafter's acceptance for the workload: an AcceptanceFit, or plain
    S_1..S_K taken as exact (no uncertainty, no extrapolation past K). ``acceptance_scale``
    multiplies a drafter's S_1 + ... + S_k at k (a drafter that drafts at some steps only, and
    at a share that depends on k: see rigs/model.py); a k it does not name keeps 1.
    ``workload``: the workload the model's observations and ``acceptance`` are both of, where they
    are; a misfitting drafter's measured configurations are then predicted at the rate they
    measured (a rig's model, measured on another workload, leaves it None).
    """
    rng = np.random.default_rng(seed)
    candidates: list[Candidate] = []
    e_point: list[float] = []
    t_point: list[float] = []
    sources: list[str] = []
    columns: list[np.ndarray] = []
    off = model.fit_for(concurrency, None)
    floor_draws: np.ndarray | float = 1e-9
    floor_point = 1e-9
    if off is not None:
        t, source = off.step_time_s(0)
        candidates.append(OFF)
        e_point.append(1.0)
        t_point.append(t)
        sources.append(source)
        off_draws = step_time_draws(off, [0], draws=draws, rng=rng)[:, 0]
        columns.append(concurrency / off_draws)
        # A step that drafts verifies at least what a step without drafting decodes: no line
        # (least of all a one-point fit with its drawn slope) may go below speculation off.
        floor_draws, floor_point = off_draws, t
    fits = {d: f for d in sorted(acceptance) if (f := model.fit_for(concurrency, d)) is not None}
    arrays = {d: _acceptance_arrays(acceptance[d], draws=draws, seed=int(rng.integers(2**31))) for d in fits}
    step_draws = _step_draws(fits, arrays, k_max=k_max, draws=draws, rng=rng)
    for drafter, fit in fits.items():
        s_point, s_draws = arrays[drafter]
        top = s_point.size if k_max is None else min(k_max, s_point.size)
        ks = list(range(max(k_min, 1), top + 1))
        if not ks:
            continue
        t_draws = np.maximum(np.column_stack([step_draws[drafter][k] for k in ks]), np.reshape(floor_draws, (-1, 1)))
        scale_of = (acceptance_scale or {}).get(drafter, {})
        scale = np.array([float(scale_of.get(k, 1.0)) for k in ks])
        e_draws = 1.0 + np.cumsum(s_draws[:, :top], axis=1)[:, top - len(ks) :] * scale
        e_points = 1.0 + np.cumsum(s_point[:top])[top - len(ks) :] * scale
        for j, k in enumerate(ks):
            t, source = fit.step_time_s(k)
            t = max(t, floor_point)
            candidate = Candidate(drafter=drafter, num_speculative_tokens=k)
            column = concurrency * e_draws[:, j] / t_draws[:, j]
            misfit_measured = (
                workload is not None and fit.misfit and source == "measured" and k != fit.lone_start_k
            )  # a lone start keeps the even odds of its step-time draws (analysis/throughput.py)
            measured = _measured_rate(model, fit, candidate, workload) if misfit_measured else None
            if measured is not None:
                # The model misfits this drafter here: a measured configuration is what it measured.
                rate, starts = measured
                t = concurrency * float(e_points[j]) / rate
                column = rate * (1 + fit.relative_sd / np.sqrt(starts) * rng.standard_normal(draws))
            candidates.append(candidate)
            e_point.append(float(e_points[j]))
            t_point.append(t)
            sources.append(source)
            columns.append(column)
    if not candidates:
        raise FitError(f"nothing was measured at concurrency {concurrency} for these drafters; measure it first.")
    e_arr, t_arr = np.array(e_point), np.array(t_point)
    return RateSample(
        concurrency=concurrency,
        candidates=tuple(candidates),
        tokens_per_step=e_arr,
        step_time_s=t_arr,
        step_time_source=tuple(sources),
        tokens_per_s=concurrency * e_arr / t_arr,
        draws=np.column_stack(columns),
    )


def _step_draws(
    fits: Mapping[Drafter, StepTimeFit],
    arrays: Mapping[Drafter, tuple[np.ndarray, np.ndarray]],
    *,
    k_max: int | None,
    draws: int,
    rng: np.random.Generator,
) -> dict[Drafter, dict[int, np.ndarray]]:
    """Step-time draws per drafter at k = 1 up to its longest draft or measured point.

    Siblings measured at one draft length each share the draw of where their unknown slope falls;
    a drafter shaped like its sibling's line (analysis/throughput.py) is drawn from the sibling's
    own draws, scaled to its anchor, so the two differ by one factor per draw, as they do; both
    draft samplings on one line are drawn together with the factor between them."""
    out: dict[Drafter, dict[int, np.ndarray]] = {}
    shares: dict[str, np.ndarray] = {}
    for drafter in sorted(fits, key=lambda d: (fits[d].shaped_like is not None or fits[d].scaled_from is not None, d)):
        fit = fits[drafter]
        top = arrays[drafter][0].size if k_max is None else min(k_max, arrays[drafter][0].size)
        ks = list(range(1, max(top, *(p.num_speculative_tokens for p in fit.points)) + 1))
        if drafter in out:  # drawn with its sibling on their one line
            continue
        scaled = next((d for d, f in fits.items() if f.scaled_from == drafter), None)
        if scaled is not None:
            # one line through both draft samplings: the line and the factor between them drawn together
            top_s = arrays[scaled][0].size if k_max is None else min(k_max, arrays[scaled][0].size)
            measured = (p.num_speculative_tokens for p in (*fit.points, *fits[scaled].points))
            ks = list(range(1, max(top, top_s, *measured) + 1))
            g_columns, s_columns = joint_step_time_draws(fit, fits[scaled], ks, draws=draws, rng=rng)
            out[drafter] = {k: g_columns[:, j] for j, k in enumerate(ks)}
            out[scaled] = {k: s_columns[:, j] for j, k in enumerate(ks)}
            continue
        sibling = out.get(fit.shaped_like) if fit.shaped_like is not None else None
        anchor = fit.points[0]
        if sibling is not None and anchor.num_speculative_tokens in sibling:
            factor = (
                anchor.step_time_s
                * (1 + fit.relative_sd / np.sqrt(anchor.observations) * rng.standard_normal(draws))
                / sibling[anchor.num_speculative_tokens]
            )
            out[drafter] = {k: sibling[k] * factor if k in sibling else fit.step_time_s(k)[0] * factor for k in ks}
            continue
        share = shares.setdefault(drafter.method, rng.uniform(0.0, 1.0, size=draws)) if fit.wide_band else None
        columns = step_time_draws(fit, ks, draws=draws, rng=rng, slope_share=share)
        out[drafter] = {k: columns[:, j] for j, k in enumerate(ks)}
    return out


def _measured_rate(
    model: ThroughputModel, fit: StepTimeFit, candidate: Candidate, workload: str | None
) -> tuple[float, int] | None:
    """A configuration's mean measured rate for ``workload`` at the fit's concurrency, and its starts
    (None: not measured)."""
    rates = [
        o.output_tokens_per_s
        for o in model.observations
        if o.concurrency == fit.concurrency and o.drafter == candidate.drafter and o.workload == workload
        and o.num_speculative_tokens == candidate.num_speculative_tokens
    ]  # fmt: skip
    return (float(np.mean(rates)), len(rates)) if rates else None


def _acceptance_arrays(acceptance: AcceptanceInput, *, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(acceptance, AcceptanceFit):
        return point_per_position(acceptance), per_position_draws(acceptance, draws=draws, seed=seed)
    point = np.asarray(list(acceptance), dtype=float)
    if point.size == 0 or not np.all(np.isfinite(point)):
        raise FitError("exact acceptance needs finite S_1..S_K; pass at least one position.")
    return point, np.broadcast_to(point, (draws, point.size))


@dataclass(frozen=True, slots=True, kw_only=True)
class RatePrediction:
    """Predicted aggregate rate of one candidate at one concurrency, with its band."""

    concurrency: int
    candidate: Candidate
    tokens_per_step: float
    step_time_s: float
    step_time_source: str  # "measured" or "line"
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float


def predict_throughput(
    model: ThroughputModel,
    acceptance: Mapping[Drafter, AcceptanceInput],
    *,
    concurrency: int,
    k_min: int = 1,
    k_max: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
    workload: str | None = None,
) -> tuple[RatePrediction, ...]:
    """Rate against k with bands at one concurrency: what a throughput-against-k figure plots
    (``workload``: as sample_rates takes it)."""
    sample = sample_rates(
        model, acceptance, concurrency=concurrency, k_min=k_min, k_max=k_max, draws=draws, seed=seed, workload=workload
    )
    low, high = band(sample.draws, sample.tokens_per_s, confidence)
    return tuple(
        RatePrediction(
            concurrency=concurrency,
            candidate=candidate,
            tokens_per_step=float(sample.tokens_per_step[j]),
            step_time_s=float(sample.step_time_s[j]),
            step_time_source=sample.step_time_source[j],
            tokens_per_s=float(sample.tokens_per_s[j]),
            tokens_per_s_low=float(low[j]),
            tokens_per_s_high=float(high[j]),
        )
        for j, candidate in enumerate(sample.candidates)
    )
