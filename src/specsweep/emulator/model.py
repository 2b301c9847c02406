"""The emulator's stochastic model, as pure functions: acceptance, step time, ground truth.

Acceptance. A profile gives S_1..S_n per content class at its reference temperature with
probabilistic drafting. For another temperature T and draft method, every conditional rate p_i
moves on the logit scale:

    logit p_i(T, probabilistic) = logit p_i(ref) - temperature_logit_slope * (T - T_ref)
    logit p_i(T, greedy)        = logit p_i(T, probabilistic) - greedy_logit_penalty * T

so the two methods are identical at T = 0. Positions past the profile's list repeat the last
conditional rate. ``rejection_sample_method: synthetic`` replaces all of this with the forced
rates, as vLLM does. Each verification step draws A (accepted drafts) independently with
P(A >= i) = S_i exactly.

Timing. One engine step decodes every running sequence together and takes
StepTiming's T(k, B) modelled seconds at no context; with a profile's ``[context]`` figures
(``emulator/context.py``) it also reads each sequence's KV cache, and a drafter that scans the
context reads it again:

    T(k, B, L_1..L_B) = max(T(k, B), weight_bytes / bandwidth)
                        + sum(L_i) * (kv_bytes_per_token + scan_bytes_per_token * passes(k)) / bandwidth

with passes(k) = k for a drafter that reads the context per draft position, 1 for one that reads
it once per step, 0 at k = 0 or for a drafter that does not scan. A step that admits new requests
also pays their prefill. A lookup drafter's conditional rates gain
``lookup_logit_slope * log2(L / lookup_reference_tokens)`` on the logit scale above the reference.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specsweep.emulator.content import count_tokens
from specsweep.emulator.profile import Profile
from specsweep.engines.vllm import drafts_from_a_distribution
from specsweep.measurement.acceptance import (
    accepted_length_distribution,
    conditional_from_unconditional,
    expected_tokens_per_step,
    unconditional_from_conditional,
)
from specsweep.types import SpeculativeConfig
from specsweep.workload import bundled_workload_names, load_workload

_EPS = 1e-9


def _logit(p: float) -> float:
    p = min(max(p, _EPS), 1.0 - _EPS)
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def acceptance_curve(
    profile: Profile,
    content_class: str,
    spec: SpeculativeConfig | None,
    temperature: float,
    k: int | None = None,
    *,
    context_tokens: float = 0.0,
) -> list[float]:
    """S_1..S_k for one content class under a spec config at a sampling temperature, for a sequence
    whose context is ``context_tokens`` (only a lookup drafter's acceptance depends on it)."""
    if spec is None or not spec.num_speculative_tokens:
        return []
    k = spec.num_speculative_tokens if k is None else k
    if spec.rejection_sample_method == "synthetic":
        return _synthetic_curve(spec, k)
    base = list(profile.classes[content_class].per_position)
    conditional = conditional_from_unconditional(base)
    while len(conditional) < k:
        conditional.append(conditional[-1])
    shift = -profile.temperature_logit_slope * (temperature - profile.reference_temperature)
    if drafting_method(spec) == "greedy":
        shift -= profile.greedy_logit_penalty * temperature
    if not drafts_from_a_distribution(spec):
        shift += profile.context.lookup_logit_shift(context_tokens)
    moved = [_sigmoid(_logit(p) + shift) if p > 0 else 0.0 for p in conditional[:k]]
    return unconditional_from_conditional(moved)


def drafting_method(spec: SpeculativeConfig) -> str:
    """How the drafter really drafts: a lookup drafter (n-gram, suffix) proposes tokens it finds,
    so vLLM's draft sampling does nothing there (only ``v1/spec_decode/llm_base_proposer.py``
    reads draft_sample_method) and it drafts as greedy whatever the config says."""
    return spec.draft_sample_method if drafts_from_a_distribution(spec) else "greedy"


def _synthetic_curve(spec: SpeculativeConfig, k: int) -> list[float]:
    if spec.synthetic_acceptance_rates is not None:
        return list(spec.synthetic_acceptance_rates)[:k]
    # A mean acceptance length L (bonus included) as a geometric curve with 1 + sum a^i = L.
    target = (spec.synthetic_acceptance_length or 1.0) - 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            low = mid
        else:
            high = mid
    return [low**i for i in range(1, k + 1)]


def step_time_s(
    profile: Profile, spec: SpeculativeConfig | None, k: int, batch_size: int, context_tokens: float = 0.0
) -> float:
    """Modelled seconds of one decode step of ``batch_size`` sequences drafting k tokens each, whose
    contexts (prompt and tokens generated so far) add up to ``context_tokens``."""
    if batch_size <= 0:
        return 0.0
    context = profile.context
    read = context.kv_bytes_per_token
    scan = context.scans.get(spec.method or profile.methods[0]) if spec is not None and k > 0 else None
    if scan is not None:
        read += scan.bytes_per_token * (k if scan.per_position else 1)
    floor_s = context.read_s(context.weight_bytes)
    return max(_compute_s(profile, spec, k, batch_size), floor_s) + context.read_s(read * context_tokens)


def _compute_s(profile: Profile, spec: SpeculativeConfig | None, k: int, batch_size: int) -> float:
    """The step at no context: StepTiming's T(k, B)."""
    t = profile.timing
    seconds = (
        t.base_s
        + t.per_sequence_s * batch_size
        + t.verify_token_s * t.verified_width(batch_size * (k + 1))
        + t.draft_position_s * k * (1.0 + t.draft_batch_slope * (batch_size - 1))
        + (t.draft_fixed_s if k > 0 else 0.0)
    )
    if k > 0 and spec is not None and drafting_method(spec) == "probabilistic":
        seconds *= t.probabilistic_factor
    return seconds


def prefill_time_s(profile: Profile, prompt_tokens: int) -> float:
    """Modelled seconds to prefill one prompt."""
    return prompt_tokens / profile.timing.prefill_tokens_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelTruth:
    """Expected behaviour at one concurrency level, in modelled time.

    ``decode_tokens_per_s`` is the steady state of decoding alone (B * E(k) / T(k, B)).
    ``output_tokens_per_s`` is what a closed loop of ``concurrency`` streams sending requests of
    the class's request shape (prompt tokens, max_tokens) gets: each request also pays its
    prefill in a step every stream shares, a step in which it is admitted and does not decode,
    and (while streams <= max_num_seqs) a step in which its slot waits for the next request.
    """

    concurrency: int
    batch_size: int  # sequences per step: concurrency capped by max_num_seqs
    num_speculative_tokens: int  # k in force at that batch size
    step_time_s: float
    decode_tokens_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassTruth:
    """What the model predicts for one content class."""

    per_position: list[float]
    expected_tokens_per_step: float
    prompt_tokens: int
    max_tokens: int
    mean_context_tokens: float  # the context its steps see on average: prompt + max_tokens / 2
    levels: list[LevelTruth]


def compute_truth(
    profile: Profile,
    spec: SpeculativeConfig | None,
    temperature: float,
    concurrency_levels: Sequence[int],
    *,
    max_tokens: int = 600,
    prompt_tokens: Mapping[str, int] | None = None,
) -> dict[str, ClassTruth]:
    """The ground truth the emulator's behaviour converges to, per content class.

    ``prompt_tokens`` gives each class's mean prompt length (default 400 tokens). Each sequence's
    context is taken at its mean over a request's life, ``mean_context_tokens``: the step time is
    linear in the contexts, so the mean step is the step at the mean context.
    """
    out: dict[str, ClassTruth] = {}
    for name in profile.classes:
        prompt = (prompt_tokens or {}).get(name, DEFAULT_PROMPT_TOKENS)
        context = mean_context_tokens(prompt, max_tokens)
        per_position = acceptance_curve(profile, name, spec, temperature, context_tokens=context)
        levels = []
        for concurrency in concurrency_levels:
            batch = min(concurrency, profile.max_num_seqs)
            k = spec.k_for_batch_size(batch) if spec is not None else 0
            expected = expected_tokens_per_step(per_position, k)
            step = step_time_s(profile, spec, k, batch, batch * context)
            levels.append(
                LevelTruth(
                    concurrency=concurrency,
                    batch_size=batch,
                    num_speculative_tokens=k,
                    step_time_s=step,
                    decode_tokens_per_s=batch * expected / step,
                    output_tokens_per_s=closed_loop_tokens_per_s(
                        profile, spec, per_position, concurrency, max_tokens=max_tokens, prompt_tokens=prompt
                    ),
                )
            )
        out[name] = ClassTruth(
            per_position=per_position,
            expected_tokens_per_step=expected_tokens_per_step(per_position),
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            mean_context_tokens=context,
            levels=levels,
        )
    return out


DEFAULT_PROMPT_TOKENS = 400


def mean_context_tokens(prompt_tokens: int, max_tokens: int) -> float:
    """A request's context averaged over its decode steps: its prompt and half of what it generates
    (its steps emit tokens at a steady mean rate, so the context grows linearly through them)."""
    return prompt_tokens + max_tokens / 2


def closed_loop_tokens_per_s(
    profile: Profile,
    spec: SpeculativeConfig | None,
    per_position: Sequence[float],
    concurrency: int,
    *,
    max_tokens: int,
    prompt_tokens: int,
) -> float:
    """Expected aggregate output tok/s of a closed loop of ``concurrency`` streams.

    A request's first token comes from the step that admits it (which pays its prefill and in
    which it does not decode); it then needs D decode steps for the other max_tokens - 1, with
    E[D] = (M - 1) / mu + E[X^2] / (2 mu^2) for X = A + 1 tokens per step (renewal theory).
    A slot is thus idle for one step per request while streams <= max_num_seqs (its client is
    sending the next request) plus the admitting step; each step's batch is B minus the idle
    slots, taken as Binomial(B, q) with q the idle share. One stream alone idles the engine
    instead, for the request overhead. Natural early stops are not modelled (rare at M << the
    profile's median output length). Every decoding sequence's context is the mean over a request's
    life (``mean_context_tokens``); ``per_position`` should be the acceptance at that context.
    """
    batch = min(concurrency, profile.max_num_seqs)
    context = mean_context_tokens(prompt_tokens, max_tokens)
    prefill = prefill_time_s(profile, prompt_tokens)
    per_step: dict[int, tuple[float, float, float]] = {}  # b -> (step time, mean X, mean X^2)
    for b in range(0, batch + 1):
        k = spec.k_for_batch_size(b) if spec is not None and b else 0
        curve = list(per_position)[:k]
        probs = accepted_length_distribution(curve) if k else [1.0]
        mean_x = sum((j + 1) * p for j, p in enumerate(probs))
        mean_x2 = sum((j + 1) ** 2 * p for j, p in enumerate(probs))
        per_step[b] = (step_time_s(profile, spec, k, b, b * context), mean_x, mean_x2)
    decode_tokens = max_tokens - 1
    if batch == 1:
        step, mean_x, mean_x2 = per_step[1]
        steps = decode_tokens / mean_x + mean_x2 / (2 * mean_x**2) if decode_tokens else 0.0
        return max_tokens / (profile.timing.request_overhead_s + prefill + steps * step)
    idle_steps = 2 if concurrency <= profile.max_num_seqs else 1
    mean_x, mean_x2 = per_step[batch][1], per_step[batch][2]
    for _ in range(20):  # fixed point: the idle share depends on D, D on the batch mix
        steps = decode_tokens / mean_x + mean_x2 / (2 * mean_x**2) if decode_tokens else 0.0
        q = idle_steps / (steps + idle_steps)
        weights = [math.comb(batch, batch - b) * q ** (batch - b) * (1 - q) ** b for b in range(batch + 1)]
        decoding = sum(w * b for w, b in zip(weights, range(batch + 1), strict=True))
        mean_x = sum(w * b * per_step[b][1] for w, b in zip(weights, range(batch + 1), strict=True)) / decoding
        mean_x2 = sum(w * b * per_step[b][2] for w, b in zip(weights, range(batch + 1), strict=True)) / decoding
    mean_step_s = sum(w * per_step[b][0] for w, b in zip(weights, range(batch + 1), strict=True))
    # Per step: decoding * mean_x decode tokens, so decode_tokens / that requests' worth of
    # decoding; each request adds one prefill to the shared timeline.
    requests_per_step = decoding * mean_x / decode_tokens if decode_tokens else batch
    return requests_per_step * max_tokens / (mean_step_s + requests_per_step * prefill)


def workload_prompt_tokens(content_class: str) -> int:
    """Mean prompt tokens (the emulator's count, nonce included) of the bundled workload named
    like the content class, as a client sends them; DEFAULT_PROMPT_TOKENS when there is none."""
    if content_class not in bundled_workload_names():
        return DEFAULT_PROMPT_TOKENS
    prompts = load_workload(content_class).prompts
    # nonces drawn from a fixed seed: a nonce's token count varies with its digits, and the truth
    # must be the same from run to run
    draw = random.Random(0)
    nonces = [f"{draw.getrandbits(48):012x}" for _ in prompts]
    counts = [
        count_tokens("".join(str(m.get("content") or "") for m in p.chat_messages(n)))
        for p, n in zip(prompts, nonces, strict=True)
    ]
    return round(sum(counts) / len(counts))
