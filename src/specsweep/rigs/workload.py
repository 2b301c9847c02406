"""A workload on a rig: its own overhead and acceptance with the rig's step time give its rate
at every k (the formulas are in rigs/model.py's docstring), and the recommended k per
concurrency.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.fits import AcceptanceFit, fit_acceptance
from specsweep.analysis.positions import point_per_position
from specsweep.analysis.recommendation import Recommendation, recommend_draft_length
from specsweep.analysis.step_model import MIN_LEVEL_SE
from specsweep.analysis.throughput import ThroughputModel, ThroughputObservation, fit_throughput_model
from specsweep.errors import FitError
from specsweep.rigs.model import LevelTiming, Rig
from specsweep.types import NoisePriors, RunNoisePrior


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadTiming:
    """A workload's own request overhead and length per concurrency, from its measurement."""

    workload: str
    overhead_s: dict[int, float]  # concurrency -> c_W
    completion_tokens: dict[int, float]  # concurrency -> M_W
    measured: dict[int, tuple[Candidate, float]]  # concurrency -> (running configuration, its measured rate)
    draft_share: dict[int, float] = field(default_factory=dict)  # concurrency -> q_W at the running k
    context_tokens: int = 0  # the context level it was measured at (W@16k: 16384); the rig is read there


def workload_timing(workload: str, levels: Sequence[LevelTiming]) -> WorkloadTiming:
    """c_W and M_W per concurrency from a workload's measured levels (any k, one context level)."""
    overhead: dict[int, list[float]] = {}
    completion: dict[int, list[float]] = {}
    measured: dict[int, tuple[Candidate, float]] = {}
    shares: dict[int, float] = {}
    for lv in levels:
        overhead.setdefault(lv.concurrency, []).append(lv.request_overhead_s)
        completion.setdefault(lv.concurrency, []).append(lv.completion_tokens)
        candidate = Candidate(drafter=lv.drafter, num_speculative_tokens=lv.num_speculative_tokens)
        measured[lv.concurrency] = (candidate, lv.output_tokens_per_s)
        if lv.drafter is not None and lv.draft_share is not None:
            shares[lv.concurrency] = lv.draft_share
    return WorkloadTiming(
        workload=workload,
        overhead_s={b: sum(v) / len(v) for b, v in overhead.items()},
        completion_tokens={b: sum(v) / len(v) for b, v in completion.items()},
        measured=measured,
        draft_share=shares,
        context_tokens=max((lv.context_tokens for lv in levels), default=0),
    )


def running_draft_length(timing: WorkloadTiming, concurrency: int) -> int | None:
    """The k the workload was measured at (None: not measured there, or with speculation off)."""
    running = timing.measured.get(concurrency)
    if running is None or running[0].off:
        return None
    return running[0].num_speculative_tokens


def workload_model(
    rig: Rig,
    acceptance: Mapping[Drafter, Iterable[float]],
    timing: WorkloadTiming,
    *,
    run_noise: RunNoisePrior | None = None,
) -> ThroughputModel:
    """The rig's levels as this workload would have run them: rates from its E_W(k), c_W and M_W.

    Only levels at a concurrency the workload was measured at, and of drafters it has
    acceptance for (plus speculation off), are kept, at every context level the rig measured: the
    one model is fitted over them all and read at the workload's (``timing.context_tokens``), at
    each of those concurrency levels, whether or not the rig measured it at that context (the
    model reads the context linearly where not). The observations carry no workload name, so
    nothing in the model counts as a measured rate of this workload. Draft shares (module doc)
    carry W's per-step acceptance and step time from its running k to the rig's k's.
    ``run_noise``: what the rig's starts varied by, where its levels are derived, not measured:
    the start effect of the model is drawn toward it.
    """
    observations = []
    for lv in rig.levels:
        c = timing.overhead_s.get(lv.concurrency)
        m = timing.completion_tokens.get(lv.concurrency)
        if c is None or m is None:
            continue
        step = lv.decode_step_time_s
        if lv.drafter is None:
            e = 1.0
        elif lv.drafter in acceptance:
            curve = list(acceptance[lv.drafter])
            if len(curve) < lv.num_speculative_tokens:
                continue
            scale, step = _shared_step(rig, lv, timing)
            e = 1.0 + scale * sum(curve[: lv.num_speculative_tokens])
        else:
            continue
        rate = lv.concurrency * m / (c + (m - 1.0) * step / e)
        observations.append(
            ThroughputObservation(
                num_speculative_tokens=lv.num_speculative_tokens,
                concurrency=lv.concurrency,
                output_tokens_per_s=rate,
                tokens_per_step=e,
                drafter=lv.drafter,
                weight=float(lv.requests),
                start=lv.trial if lv.trial is not None else -1,
                # a mean decode span over the level's requests: far steadier than a rate; its own error
                # is taken as the least a level's is
                relative_se=MIN_LEVEL_SE,
                context_tokens=lv.context_tokens,
            )
        )
    if not observations:
        raise FitError(
            f"the rig has no level at the concurrency levels {sorted(timing.overhead_s)} measured for "
            f"{timing.workload}; measure at the rig's levels {list(rig.concurrency_levels)}."
        )
    noise = None if run_noise is None else NoisePriors(run_noise)
    model = fit_throughput_model(observations, noise_prior=noise, context_tokens=timing.context_tokens)
    # answered at every level the workload and the rig share, whichever contexts the rig measured it at
    return replace(model, concurrency_levels=tuple(sorted({o.concurrency for o in observations})))


def workload_acceptance_scale(
    rig: Rig, drafter: Drafter, timing: WorkloadTiming, concurrency: int, k_max: int
) -> dict[int, float]:
    """q(k) / q(k0) per k for the workload at one concurrency ({} when nothing scales)."""
    running = running_draft_length(timing, concurrency)
    if running is None:
        return {}
    return rig.acceptance_scale(drafter, running, concurrency, k_max)


def _shared_step(rig: Rig, lv: LevelTiming, timing: WorkloadTiming) -> tuple[float, float]:
    """(q(k) / q(k0), T_W(k)) for one of the rig's drafting levels, as the workload would run it."""
    assert lv.drafter is not None
    scale = workload_acceptance_scale(rig, lv.drafter, timing, lv.concurrency, lv.num_speculative_tokens)
    factor = scale.get(lv.num_speculative_tokens, 1.0)
    q_rig = 1.0 if lv.draft_share is None else lv.draft_share
    q_running = timing.draft_share.get(lv.concurrency)
    off_steps = [
        o.decode_step_time_s
        for o in rig.levels
        if o.drafter is None and o.concurrency == lv.concurrency and o.context_tokens == lv.context_tokens
    ]
    if q_rig <= 0 or q_running is None or not off_steps:
        return factor, lv.decode_step_time_s
    t_off = sum(off_steps) / len(off_steps)
    q_w = min(1.0, q_running * factor)
    # A drafting level measured faster per step than speculation off is noise (a drafter that
    # rarely drafted, few requests): its drafting cost counts as none, not as a negative one that
    # the scale-up to a workload that drafts more would turn into a negative step time.
    return factor, t_off + max(lv.decode_step_time_s - t_off, 0.0) * q_w / q_rig


@dataclass(frozen=True, slots=True, kw_only=True)
class RigRecommendation:
    """The recommended k for one workload at one concurrency, from a rig and one measurement."""

    recommendation: Recommendation
    running: Candidate | None  # the configuration the workload was measured under
    running_tokens_per_s: float | None  # its measured rate
    measured_positions: int  # K: acceptance positions the measurement counted
    k_max: int  # the largest k considered
    extrapolated_positions: tuple[int, ...]  # positions the chosen k needs from the decay model
    acceptance_model: str  # the decay model that carries acceptance past K
    step_time_extrapolated: bool  # the chosen k lies outside the rig's measured draft lengths


def recommend_with_rig(
    rig: Rig,
    fits: Mapping[Drafter, AcceptanceFit],
    timing: WorkloadTiming,
    *,
    k_max: int | None = None,
    confidence: float = 0.95,
    draws: int = 400,
    seed: int = 0,
) -> tuple[RigRecommendation, ...]:
    """Per concurrency level the workload and the rig share: recommended k, band, gain over the running one."""
    if not fits:
        raise FitError(f"{timing.workload} has no acceptance counts: measure it with speculation on.")
    top = k_max or max((k for d in rig.drafters for k in rig.draft_lengths(d)), default=1)
    points = {d: point_per_position(f) for d, f in fits.items()}
    model = workload_model(rig, points, timing)
    out = []
    for level in model.concurrency_levels:
        running, running_rate = timing.measured.get(level, (None, None))
        baseline = running if running is not None and not running.off else None
        scales = {d: workload_acceptance_scale(rig, d, timing, level, top) for d in fits}
        rec = recommend_draft_length(
            model, fits, concurrency=level, workload=timing.workload, baseline=baseline, k_max=top,
            confidence=confidence, draws=draws, seed=seed, acceptance_scale={d: v for d, v in scales.items() if v},
            cells=len(model.concurrency_levels),
        )  # fmt: skip
        choice = rec.choice
        fit = fits.get(choice.drafter) if choice.drafter is not None else None
        measured = fit.measured_positions if fit is not None else max(f.measured_positions for f in fits.values())
        needed = tuple(range(measured + 1, choice.num_speculative_tokens + 1))
        known = rig.draft_lengths(choice.drafter, level, timing.context_tokens) if choice.drafter is not None else ()
        out.append(
            RigRecommendation(
                recommendation=rec,
                running=running,
                running_tokens_per_s=running_rate,
                measured_positions=measured,
                k_max=top,
                extrapolated_positions=needed,
                acceptance_model=(fit or next(iter(fits.values()))).chosen,
                step_time_extrapolated=not choice.off and choice.num_speculative_tokens not in known,
            )
        )
    return tuple(out)


def acceptance_from_levels(
    levels: Sequence[tuple[float, Sequence[float]]], *, k_max: int, seed: int = 0
) -> AcceptanceFit:
    """One fit from (steps, accepted per position) of several levels (acceptance does not depend on B).

    Pass every decode step as the first number (``decode_steps``), not only the drafting ones:
    S_i is then per step, and E(k) = 1 + S_1 + ... + S_k holds for a drafter that drafts only
    sometimes too (its undrafted steps accept nothing at every position)."""
    usable = [(n, list(c)) for n, c in levels if n and c]
    if not usable:
        raise FitError(
            "the server counted no drafts: it runs with speculation off or publishes no per-position counters; "
            "run it with the largest k you would consider and measure again."
        )
    depth = min(len(c) for _, c in usable)
    drafts = sum(n for n, _ in usable)
    counts = [sum(c[i] for _, c in usable) for i in range(depth)]
    return fit_acceptance(num_drafts=drafts, accepted_per_position=counts, k_max=max(k_max, depth), seed=seed)
