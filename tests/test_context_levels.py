"""Context levels: a workload measured again at a long prompt (``W@16k``), in the same starts.

Checked against what does not come from the code under test: the emulator's own token counts
(``usage.prompt_tokens``), its profile's ``[context]`` figures through its truth, and the number
of server starts a study without context levels makes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsweep.cli.context_room import refuse_context_levels
from specsweep.cli.study import known_max_model_len
from specsweep.config import parse_context, parse_study_config
from specsweep.context_prompts import context_variant, shared_prefix
from specsweep.emulator.content import PromptReader, classify_content
from specsweep.emulator.model import compute_truth
from specsweep.emulator.prefix_cache import BLOCK_TOKENS, PrefixCache
from specsweep.emulator.profile import DEFAULT_PROFILE, load_profile
from specsweep.errors import ConfigError
from specsweep.rigs.file import write_rig
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.tuning.records import measured_configs
from specsweep.tuning.stored import load_stored_study
from specsweep.tuning.workloads import study_workloads
from specsweep.workload import (
    TOKEN_PATTERN,
    context_variant_name,
    count_tokens,
    load_workload,
    parse_context_variant,
)

from .builders import emulator_study, exact_rig, specsweep, write_study


@given(
    name=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
    tokens=st.integers(min_value=1, max_value=10_000_000),
)
def test_a_variant_name_reads_back(name: str, tokens: int) -> None:
    assert parse_context_variant(context_variant_name(name, tokens)) == (name, tokens)


def test_variant_names() -> None:
    assert context_variant_name("prose", 16384) == "prose@16k"
    assert context_variant_name("studies/mine.jsonl", 65536) == "studies/mine.jsonl@64k"
    assert context_variant_name("prose", 10000) == "prose@10000"
    for plain in ("prose", "a@b", "@16k", "x@016k", "x@0"):
        assert parse_context_variant(plain) == (plain, None)
    assert parse_context("16k, 65536") == (16384, 65536)
    with pytest.raises(ConfigError, match="--context"):
        parse_context("16x")


@pytest.mark.parametrize(("workload", "kind"), [("prose", "prose"), ("technical", "technical")])
def test_a_variant_prompt_is_one_shared_prefix_then_its_own_prompt(workload: str, kind: str) -> None:
    plain = load_workload(workload)
    variant = context_variant(plain, 8192)
    assert variant.name == f"{workload}@8k"
    prefixes = {p.shared_prefix for p in variant.prompts}
    assert len(prefixes) == 1  # one prefix per level: a prefix cache serves it to every request
    prefix = prefixes.pop()
    nonce = "0a1b2c3d4e5f"
    for own, long in zip(plain.prompts, variant.prompts, strict=True):
        sent = long.completion_prompt(nonce)
        assert sent == prefix + own.completion_prompt(nonce)  # the nonce follows the prefix
        assert abs(count_tokens(sent) - 8192) < 0.03 * 8192
    assert classify_content(variant.prompts[0].completion_prompt(nonce)) == kind
    # realistic text, not a repeated filler: at 8k no line of substance repeats
    lines = [line for line in prefix.splitlines() if len(line.strip()) > 40]
    assert len(lines) > 20 and len(set(lines)) > 0.9 * len(lines)
    assert shared_prefix("code", 5000) == shared_prefix("code", 5000)  # deterministic
    assert len(TOKEN_PATTERN.findall(shared_prefix("prose", 70_000))) == 70_000  # longer than the corpus


def test_the_variants_weights() -> None:
    data = emulator_study("w", workloads={"prose": 3.0, "technical": 1.0})
    plain = parse_study_config(data)
    assert study_workloads(plain) == {"prose": 3.0, "technical": 1.0}
    data["measure"] |= {"context": [8192, 16384]}
    assert study_workloads(parse_study_config(data)) == {
        "prose": 3.0, "technical": 1.0, "prose@8k": 0.0, "technical@8k": 0.0, "prose@16k": 0.0, "technical@16k": 0.0,
    }  # fmt: skip
    data["measure"] |= {"context_weight": 0.5}
    weights = study_workloads(parse_study_config(data))
    assert weights["prose"] == 1.5 and weights["prose@8k"] == weights["prose@16k"] == 0.75
    for bad in ({"context_weight": 1.5}, {"context": [0]}, {"context": [8192, 8192]}, {"context": 8192}):
        with pytest.raises(ConfigError, match=r"measure\.context"):
            parse_study_config(emulator_study("w") | {"measure": {"context": [8192], **bad}})


def test_the_emulator_prefills_a_prefix_it_has_seen_once() -> None:
    cache = PrefixCache(capacity_tokens=10_000)
    shared = TOKEN_PATTERN.findall(shared_prefix("prose", 20 * BLOCK_TOKENS))
    first = [*shared, *TOKEN_PATTERN.findall("[0a1b2c3d4e5f] Write a story.")]
    second = [*shared, *TOKEN_PATTERN.findall("[99ffee001122] Write a poem, please.")]
    assert cache.admit(first) == 0
    assert cache.admit(second) == 20 * BLOCK_TOKENS  # the shared blocks, not the request's own
    # a whole prompt seen before: its full blocks (all but its last token at most)
    assert cache.admit(first) == min(len(first) // BLOCK_TOKENS * BLOCK_TOKENS, len(first) - 1)
    exact = shared[: 4 * BLOCK_TOKENS]
    assert cache.admit(exact) == 4 * BLOCK_TOKENS - 1  # its last token is computed again, as vLLM does
    nonce_first = TOKEN_PATTERN.findall("[0a1b2c3d4e5f] ") + shared
    assert cache.admit(nonce_first) == 0  # a nonce at the start: never served, as every plain request


@pytest.mark.parametrize("workload", ["prose", "technical"])
def test_the_emulator_reads_a_long_prompt_as_a_whole_reading_does(workload: str) -> None:
    reader = PromptReader()
    variant = context_variant(load_workload(workload), 65536)
    for nonce, prompt in zip(("0a1b2c3d4e5f", "99ffee001122", "0a1b2c3d4e5f"), variant.prompts, strict=False):
        for text in (prompt.completion_prompt(nonce), prompt.text(), "[x]" + prompt.completion_prompt(nonce)):
            assert reader.read(text) == (TOKEN_PATTERN.findall(text), classify_content(text))
    edge = "word " * 40_000 + "{}" * 30_000  # prose at its head, technical in all
    assert reader.read(edge) == (TOKEN_PATTERN.findall(edge), classify_content(edge)) == (
        TOKEN_PATTERN.findall(edge), "technical")  # fmt: skip


def _context_profile(folder: Path) -> Path:
    """The default profile with a KV read that 8k tokens of context make visible (about +60% on a
    step at concurrency 1), and no jitter."""
    text = (Path(__file__).parents[1] / "src/specsweep/emulator/profiles" / f"{DEFAULT_PROFILE}.toml").read_text(
        encoding="utf-8"
    )
    text = re.sub(r"(?m)^kv_bytes_per_token = .*$", "kv_bytes_per_token = 1.6e6", text)
    text = re.sub(r"(?m)^jitter = .*$", "jitter = 0.0", text)
    path = folder / "context-profile.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _starts(output: str) -> int:
    found = re.search(r"\((\d+) server starts this run\)", " ".join(output.split()))  # lines wrap
    assert found, output
    return int(found.group(1))


def test_a_study_measures_each_context_level_in_the_same_starts(tmp_path: Path) -> None:
    profile = _context_profile(tmp_path)
    options = dict(
        profile=str(profile), k=(2, 2), requests=3, max_tokens=40, concurrency=(1,), temperature=0.6, time_scale=20,
        study={"sampler": "grid"}, search={"draft_sample_method": ["probabilistic"]},
    )  # fmt: skip
    plain = write_study(tmp_path / "plain.toml", emulator_study("plain", **options))
    with_context = emulator_study("long", **options)
    with_context["measure"] |= {"context": [8192]}
    long = write_study(tmp_path / "long.toml", with_context)
    studies = tmp_path / "studies"
    ran = {}
    for name, path in (("plain", plain), ("long", long)):
        done = specsweep("study", "--config", str(path), "--studies-dir", str(studies), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        ran[name] = done.stdout
    assert _starts(ran["long"]) == _starts(ran["plain"]) == 2  # speculation off and k=2: context adds no start

    # the report has one cell per (workload@context, concurrency) and says how the long prompts are built
    report = specsweep("report", str(studies / "long"), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    results = json.loads((studies / "long" / "report" / "results.json").read_text(encoding="utf-8"))
    assert {r["workload"] for r in results["recommendations"]} == {"prose", "prose@8k"}
    assert "prompt_tokens_mean" in (studies / "long" / "report" / "results.csv").read_text(encoding="utf-8")
    assert "W@16k is W at a context level" in (studies / "long" / "report" / "report.md").read_text(encoding="utf-8")

    configs = measured_configs(load_stored_study(studies / "long"))
    assert len(configs) == 2
    for config in configs:
        assert list(config.results) == ["prose", "prose@8k"]  # the plain levels first
        short, long_level = config.level("prose", 1), config.level("prose@8k", 1)
        assert short is not None and long_level is not None
        # the server's own count (usage.prompt_tokens) of the variant's prompts
        assert long_level.prompt_tokens_mean is not None and abs(long_level.prompt_tokens_mean - 8192) < 0.1 * 8192
        assert short.prompt_tokens_mean is not None and short.prompt_tokens_mean < 600
        # decode steps per second at 8k against the short level's, as the profile's [context]
        # figures predict them (the truth's step time; drafts accepted per step divided out)
        spec = config.spec
        step_s = {
            tokens: compute_truth(
                load_profile(profile), spec, 0.6, [1], max_tokens=40, prompt_tokens={"prose": round(tokens)}
            )["prose"].levels[0].step_time_s
            for tokens in (short.prompt_tokens_mean, long_level.prompt_tokens_mean)
        }  # fmt: skip
        predicted = step_s[short.prompt_tokens_mean] / step_s[long_level.prompt_tokens_mean]
        assert predicted < 0.75  # the profile makes the context matter
        assert short.decode_tokens_per_s_p50 and long_level.decode_tokens_per_s_p50
        measured = (long_level.decode_tokens_per_s_p50 / (long_level.mean_acceptance_length or 1.0)) / (
            short.decode_tokens_per_s_p50 / (short.mean_acceptance_length or 1.0)
        )
        assert measured == pytest.approx(predicted, rel=0.1), (config.key, measured, predicted)


def test_a_context_level_beyond_the_max_model_length_is_refused_before_any_start(tmp_path: Path) -> None:
    data = emulator_study("too-long")
    data["measure"] |= {"context": [8192, 400_000]}
    path = write_study(tmp_path / "study.toml", data)
    done = specsweep("study", "--config", str(path), "--studies-dir", str(tmp_path / "studies"), cwd=tmp_path)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "context level 400,000" in lines[0] and "max model length (400,000" in lines[0]
    assert not (tmp_path / "studies").exists()  # nothing created, nothing started
    flag = specsweep("study", "--workload", "prose", "--context", "512k", "--dry-run", cwd=tmp_path)
    assert flag.returncode == 2 and "--context: context level 524,288" in flag.stderr


def test_a_context_level_beyond_a_known_kv_pool_is_refused_before_any_start(tmp_path: Path) -> None:
    data = emulator_study("pool", concurrency=(1, 4), max_tokens=64)
    data["measure"] |= {"context": [16384]}
    data["server"] = {
        "engine": "vllm",
        "start": "vllm serve m --port {port} --max-model-len 32768 --num-gpu-blocks-override 3000 {spec_args}",
    }
    path = write_study(tmp_path / "study.toml", data)
    done = specsweep("study", "--config", str(path), "--dry-run", cwd=tmp_path)
    assert done.returncode == 1
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    # 4 sequences of 16,384 + 64 tokens against 3,000 blocks of vLLM's 16 tokens
    assert "4 sequences at context level 16,384" in lines[0] and "65,792 KV tokens" in lines[0]
    assert "(48,000, 3,000 blocks of 16 tokens (--num-gpu-blocks-override in server.start))" in lines[0]
    data["server"]["start"] = data["server"]["start"].replace("3000", "5000")  # 80,000 tokens: they fit
    fits = specsweep("study", "--config", str(write_study(path, data)), "--dry-run", cwd=tmp_path)
    assert fits.returncode == 0 and "context levels: 16,384 tokens" in fits.stdout, fits.stdout + fits.stderr


def test_study_with_a_rig_without_context_levels_refuses_them_before_any_start(tmp_path: Path) -> None:
    """A rig that measured no context level has no context in its step model: one line, what to do."""
    rig = tmp_path / "rig.json"
    write_rig(rig, exact_rig(DEFAULT_PROFILE, "dspark", k_max=4))
    path = write_study(tmp_path / "study.toml", emulator_study("rigged"))
    done = specsweep("study", "--config", str(path), "--rig", str(rig), "--context", "8k", cwd=tmp_path)
    assert done.returncode == 1
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, lines
    assert "study 'rigged' asks for context 8k, but the rig measured no context level" in lines[0]
    assert "(measure.context, or study --context)" in lines[0]
    assert not list((tmp_path / "studies").glob("*/logs/*.log"))  # nothing started


def test_llamacpp_keeps_its_prompt_cache_for_a_context_levels_shared_prefix_only() -> None:
    """llama.cpp is asked not to reuse its prompt cache (``cache_prompt: false``) for a workload's
    own prompts, and to reuse it for a context level's: its requests share their long prefix on
    purpose, and without the cache every one would prefill its whole context."""
    sent: list[dict] = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":
            return httpx.Response(404)
        sent.append(json.loads(request.content))
        events = [
            {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
            {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}},
        ]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    settings = MeasureSettings(
        endpoint="http://server", engine="llama.cpp", api="completions", model="m", concurrency=(1,),
        requests=1, warmup=0, max_tokens=2, temperature=0.0,
    )  # fmt: skip
    plain = load_workload("technical")
    for workload in (plain, context_variant(plain, 4096)):
        run_measure(settings, workload, transport=httpx.MockTransport(server))
    assert [body["cache_prompt"] for body in sent] == [False, True]


def test_the_real_llamacpp_context_bench_sizes_its_server_for_its_longest_level() -> None:
    """bench/context_real_llamacpp.py's study: llama-server's -c (base_argv's ``context``) holds
    16k and the output, and the 4,096 the other real-engine benches pass is refused before a start."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))  # it imports rig_real_llamacpp's command line from beside it
    try:
        module = importlib.import_module("context_real_llamacpp")
    finally:
        sys.path.remove(str(bench))
    args = argparse.Namespace(
        server="llama-server", target="m.gguf", ctx_size=32768, threads=1, k=[3, 6], workloads=["technical"],
        max_tokens=64, max_requests=4, context=parse_context("4k,16k"),
    )  # fmt: skip
    config = parse_study_config(module.study_data(args))
    refuse_context_levels(config, known_max_model_len(config.server), key="--context")
    small = parse_study_config(module.study_data(argparse.Namespace(**{**vars(args), "ctx_size": 4096})))
    with pytest.raises(ConfigError, match=r"context level 16,384 .* \(4,096, -c in server.start\)"):
        refuse_context_levels(small, known_max_model_len(small.server), key="--context")
