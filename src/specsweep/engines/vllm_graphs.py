"""vLLM: the widths (tokens one step runs) a server captured CUDA graphs for, from its command.

A vLLM server does not say which widths it captured; they follow from its flags, its
``--speculative-config`` and its version. :func:`captured_widths` gives them as a decode step
pads to them: a step verifying ``B * (1 + k)`` tokens runs the smallest width that holds them.
The rule is read from vLLM 0.32.0's and 0.33.0's source (the same in both; docs/engines.md
"CUDA graph widths" gives the files and lines), in three stages:

1. the capture sizes (``VllmConfig._set_cudagraph_sizes``): the default grid 1, 2, 4, 8 to 248
   by 8, 256 and up by 16, up to ``min(2 * max_num_seqs * (1 + k), 512)`` (1024 on data-centre
   Blackwell); ``max_num_batched_tokens`` when it fits; with speculation, ``n * (1 + k)`` for the
   request counts ``n`` of the same grid, one such set per draft length a per-batch-size table
   runs; explicit ``cudagraph_capture_sizes`` replace all of it;
2. the CUDA graph mode: ``--enforce-eager``, ``-O0`` or ``cudagraph_mode`` NONE capture nothing;
   a per-batch-size table on the V1 model runner turns full graphs into piecewise ones;
3. with speculation and full decode graphs, the sizes rounded up to a multiple of ``1 + k``:
   by ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` on the V1 model runner, by
   the V2 runner's ``CudaGraphManager._init_candidates`` (which also caps them at
   ``max_num_seqs * (1 + k)``) on V2, the runner a GPU with Triton uses unless the method
   needs V1 (suffix, custom_class; medusa and mlp_speculator in 0.32).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specsweep.engines.versions import version_numbers
from specsweep.errors import ConfigError
from specsweep.types import SpeculativeConfig

# The versions whose rule was read (the same rule in both).
RULE_VERSIONS = ("0.32", "0.33")
# Speculative methods the V2 model runner does not take, so the server runs V1
# (config/vllm.py _get_v2_model_runner_unsupported_features: 0.32 line 2928, 0.33 line 3067).
V1_ONLY_METHODS = {"0.32": ("suffix", "medusa", "mlp_speculator", "custom_class"), "0.33": ("suffix", "custom_class")}
# Methods whose per-batch-size table V1 keeps in 0.33 (_maybe_disable_dynamic_sd_for_v1, lines 1088-1107).
V1_TABLE_METHODS_033 = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")

ModelRunner = Literal["v1", "v2"]
# CUDAGraphMode (config/compilation.py 59-63): (decode graphs, mixed-batch graphs, separate routine).
_MODES = {
    "NONE": ("none", "none", False),
    "PIECEWISE": ("piecewise", "piecewise", False),
    "FULL": ("full", "full", False),
    "FULL_DECODE_ONLY": ("full", "none", True),
    "FULL_AND_PIECEWISE": ("full", "piecewise", True),
}
# Default cudagraph_mode per optimization level (config/vllm.py OPTIMIZATION_LEVEL_0N).
_MODE_BY_LEVEL = {0: "NONE", 1: "PIECEWISE", 2: "FULL_AND_PIECEWISE", 3: "FULL_AND_PIECEWISE"}
_COMPILE_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
# Flags that take one value, and the GraphFlags field it sets ("compilation": a JSON object).
_VALUE_FLAGS = {
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-cudagraph-capture-size": "max_capture_size",
    "--data-parallel-size": "data_parallel_size",
    "-dp": "data_parallel_size",
    "--performance-mode": "performance_mode",
    "--optimization-level": "optimization_level",
    "-O": "optimization_level",
    "--compilation-config": "compilation",
    "-cc": "compilation",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmGpu:
    """What of the GPU the widths depend on: the OpenAI server's defaults for the flags a command
    leaves out (``engine/arg_utils.py`` ``get_batch_defaults``) and the default ceiling of the
    capture grid (512; 1024 on compute-capability family 100, B200 and B300)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    capture_ceiling: int = 512


SMALL_GPU = VllmGpu()  # under 70 GiB, any A100, and (0.33) GB10
LARGE_GPU = VllmGpu(max_num_seqs=1024, max_num_batched_tokens=8192)  # 70 GiB or more: H100, H200
BLACKWELL_GPU = VllmGpu(max_num_seqs=1024, max_num_batched_tokens=16384, capture_ceiling=1024)  # 160 GiB+: B200


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphFlags:
    """What a ``vllm serve`` command says of its CUDA graphs (None: the flag is not given)."""

    enforce_eager: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_capture_size: int | None = None
    capture_sizes: tuple[int, ...] | None = None
    cudagraph_mode: str | None = None
    compile_mode: int | None = None
    optimization_level: int = 2
    performance_mode: str = "balanced"
    data_parallel_size: int = 1
    config_file: bool = False  # --config FILE: flags this function cannot read


def captured_widths(
    version: str | None,
    argv: Sequence[str],
    spec: SpeculativeConfig | None,
    *,
    gpu: VllmGpu = SMALL_GPU,
    model_runner: ModelRunner | None = None,
) -> tuple[int, ...] | None:
    """The token widths a decode step of a vLLM ``version`` server started with ``argv`` (its
    command without ``--speculative-config``) and ``spec`` (None: speculation off) runs with a
    CUDA graph, sorted; ``()`` when it runs eagerly. None when it cannot be said: a version
    whose rule was not read, a ``--config`` file, a spec without ``num_speculative_tokens``.

    ``model_runner`` None is the runner vLLM picks on a GPU with Triton (V2 unless the method
    needs V1); the environment variable ``VLLM_USE_V2_MODEL_RUNNER`` overrides it on a server.
    With a per-batch-size table the result holds the widths of every draft length it runs."""
    if not _rule_read(version):
        return None
    flags = read_graph_flags(argv)
    k = 0 if spec is None else spec.num_speculative_tokens
    if flags.config_file or k is None:
        return None
    assert version is not None
    release = "0.32" if version_numbers(version)[:2] == (0, 32) else "0.33"
    if model_runner is None:
        v1_only = spec is not None and (
            spec.method in V1_ONLY_METHODS[release]
            or (bool(spec.extra.get("parallel_drafting")) and spec.method not in ("dflash", "dspark"))
        )
        model_runner = "v1" if v1_only else "v2"
    table = spec is not None and bool(spec.num_speculative_tokens_per_batch_size)
    if table and flags.data_parallel_size > 1:
        table = False  # _maybe_disable_dynamic_sd_for_data_parallel
    if table and release == "0.33" and model_runner == "v1" and spec is not None:
        table = spec.method in V1_TABLE_METHODS_033
    mode = graph_mode(flags, model_runner=model_runner, table=table)
    if flags.enforce_eager or mode == "NONE":
        return ()
    max_num_seqs, max_num_batched_tokens = _batch_limits(flags, gpu)
    query_lens = _decode_query_lens(spec, k, max_num_seqs, table=table)
    sizes = _capture_sizes(flags, gpu, max_num_seqs, max_num_batched_tokens, 1 + k, query_lens)
    if not sizes:
        return ()
    decode, _, separate = _MODES[mode]
    if model_runner == "v1":
        if decode == "full" and k > 0:
            return _v1_rounded(sizes, 1 + k)
        return tuple(sizes)
    if decode == "full" and separate:
        return _v2_decode_widths(sizes, [q for q, _ in query_lens], max_num_seqs)
    return tuple(sizes)


def _rule_read(version: str | None) -> bool:
    if not version:
        return False
    numbers = version_numbers(version)
    return any(numbers[:2] == version_numbers(known) for known in RULE_VERSIONS)


def read_graph_flags(argv: Sequence[str]) -> GraphFlags:
    """The flags of a ``vllm serve`` command that decide its CUDA graphs, read as vLLM's parser
    reads them (``--flag value`` or ``--flag=value``; ``-O3``; ``-cc JSON`` or ``-cc.key=value``)."""
    values: dict[str, Any] = {}
    compilation: dict[str, Any] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        takes_value = name in _VALUE_FLAGS or name.startswith(("--compilation-config.", "-cc."))
        if arg.startswith("-O") and not arg.startswith("-O="):
            name, eq, inline = "-O", "=" if arg[2:] else "", arg[2:]
            takes_value = True
        given: str = ""
        if takes_value and eq:
            given = inline
        elif takes_value:
            i += 1
            if i >= len(args):
                raise ConfigError(f"server.start: {name} needs a value")
            given = args[i]
        if name in _VALUE_FLAGS and _VALUE_FLAGS[name] != "compilation":
            key = _VALUE_FLAGS[name]
            values[key] = given if key == "performance_mode" else _int(name, given)
        elif name in _VALUE_FLAGS:
            compilation.update(_json_object(name, given))
        elif takes_value:
            try:
                compilation[name.split(".", 1)[1]] = json.loads(given)
            except json.JSONDecodeError:
                compilation[name.split(".", 1)[1]] = given
        elif name in ("--enforce-eager", "--no-enforce-eager"):
            values["enforce_eager"] = name == "--enforce-eager"
        elif name == "--cudagraph-capture-sizes":
            sizes = [_int(name, inline)] if eq else []
            while not eq and i + 1 < len(args) and args[i + 1].isdigit():
                i += 1
                sizes.append(int(args[i]))
            values["capture_sizes"] = tuple(sizes)
        elif name == "--config":
            values["config_file"] = True
        i += 1
    return GraphFlags(**values, **_compilation_values(compilation, given=values))


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"server.start: {flag} takes an integer, got {text!r}") from None


def _json_object(flag: str, text: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"server.start: {flag} is not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"server.start: {flag} takes a JSON object, got {text!r}")
    return raw


def _compilation_values(compilation: dict[str, Any], *, given: dict[str, Any]) -> dict[str, Any]:
    """The compilation-config keys that decide the graphs (``engine/arg_utils.py``: a key given
    both here and as its own flag makes vLLM refuse to start)."""
    out: dict[str, Any] = {}
    if "cudagraph_capture_sizes" in compilation and compilation["cudagraph_capture_sizes"] is not None:
        if "capture_sizes" in given:
            raise ConfigError("server.start: --cudagraph-capture-sizes and -cc cudagraph_capture_sizes both given")
        out["capture_sizes"] = tuple(int(s) for s in compilation["cudagraph_capture_sizes"])
    if compilation.get("max_cudagraph_capture_size") is not None:
        if "max_capture_size" in given:
            raise ConfigError(
                "server.start: --max-cudagraph-capture-size and -cc max_cudagraph_capture_size both given"
            )
        out["max_capture_size"] = int(compilation["max_cudagraph_capture_size"])
    mode = compilation.get("cudagraph_mode")
    if mode is not None:
        names = list(_MODES)
        name = names[mode] if isinstance(mode, int) and 0 <= mode < 3 else str(mode).upper()
        if name not in _MODES:
            raise ConfigError(f"server.start: cudagraph_mode {mode!r} is none of {', '.join(names)}")
        out["cudagraph_mode"] = name
    compile_mode = compilation.get("mode")
    if compile_mode is not None:
        if isinstance(compile_mode, str) and compile_mode.upper() in _COMPILE_MODES:
            out["compile_mode"] = _COMPILE_MODES[compile_mode.upper()]
        elif isinstance(compile_mode, int) and compile_mode in _COMPILE_MODES.values():
            out["compile_mode"] = compile_mode
        else:
            raise ConfigError(f"server.start: compilation mode {compile_mode!r} is none of {', '.join(_COMPILE_MODES)}")
    return out


def graph_mode(flags: GraphFlags, *, model_runner: ModelRunner, table: bool) -> str:
    """The cudagraph mode the server ends with, as ``VllmConfig.__post_init__`` settles it."""
    if flags.enforce_eager:
        return "NONE"
    level = flags.optimization_level
    mode = flags.cudagraph_mode or _MODE_BY_LEVEL.get(level, "FULL_AND_PIECEWISE")
    compile_mode = flags.compile_mode if flags.compile_mode is not None else (3 if level > 0 else 0)
    if table and model_runner == "v1" and mode not in ("NONE", "PIECEWISE"):
        mode = "PIECEWISE"  # _maybe_override_dynamic_sd_cudagraph_mode
    if "PIECEWISE" in mode and compile_mode != _COMPILE_MODES["VLLM_COMPILE"]:
        mode = {"PIECEWISE": "NONE", "FULL_AND_PIECEWISE": "FULL_DECODE_ONLY"}[mode]  # without_piecewise
    if model_runner == "v2" and compile_mode == _COMPILE_MODES["STOCK_TORCH_COMPILE"]:
        mode = "NONE"  # _disable_cudagraphs_for_v2_stock_torch_compile
    return mode


def _batch_limits(flags: GraphFlags, gpu: VllmGpu) -> tuple[int, int]:
    """max_num_seqs and max_num_batched_tokens: the flags, else the GPU's defaults, doubled in
    throughput mode (``_set_default_max_num_seqs_and_batched_tokens_args``)."""
    doubled = 2 if flags.performance_mode == "throughput" else 1
    seqs = flags.max_num_seqs if flags.max_num_seqs is not None else gpu.max_num_seqs * doubled
    tokens = flags.max_num_batched_tokens
    if tokens is None:
        tokens = gpu.max_num_batched_tokens * doubled
    return seqs, tokens


def _decode_query_lens(
    spec: SpeculativeConfig | None, k: int, max_num_seqs: int, *, table: bool
) -> list[tuple[int, int]]:
    """Each query length a decode step runs at (1 + its k), with the widest batch running it."""
    if spec is None or not table:
        return [(1 + k, max_num_seqs)]
    widest: dict[int, int] = {}
    for batch_size in range(1, max_num_seqs + 1):
        widest[1 + spec.k_for_batch_size(batch_size)] = batch_size
    return list(widest.items())


def _grid(top: int) -> list[int]:
    """1, 2, 4, then 8 to 248 by 8, then 256 by 16, none above ``top``."""
    sizes = [n for n in (1, 2, 4) if n <= top]
    if top >= 8:
        sizes += range(8, min(top + 1, 256), 8)
    if top >= 256:
        sizes += range(256, top + 1, 16)
    return sizes


def _capture_sizes(
    flags: GraphFlags,
    gpu: VllmGpu,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    query_len: int,
    query_lens: list[tuple[int, int]],
) -> list[int]:
    """The capture sizes before any rounding (``VllmConfig._set_cudagraph_sizes``)."""
    top = flags.max_capture_size
    decode_sizes: list[int] = []
    if top is None:
        top = min(max_num_seqs * query_len * 2, gpu.capture_ceiling)
        if query_len > 1:
            decode_sizes = sorted(
                {
                    n * q
                    for q, widest in query_lens
                    for n in sorted({*_grid(min(widest, gpu.capture_ceiling)), min(widest, gpu.capture_ceiling)})
                    if n * q <= top
                }
            )
        elif max_num_seqs <= top:
            decode_sizes = [max_num_seqs]
    top = min(max_num_batched_tokens, top)
    if top < 1:
        raise ConfigError(f"vLLM refuses to start: its largest CUDA graph size would be {top}")
    if flags.capture_sizes is not None:
        if not flags.capture_sizes:
            raise ConfigError("vLLM refuses to start: cudagraph_capture_sizes is empty")
        sizes = sorted({s for s in flags.capture_sizes if s <= max_num_batched_tokens})
        if flags.max_capture_size is not None and flags.max_capture_size != (sizes[-1] if sizes else 0):
            raise ConfigError(
                f"vLLM refuses to start: max_cudagraph_capture_size {flags.max_capture_size} is not the "
                f"largest of cudagraph_capture_sizes ({sizes[-1] if sizes else 0})"
            )
        return sizes
    sizes = list(range(1, min(top, 32) + 1)) if flags.performance_mode == "interactivity" else []
    sizes += _grid(top)
    if max_num_batched_tokens <= top:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in decode_sizes if s <= max_num_batched_tokens]
    return sorted(set(sizes))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _v1_rounded(sizes: list[int], query_len: int) -> tuple[int, ...]:
    """``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``."""
    top = sizes[-1]
    rounded = sorted({_round_up(s, query_len) for s in sizes if _round_up(s, query_len) <= top})
    if not rounded and query_len <= top:
        rounded = [query_len]
    if not rounded:
        raise ConfigError(
            f"vLLM refuses to start: no CUDA graph size is left after rounding to a multiple of "
            f"num_speculative_tokens + 1 ({query_len}); the largest is {top}"
        )
    return tuple(rounded)


def _v2_decode_widths(sizes: list[int], query_lens: list[int], max_num_seqs: int) -> tuple[int, ...]:
    """The V2 runner's uniform-decode graphs (``CudaGraphManager._init_candidates``)."""
    top = sizes[-1]
    widths = {_round_up(s, q) for s in sizes for q in query_lens if _round_up(s, q) <= min(top, max_num_seqs * q)}
    return tuple(sorted(widths))
