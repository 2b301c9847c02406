"""A rig's step cost, kept apart from any workload, and a new workload's recommendation from it.

Acceptance depends on the text and the drafter; the time of one decode step depends on the rig
(model, drafter, hardware, engine flags), on k and on concurrency, not on the text. A rig is the
second half: step time against k per (concurrency, drafter), measured once.

One measured level gives, per stream and per request (B streams, aggregate rate R, mean
completion tokens M, mean decode span s = last token - first token, tokens per step E):

- time per request per stream: tau = B * M / R;
- decode step time: T = s * E / (M - 1)  (the M - 1 tokens after the first take s seconds);
- request overhead: c = tau - s  (prefill, scheduling, the client's gap; it depends on the
  request shape, so it belongs to the workload, not to the rig).

A workload W with acceptance E_W(k) and overhead c_W then runs at
R_W(k, B) = B * M_W / (c_W + (M_W - 1) * T(k, B) / E_W(k)). Its c_W comes from a measurement
of W at the server's current k (no restart): the overhead hardly depends on k.

Drafters that draft only at some steps (n-gram lookup drafts where the text repeats itself)
carry a draft share q: drafts per decode step. How often a draft is found depends on the text;
how that changes with k is the drafter's (llama.cpp's ngram-simple drafts nothing while its
draft length is below its lookup length). With the rig's shares q(k) on its own workloads and
W's share q_W at the running k0, W at k drafts at q_W(k) = q_W * q(k) / q(k0), its per-step
acceptance scales by q(k) / q(k0), and its step time mixes drafted and plain steps:
T_W(k) = T_0 + (T(k) - T_0) * q_W(k) / q(k) with T_0 the step time with speculation off. A
drafter that drafts at every step has q = 1 throughout and none of this changes anything.

Pure: records, fits and comparisons; the rig file's reading and writing live in tuning/rig.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specsweep.analysis.fits import AcceptanceFit, point_per_position
from specsweep.analysis.recommendation import Recommendation, recommend_draft_length
from specsweep.analysis.throughput import (
    Candidate,
    Drafter,
    ThroughputModel,
    ThroughputObservation,
    fit_throughput_model,
)
from specsweep.errors import ConfigError, FitError

RIG_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RigIdentity:
    """What a rig was measured on. None: not known (then it cannot be checked)."""

    engine: str
    engine_version: str | None = None
    model: str | None = None
    server_args: tuple[str, ...] | None = None  # argv without the spec-config part, host or port
    server_facts: dict[str, Any] = field(default_factory=dict)  # other facts the server reports
    specsweep_version: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelTiming:
    """One measured level reduced to what the rig and the workload each need."""

    num_speculative_tokens: int  # 0 = speculation off
    concurrency: int
    drafter: Drafter | None
    output_tokens_per_s: float  # aggregate, client side
    tokens_per_step: float  # E (1 with speculation off)
    completion_tokens: float  # mean M per request
    decode_span_s: float  # mean time from first to last token of a request
    prompt_tokens: float  # mean per request
    requests: int
    workload: str = ""
    trial: int | None = None
    draft_share: float | None = None  # drafts per decode step (None: off, or not known)

    @property
    def request_time_s(self) -> float:
        """Time per request per stream: B * M / R."""
        return self.concurrency * self.completion_tokens / self.output_tokens_per_s

    @property
    def decode_step_time_s(self) -> float:
        return self.decode_span_s * self.tokens_per_step / max(self.completion_tokens - 1.0, 1e-9)

    @property
    def request_overhead_s(self) -> float:
        return max(self.request_time_s - self.decode_span_s, 0.0)


def level_timing(
    *,
    num_speculative_tokens: int,
    concurrency: int,
    drafter: Drafter | None,
    output_tokens_per_s: float | None,
    tokens_per_step: float | None,
    completion_tokens: Sequence[float],
    decode_spans_s: Sequence[float],
    prompt_tokens: Sequence[float],
    workload: str = "",
    trial: int | None = None,
    draft_share: float | None = None,
) -> LevelTiming | None:
    """A level's timing from its successful requests; None when it cannot give one (no tokens,
    one-token answers, or drafting without acceptance counts).

    ``draft_share`` 0 says the counters ran and the drafter drafted nothing: then E = 1."""
    if not output_tokens_per_s or output_tokens_per_s <= 0 or not completion_tokens or not decode_spans_s:
        return None
    off = num_speculative_tokens == 0 or drafter is None
    if not off and draft_share == 0:
        tokens_per_step = 1.0
    if not off and not tokens_per_step:
        return None
    mean_m = sum(completion_tokens) / len(completion_tokens)
    mean_span = sum(decode_spans_s) / len(decode_spans_s)
    if mean_m < 2 or mean_span <= 0:
        return None
    return LevelTiming(
        num_speculative_tokens=0 if off else num_speculative_tokens,
        concurrency=concurrency,
        drafter=None if off else drafter,
        output_tokens_per_s=float(output_tokens_per_s),
        tokens_per_step=1.0 if off else float(tokens_per_step or 1.0),
        completion_tokens=mean_m,
        decode_span_s=mean_span,
        prompt_tokens=sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else 0.0,
        requests=len(completion_tokens),
        workload=workload,
        trial=trial,
        draft_share=None if off or draft_share is None else min(max(float(draft_share), 0.0), 1.0),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestShape:
    """How the rig's requests looked: the decode step time does not depend on it, the overhead does."""

    api: str
    temperature: float
    max_tokens: int
    workloads: dict[str, dict[str, float]]  # workload -> {"prompt_tokens": mean, "completion_tokens": mean}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rig:
    """A rig's decode step time against k per (concurrency, drafter), and what it was measured on."""

    identity: RigIdentity
    shape: RequestShape
    levels: tuple[LevelTiming, ...]
    model: ThroughputModel  # fitted on decode step times (see the module doc)
    schema_version: int = RIG_SCHEMA_VERSION

    @property
    def concurrency_levels(self) -> tuple[int, ...]:
        return self.model.concurrency_levels

    @property
    def drafters(self) -> tuple[Drafter, ...]:
        found = {lv.drafter for lv in self.levels if lv.drafter is not None}
        return tuple(sorted(found, key=lambda d: (d.method, d.draft_sample_method)))

    def draft_lengths(self, drafter: Drafter, concurrency: int | None = None) -> tuple[int, ...]:
        """The k's measured for a drafter (at one concurrency, if given)."""
        return tuple(
            sorted(
                {
                    lv.num_speculative_tokens
                    for lv in self.levels
                    if lv.drafter == drafter and (concurrency is None or lv.concurrency == concurrency)
                }
            )
        )

    def has_off(self, concurrency: int) -> bool:
        return any(lv.drafter is None and lv.concurrency == concurrency for lv in self.levels)

    def draft_share(self, drafter: Drafter, k: int, concurrency: int) -> float:
        """q(k): drafts per decode step on the rig's workloads (1 where not known).

        Mean over the rig's levels at k, weighted by requests; between measured k's linear, beyond
        them the nearest one's."""
        points: dict[int, list[tuple[float, float]]] = {}
        for lv in self.levels:
            if lv.drafter == drafter and lv.concurrency == concurrency:
                share = 1.0 if lv.draft_share is None else lv.draft_share
                points.setdefault(lv.num_speculative_tokens, []).append((share, float(lv.requests)))
        if not points:
            return 1.0
        ks = sorted(points)
        values = [sum(q * w for q, w in points[j]) / sum(w for _, w in points[j]) for j in ks]
        if k <= ks[0]:
            return values[0]
        if k >= ks[-1]:
            return values[-1]
        upper = next(i for i, j in enumerate(ks) if j >= k)
        k0, k1, q0, q1 = ks[upper - 1], ks[upper], values[upper - 1], values[upper]
        return q0 + (q1 - q0) * (k - k0) / (k1 - k0)

    def acceptance_scale(self, drafter: Drafter, running_k: int, concurrency: int, k_max: int) -> dict[int, float]:
        """q(k) / q(k0) for k = 1..k_max: how W's per-step acceptance measured at k0 carries to k."""
        at_running = self.draft_share(drafter, running_k, concurrency)
        if at_running <= 0:
            return {}  # the rig never saw this drafter draft at k0: nothing to scale by
        return {k: self.draft_share(drafter, k, concurrency) / at_running for k in range(1, k_max + 1)}


def fit_rig(levels: Sequence[LevelTiming], *, identity: RigIdentity, shape: RequestShape) -> Rig:
    """The rig's step-time model from measured levels of any workloads (FitError when none is usable)."""
    usable = tuple(lv for lv in levels if lv.decode_step_time_s > 0)
    if not usable:
        raise FitError("no measured level has a decode step time; the rig needs levels that decoded tokens.")
    observations = [
        ThroughputObservation(
            num_speculative_tokens=lv.num_speculative_tokens,
            concurrency=lv.concurrency,
            # a rate whose B * E / rate is the decode step time
            output_tokens_per_s=lv.concurrency * lv.tokens_per_step / lv.decode_step_time_s,
            tokens_per_step=lv.tokens_per_step,
            drafter=lv.drafter,
            workload=lv.workload,
            weight=float(lv.requests),
        )
        for lv in usable
    ]
    return Rig(identity=identity, shape=shape, levels=usable, model=fit_throughput_model(observations))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadTiming:
    """A workload's own request overhead and length per concurrency, from its measurement."""

    workload: str
    overhead_s: dict[int, float]  # concurrency -> c_W
    completion_tokens: dict[int, float]  # concurrency -> M_W
    measured: dict[int, tuple[Candidate, float]]  # concurrency -> (running configuration, its measured rate)
    draft_share: dict[int, float] = field(default_factory=dict)  # concurrency -> q_W at the running k


def workload_timing(workload: str, levels: Sequence[LevelTiming]) -> WorkloadTiming:
    """c_W and M_W per concurrency from a workload's measured levels (any k)."""
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
    )


def running_draft_length(timing: WorkloadTiming, concurrency: int) -> int | None:
    """The k the workload was measured at (None: not measured there, or with speculation off)."""
    running = timing.measured.get(concurrency)
    if running is None or running[0].off:
        return None
    return running[0].num_speculative_tokens


def workload_model(rig: Rig, acceptance: Mapping[Drafter, Sequence[float]], timing: WorkloadTiming) -> ThroughputModel:
    """The rig's levels as this workload would have run them: rates from its E_W(k), c_W and M_W.

    Only levels at a concurrency the workload was measured at, and of drafters it has
    acceptance for (plus speculation off), are kept. The observations carry no workload name, so
    nothing in the model counts as a measured rate of this workload. Draft shares (module doc)
    carry W's per-step acceptance and step time from its running k to the rig's k's.
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
            )
        )
    if not observations:
        raise FitError(
            f"the rig has no level at the concurrency levels {sorted(timing.overhead_s)} measured for "
            f"{timing.workload}; measure at the rig's levels {list(rig.concurrency_levels)}."
        )
    return fit_throughput_model(observations)


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
    off_steps = [o.decode_step_time_s for o in rig.levels if o.drafter is None and o.concurrency == lv.concurrency]
    if q_rig <= 0 or q_running is None or not off_steps:
        return factor, lv.decode_step_time_s
    t_off = sum(off_steps) / len(off_steps)
    q_w = min(1.0, q_running * factor)
    return factor, t_off + (lv.decode_step_time_s - t_off) * q_w / q_rig


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
        )  # fmt: skip
        choice = rec.choice
        fit = fits.get(choice.drafter) if choice.drafter is not None else None
        measured = fit.measured_positions if fit is not None else max(f.measured_positions for f in fits.values())
        needed = tuple(range(measured + 1, choice.num_speculative_tokens + 1))
        known = rig.draft_lengths(choice.drafter, level) if choice.drafter is not None else ()
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


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityDifference:
    """One field where a rig and a server (or a study's server config) differ."""

    field: str
    rig: Any
    other: Any


IDENTITY_FIELDS = ("engine", "engine_version", "model", "server_args")


def compare_identities(rig: RigIdentity, other: RigIdentity) -> tuple[tuple[IdentityDifference, ...], tuple[str, ...]]:
    """(differences, fields that could not be checked because one side does not know them).

    Facts (``server_facts``) are compared where both sides report them.
    """
    differences: list[IdentityDifference] = []
    unchecked: list[str] = []
    for name in IDENTITY_FIELDS:
        mine, theirs = getattr(rig, name), getattr(other, name)
        if mine is None or theirs is None:
            unchecked.append(name)
        elif mine != theirs:
            differences.append(IdentityDifference(field=name, rig=mine, other=theirs))
    for name in sorted(set(rig.server_facts) & set(other.server_facts)):
        if rig.server_facts[name] != other.server_facts[name]:
            differences.append(
                IdentityDifference(field=name, rig=rig.server_facts[name], other=other.server_facts[name])
            )
    return tuple(differences), tuple(unchecked)


def check_identity(rig: RigIdentity, other: RigIdentity, *, other_name: str) -> tuple[str, ...]:
    """The fields left unchecked; ConfigError naming every difference when there is one."""
    differences, unchecked = compare_identities(rig, other)
    if differences:
        shown = "; ".join(_describe(d, other_name) for d in differences)
        raise ConfigError(
            f"the rig was measured on another setup ({shown}); measure this setup with specsweep study "
            "to make a rig of its own."
        )
    return unchecked


def _describe(difference: IdentityDifference, other_name: str) -> str:
    if difference.field == "server_args":
        mine, theirs = list(difference.rig), list(difference.other)
        only_rig = [a for a in mine if a not in theirs]
        only_other = [a for a in theirs if a not in mine]
        parts = [f"only the rig has {' '.join(only_rig)!r}"] if only_rig else []
        parts += [f"only the {other_name} has {' '.join(only_other)!r}"] if only_other else []
        return "server_args: " + (", ".join(parts) or "the same flags in another order")
    return f"{difference.field}: rig {difference.rig!r}, {other_name} {difference.other!r}"
