"""The emulator's context model: the KV cache a step reads, its floor, drafters that scan the
context, lookup acceptance by context, the truth by context, and a served long prompt."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

from specsweep.emulator.context import ContextCost
from specsweep.emulator.model import acceptance_curve, compute_truth, step_time_s
from specsweep.emulator.profile import load_profile, parse_profile
from specsweep.engines.vllm import parse_speculative_config
from specsweep.errors import ConfigError

PROFILES = Path(__file__).parents[1] / "src" / "specsweep" / "emulator" / "profiles"
# The L40S profile without its own [context] table: the tests below give it theirs.
L40S_TEXT = (PROFILES / "l40s-llama-8b-eagle3.toml").read_text().split("\n[context]")[0] + "\n"
# Llama-3.1-8B's KV cache in bf16 (32 layers, 8 KV heads of 128, K and V) on an L40S (864 GB/s).
LLAMA_CONTEXT = """
[context]
memory_bandwidth_gb_s = 864.0
layers = 32
kv_heads = 8
head_dim = 128
kv_dtype = "bf16"
"""
KV_BYTES = 2 * 32 * 8 * 128 * 2  # 131072
BANDWIDTH = 864e9


def spec(text: str):
    return parse_speculative_config(text)


def l40s(extra: str = LLAMA_CONTEXT):
    return parse_profile(L40S_TEXT + extra, source="test")


def test_the_kv_cache_a_step_reads_adds_its_bytes_over_the_bandwidth() -> None:
    profile = l40s()
    assert profile.context.kv_bytes_per_token == KV_BYTES
    eagle = spec(
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":4,"draft_sample_method":"probabilistic"}'
    )
    for k, batch, contexts in ((0, 1, [1000]), (4, 1, [16000]), (2, 4, [500, 3000, 8000, 30000])):
        config = eagle if k else None
        by_hand = step_time_s(profile, config, k, batch) + sum(contexts) * KV_BYTES / BANDWIDTH
        assert step_time_s(profile, config, k, batch, sum(contexts)) == pytest.approx(by_hand, rel=1e-12)
    # one read per step whatever k: verifying k + 1 tokens reads the cache once
    long_by_k = [step_time_s(profile, eagle, k, 1, 20000) - step_time_s(profile, eagle, k, 1) for k in range(5)]
    assert long_by_k == pytest.approx([20000 * KV_BYTES / BANDWIDTH] * 5, rel=1e-12)


def test_a_drafter_that_scans_the_context_reads_it_per_pass() -> None:
    per_step = l40s(LLAMA_CONTEXT + "[context.scan.eagle3]\nbytes_per_token = 4096\n")
    per_position = l40s(LLAMA_CONTEXT + "[context.scan.eagle3]\nbytes_per_token = 4096\nper_position = true\n")
    plain = l40s()
    config = spec('{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":5}')
    for k in (1, 3, 5):
        base = step_time_s(plain, config, k, 2, 10000)
        assert step_time_s(per_step, config, k, 2, 10000) - base == pytest.approx(10000 * 4096 / BANDWIDTH)
        assert step_time_s(per_position, config, k, 2, 10000) - base == pytest.approx(k * 10000 * 4096 / BANDWIDTH)
    # speculation off does not draft, and another method does not scan
    assert step_time_s(per_position, None, 0, 2, 10000) == step_time_s(plain, None, 0, 2, 10000)
    ngram = spec('{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}')
    assert step_time_s(per_position, ngram, 3, 2, 10000) == step_time_s(plain, ngram, 3, 2, 10000)


def test_no_step_is_faster_than_its_bytes_over_the_bandwidth() -> None:
    """The floor: a step reads its weights and its sequences' KV caches; compute beyond that read adds."""
    weights = 20e9  # 23.1 ms at 864 GB/s: above the 10.7 ms this rig's step computes at batch 1
    floored = l40s(LLAMA_CONTEXT + f"weight_bytes = {weights}\n")
    plain = l40s()
    floor_s = weights / BANDWIDTH
    for context in (0, 5000, 30000):
        kv_s = context * KV_BYTES / BANDWIDTH
        assert step_time_s(floored, None, 0, 1, context) == pytest.approx(floor_s + kv_s, rel=1e-12)
        assert step_time_s(floored, None, 0, 1, context) >= (weights + context * KV_BYTES) / BANDWIDTH - 1e-15
    # where compute passes the floor, the step is its compute plus its KV read, as without the floor
    wide = spec('{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":8}')
    assert step_time_s(plain, wide, 8, 64) > floor_s
    assert step_time_s(floored, wide, 8, 64, 9000) == step_time_s(plain, wide, 8, 64, 9000)


def l40s_as_before():
    """The L40S profile as it was before it had a [context] table: its per-sequence and draft costs
    then held the read of a short context that the table now adds."""
    profile = load_profile("l40s-llama-8b-eagle3")
    timing = replace(profile.timing, per_sequence_s=0.00012, draft_position_s=0.0012, draft_batch_slope=0.05)
    return replace(profile, timing=timing, context=ContextCost())


# Computed with the code before the context model existed: a profile without [context] keeps them.
L40S_STEPS = {(0, 1): 0.010660000000000001, (3, 1): 0.0148114, (4, 4): 0.017819}
L40S_TRUTH = {"prose": [231.95816945974067, 806.0390225281967], "technical": [166.0832495378907, 566.9035351986582]}
DGX_STEPS = {(0, 1): 0.0417, (3, 1): 0.0645, (4, 4): 0.1681}
DGX_TRUTH = {"prose": [40.884914834705796, 69.78535238543957], "technical": [29.65674912493031, 50.40138425688703]}


@pytest.mark.parametrize(
    ("profile", "steps", "truth"),
    [
        (l40s_as_before(), L40S_STEPS, L40S_TRUTH),
        (replace(load_profile(), context=ContextCost()), DGX_STEPS, DGX_TRUTH),
    ],
    ids=["l40s", "dgx-without-context"],
)
def test_a_profile_without_context_figures_is_unchanged(profile, steps, truth) -> None:
    assert profile.context == ContextCost()
    config = spec('{"num_speculative_tokens":4,"draft_sample_method":"probabilistic"}')
    for (k, batch), seconds in steps.items():
        assert step_time_s(profile, config, k, batch, 10**6) == seconds  # no effect at any context
    got = compute_truth(profile, config, profile.reference_temperature, [1, 4],
                        prompt_tokens={"prose": 400, "technical": 900})  # fmt: skip
    for name, rates in truth.items():
        assert [lv.output_tokens_per_s for lv in got[name].levels] == pytest.approx(rates, rel=1e-12)


def best_k(profile, content: str, concurrency: int, prompt_tokens: int, rate: str = "output_tokens_per_s") -> int:
    rates = []
    for k in range(9):
        config = spec(f'{{"num_speculative_tokens":{k},"draft_sample_method":"probabilistic"}}') if k else None
        truth = compute_truth(profile, config, profile.reference_temperature, [concurrency],
                              prompt_tokens={content: prompt_tokens})  # fmt: skip
        rates.append(getattr(truth[content].levels[0], rate))
    return max(range(9), key=rates.__getitem__)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_best_k_at_long_context_is_at_least_the_short_contexts(concurrency: int) -> None:
    """A non-scanning drafter's best k does not fall as the context grows; on the default rig it
    holds (its compressed cache is small), and with a cache 51 times larger it grows."""
    profile = load_profile()
    dense = replace(profile, context=replace(profile.context, kv_bytes_per_token=40016.0))
    for content in ("prose", "technical"):
        short = best_k(profile, content, concurrency, 1024)
        assert best_k(profile, content, concurrency, 262144) >= short
        assert best_k(dense, content, concurrency, 262144) > best_k(dense, content, concurrency, 1024)


def test_the_default_profile_hardly_moves_at_the_bundled_prompts() -> None:
    profile = load_profile()
    off = replace(profile, context=ContextCost())
    config = spec('{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}')
    with_context = compute_truth(profile, config, 0.6, [1, 4], prompt_tokens={"prose": 411, "technical": 411})
    without = compute_truth(off, config, 0.6, [1, 4], prompt_tokens={"prose": 411, "technical": 411})
    for name in with_context:
        for a, b in zip(with_context[name].levels, without[name].levels, strict=True):
            assert a.output_tokens_per_s == pytest.approx(b.output_tokens_per_s, rel=1e-4)
            assert a.output_tokens_per_s < b.output_tokens_per_s


def test_a_lookup_drafters_acceptance_grows_with_context_where_enabled() -> None:
    enabled = l40s(LLAMA_CONTEXT + "lookup_logit_slope = 0.3\nlookup_reference_tokens = 2048\n")
    ngram = spec('{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}')
    eagle = spec('{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":4}')
    curves = [acceptance_curve(enabled, "prose", ngram, 0.7, context_tokens=c) for c in (500, 2048, 8192, 32768)]
    assert curves[0] == curves[1]  # nothing below the reference
    for shorter, longer in pairwise(curves[1:]):
        assert all(b > a for a, b in zip(shorter, longer, strict=True))
    # two doublings: each conditional rate's logit gains 2 * 0.3
    p1 = curves[1][0]
    expected = 1 / (1 + (1 - p1) / p1 * math.exp(-0.6))
    assert curves[2][0] == pytest.approx(expected)
    # off by default, and a drafter that samples its drafts does not depend on the context
    plain = l40s()
    assert acceptance_curve(plain, "prose", ngram, 0.7, context_tokens=32768) == curves[0]
    assert acceptance_curve(enabled, "prose", eagle, 0.7, context_tokens=32768) == acceptance_curve(
        enabled, "prose", eagle, 0.7
    )
    # the truth takes the acceptance at the requests' mean context
    truth = compute_truth(enabled, ngram, 0.7, [1], max_tokens=600, prompt_tokens={"prose": 7892, "technical": 100})
    assert truth["prose"].mean_context_tokens == 8192
    assert truth["prose"].per_position == pytest.approx(curves[2])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("kv_bytes_per_token = 100.0", "memory_bandwidth_gb_s is required"),
        ("memory_bandwidth_gb_s = 1.0\nkv_bytes_per_token = 1.0\nlayers = 2", "is given whole"),
        ("memory_bandwidth_gb_s = 1.0\nlayers = 2\nkv_heads = 1", "head_dim is missing"),
        ('memory_bandwidth_gb_s = 1.0\nlayers = 2\nkv_heads = 1\nhead_dim = 64\nkv_dtype = "int3"', "kv_dtype must be"),
        ("memory_bandwidth_gb_s = -1.0", "memory_bandwidth_gb_s must be a number >= 0"),
        ("memory_bandwidth_gb_s = 1.0\nturbo = true", "context.turbo is not a known key"),
        ("memory_bandwidth_gb_s = 1.0\n[context.scan.dflash]\nbytes_per_token = 1", "'dflash' is not one of"),
        ("memory_bandwidth_gb_s = 1.0\n[context.scan.eagle3]\nper_position = true", "needs bytes_per_token"),
        ("lookup_reference_tokens = 0", "lookup_reference_tokens must be a whole number >= 1"),
    ],
)
def test_bad_context_tables_name_the_key(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        l40s("\n[context]\n" + table + "\n")
    assert "\n" not in str(caught.value)


def test_the_kv_bytes_from_the_model_shape() -> None:
    mla = l40s(LLAMA_CONTEXT.replace("kv_heads = 8", "kv_heads = 1") + "kv_tensors = 1\n")
    assert mla.context.kv_bytes_per_token == 32 * 128 * 2
    fp8 = l40s(LLAMA_CONTEXT.replace('"bf16"', '"fp8"'))
    assert fp8.context.kv_bytes_per_token == KV_BYTES / 2


def test_print_truth_by_context() -> None:
    from .conftest import print_truth

    config = '{"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'
    truth = print_truth("--speculative-config", config, "--concurrency", "1,4", "--context", "1024,65536")
    assert list(truth) == ["1024", "65536"]
    short, long = truth["1024"]["prose"], truth["65536"]["prose"]
    assert (short["prompt_tokens"], long["prompt_tokens"]) == (1024, 65536)
    assert long["mean_context_tokens"] == 65536 + 300
    profile = load_profile()
    for level in (0, 1):
        batch = short["levels"][level]["batch_size"]
        grown = long["levels"][level]["step_time_s"] - short["levels"][level]["step_time_s"]
        assert grown == pytest.approx(batch * 64512 * profile.context.kv_bytes_per_token / 273e9, rel=1e-9)


def test_a_served_long_prompt_takes_longer_per_token_as_the_model_says(start_emulator, tmp_path: Path) -> None:
    """A real `specsweep emulate` on a rig whose KV read is large: per output token, a 20,000-token
    prompt's stream runs slower than a short one's by the model's ratio of their step times."""
    path = tmp_path / "long-context.toml"
    path.write_text(L40S_TEXT + LLAMA_CONTEXT)  # its 3% jitter per step: about 0.2% over 199 steps
    profile = load_profile(path)
    emulator = start_emulator(profile=str(path), time_scale=2.0)
    max_tokens = 200
    per_token: dict[str, tuple[float, int]] = {}
    with httpx.Client(base_url=emulator.url, timeout=60) as http:
        for label, prompt in (("short", "river " * 40), ("long", "river " * 20000)):
            body = {"model": profile.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            stamps, prompt_tokens = [], 0
            with http.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if '"choices":[]' in line.replace(" ", ""):
                        prompt_tokens = httpx.Response(200, content=line[6:]).json()["usage"]["prompt_tokens"]
                    else:
                        stamps.append(time.perf_counter())
            assert len(stamps) == max_tokens  # one token per step without speculation
            per_token[label] = ((stamps[-1] - stamps[0]) * 2.0 / (max_tokens - 1), prompt_tokens)

    def modelled(prompt_tokens: int) -> float:  # the decode steps after the first token, as the engine runs them
        steps = [step_time_s(profile, None, 0, 1, prompt_tokens + n) for n in range(1, max_tokens)]
        return sum(steps) / len(steps)

    (short_s, short_prompt), (long_s, long_prompt) = per_token["short"], per_token["long"]
    assert long_prompt > 19000 and short_prompt < 100
    expected = modelled(long_prompt) / modelled(short_prompt)
    assert expected > 1.2  # a 20,000-token prompt's KV read is 3 ms of a 10.7 ms step
    assert long_s / short_s == pytest.approx(expected, rel=0.03)
    assert short_s == pytest.approx(modelled(short_prompt), rel=0.05)


def test_the_engine_takes_a_lookup_drafters_acceptance_at_each_sequences_context() -> None:
    import asyncio

    from specsweep.emulator.engine import CONTEXT_STEP, Engine, Sequence

    enabled = l40s(LLAMA_CONTEXT + "lookup_logit_slope = 0.3\n")
    ngram = spec('{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}')
    engine = Engine(enabled, ngram)

    def seq(prompt_tokens: int, generated: int) -> Sequence:
        return Sequence(request_id=1, content_class="prose", prompt_tokens=prompt_tokens, max_tokens=100,
                        natural_tokens=100, temperature=0.7, arrival=0.0, outbox=asyncio.Queue(),
                        generated=generated)  # fmt: skip

    def first_rejected(s: Sequence) -> float:  # P(A = 0) = 1 - S_1
        return engine._cumulative(s, 3)[0]

    at_1k, at_16k = seq(1000, 24), seq(16000, 384)
    s1 = acceptance_curve(enabled, "prose", ngram, 0.7, 3, context_tokens=round(16384 / CONTEXT_STEP) * CONTEXT_STEP)
    assert first_rejected(at_16k) == pytest.approx(1 - s1[0])
    at_reference = acceptance_curve(enabled, "prose", ngram, 0.7, 3)  # 1,024 tokens: no gain yet
    assert first_rejected(at_1k) == pytest.approx(1 - at_reference[0])
    assert first_rejected(at_16k) < first_rejected(at_1k)
    # without the slope the engine keeps one curve whatever the context
    plain = Engine(l40s(), ngram)
    assert plain._cumulative(seq(16000, 384), 3) == plain._cumulative(seq(10, 0), 3)
