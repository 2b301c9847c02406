"""A rig's step cost, kept apart from any workload: the records, the fit and the per-level math.

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
of W at the server's current k (no start): the overhead hardly depends on k.

Drafters that draft only at some steps (n-gram lookup drafts where the text repeats itself)
carry a draft share q: drafts per decode step. How often a draft is found depends on the text;
how that changes with k is the drafter's (llama.cpp's ngram-simple drafts nothing while its
draft length is below its lookup length). With the rig's shares q(k) on its own workloads and
W's share q_W at the running k0, W at k drafts at q_W(k) = q_W * q(k) / q(k0), its per-step
acceptance scales by q(k) / q(k0), and its step time mixes drafted and plain steps:
T_W(k) = T_0 + (T(k) - T_0) * q_W(k) / q(k) with T_0 the step time with speculation off. A
drafter that drafts at every step has q = 1 throughout and none of this changes anything.

Pure: records and fits. A workload on a rig: rigs/workload.py; the rig file and the
identity checks: rigs/file.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specsweep.analysis.drafters import Drafter
from specsweep.analysis.step_model import MIN_LEVEL_SE
from specsweep.analysis.throughput import ThroughputModel, ThroughputObservation, fit_throughput_model
from specsweep.errors import ConfigError, FitError
from specsweep.workload import context_variant_name

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
    context_tokens: int = 0  # the context level it was measured at (0: its workload as it is)

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
    context_tokens: int = 0,
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
        context_tokens=context_tokens,
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
        return tuple(sorted({lv.concurrency for lv in self.levels}))

    @property
    def context_levels(self) -> tuple[int, ...]:
        """The context levels above 0 the rig measured (none: its step model has no context in it)."""
        return tuple(sorted({lv.context_tokens for lv in self.levels if lv.context_tokens > 0}))

    @property
    def drafters(self) -> tuple[Drafter, ...]:
        found = {lv.drafter for lv in self.levels if lv.drafter is not None}
        return tuple(sorted(found, key=lambda d: (d.method, d.draft_sample_method)))

    def draft_lengths(
        self, drafter: Drafter, concurrency: int | None = None, context_tokens: int | None = None
    ) -> tuple[int, ...]:
        """The k's measured for a drafter (at one concurrency and one context level, if given)."""
        return tuple(
            sorted(
                {
                    lv.num_speculative_tokens
                    for lv in self.levels
                    if lv.drafter == drafter
                    and (concurrency is None or lv.concurrency == concurrency)
                    and (context_tokens is None or lv.context_tokens == context_tokens)
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
            start=lv.trial if lv.trial is not None else -1,
            # a mean decode span over the level's requests: far steadier than a rate; its own error
            # is taken as the least a level's is
            relative_se=MIN_LEVEL_SE,
            context_tokens=lv.context_tokens,
        )
        for lv in usable
    ]
    return Rig(identity=identity, shape=shape, levels=usable, model=fit_throughput_model(observations))


def context_label(context_tokens: int) -> str:
    """A context level as its workload names it: ``16k``, ``10000``."""
    return context_variant_name("", context_tokens).removeprefix("@")


def check_rig_context(rig: Rig, contexts: Sequence[int], *, what: str) -> str | None:
    """Whether the rig can answer ``what`` at these context levels (0: the workload as it is).

    A rig that measured no context level has no context in its step model: ConfigError, one line
    saying what to do. One that measured some reads its model linearly in the context at any
    other: the note that says so (None when every level asked was measured)."""
    asked = sorted({c for c in contexts if c > 0})
    if not asked:
        return None
    shown = ", ".join(context_label(c) for c in asked)
    if not rig.context_levels:
        raise ConfigError(
            f"{what} asks for context {shown}, but the rig measured no context level, so its step model cannot "
            "say what a context costs: build the rig from a study that measured context levels (measure.context, "
            "or study --context), or ask without one."
        )
    missing = [c for c in asked if c not in rig.context_levels]
    if not missing:
        return None
    measured = ", ".join(context_label(c) for c in rig.context_levels)
    return (
        f"context {', '.join(context_label(c) for c in missing)} was not measured on the rig (it measured "
        f"{measured}): its step times there are the rig's model read linearly in the context."
    )


def decode_steps(num_drafts: float, level: LevelTiming | None) -> float:
    """Every decode step of a level: its drafting steps, or more when some steps drafted nothing."""
    if level is None or not num_drafts:
        return num_drafts
    return max(num_drafts, level.requests * (level.completion_tokens - 1.0) / level.tokens_per_step)
