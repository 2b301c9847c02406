"""Config snippets ready to paste, in each engine's own syntax.

Every vLLM form carries the same compact JSON: ``--speculative-config '{...}'`` on a command
line (``json.loads`` takes it after shell unquoting), a YAML string for ``vllm serve --config``
files (a string, not a mapping, because older vLLM releases pass mapping values to the parser
as Python reprs), and list items for a docker compose ``command:``.

SGLang and llama.cpp speak their own flags (engines/sglang.py, engines/llamacpp.py): a llama.cpp
paste uses the flag names of the build the study read (``help_flags``), and an SGLang paste with
a per-batch-size table names its adaptive config file, written beside the study
(:func:`write_adaptive_config`), or carries the file's text as comment lines.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

from specsweep.engines import llamacpp, sglang
from specsweep.names import file_part
from specsweep.runtime.store import write_atomic
from specsweep.types import SpeculativeConfig

FORMATS = ("vllm", "vllm-yaml", "compose", "sglang", "llama.cpp", "json")


def _yaml_single_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render_snippet(
    spec: SpeculativeConfig | None,
    fmt: str = "vllm",
    *,
    help_flags: frozenset[str] | None = None,
    adaptive_config_path: Path | None = None,
) -> str:
    """The flags (or file fragment) that set ``spec`` on the server; speculation off when None.

    ``help_flags``: the llama.cpp build's flag names, as the study read them; ``adaptive_config_path``:
    where SGLang's adaptive config for ``spec``'s table was written (None: shown inline)."""
    if fmt == "vllm":
        if spec is None:
            return "# speculation off: remove --speculative-config"
        return f"--speculative-config {shlex.quote(spec.to_json())}"
    if fmt == "vllm-yaml":
        if spec is None:
            return "# speculation off: remove speculative-config"
        return f"speculative-config: {_yaml_single_quoted(spec.to_json())}"
    if fmt == "compose":
        if spec is None:
            return "# speculation off: remove --speculative-config and its value from the service's command"
        return "\n".join(
            (
                "    command:  # add to the vLLM service's command list",
                "      - --speculative-config",
                f"      - {_yaml_single_quoted(spec.to_json())}",
            )
        )
    if fmt == "json":
        return "null" if spec is None else json.dumps(json.loads(spec.to_json()), indent=2)
    if fmt == "llama.cpp":
        lines = []
        if spec is not None and spec.num_speculative_tokens:
            spec_type = llamacpp.spec_type_of(spec.method, spec.extra.get("spec_type"))
            if spec_type in llamacpp.MODEL_TYPES and not spec.model:
                lines.append(f"# {spec_type} needs its draft GGUF: put its path for DRAFT.gguf")
                spec = replace(spec, model="DRAFT.gguf")
            if spec.draft_sample_method != "greedy" and spec_type not in llamacpp.SAMPLING_TYPES:
                lines.append(
                    f"# {spec_type} takes the draft's top token: draft_sample_method "
                    f"{spec.draft_sample_method} is not a llama.cpp choice there"
                )
        args = llamacpp.render_spec_args(spec, flags=help_flags)
        return "\n".join([*lines, " ".join(shlex.quote(a) for a in args) if args else "--spec-type none"])
    if fmt == "sglang":
        path = str(adaptive_config_path) if adaptive_config_path is not None else None
        args = sglang.render_spec_args(spec, adaptive_config_path=path)
        if not args:
            return "# speculation off: no --speculative-* flags"
        text = " ".join(shlex.quote(a) for a in args)
        if spec is not None and spec.draft_sample_method != "greedy":
            text = (
                f"# SGLang has no draft sampling choice: draft_sample_method {spec.draft_sample_method} "
                "is not pasted\n" + text
            )
        if spec is not None and spec.num_speculative_tokens_per_batch_size:
            text += (
                "\n# SGLang pads a batch up to its next CUDA-graph batch size before it picks the range: a range "
                "starting at S holds from S when S-1 is one of those sizes (--cuda-graph-bs-decode)"
            )
        if spec is not None and spec.num_speculative_tokens_per_batch_size and adaptive_config_path is None:
            body = sglang.adaptive_config_text(spec.num_speculative_tokens_per_batch_size)
            text += f"\n# {sglang.ADAPTIVE_CONFIG_NAME}, the per-batch-size choice (one candidate pins each range):\n"
            text += "\n".join("# " + line for line in body.splitlines())
        return text
    raise ValueError(f"unknown snippet format {fmt!r}; choose one of {', '.join(FORMATS)}")


def snippet_format_for(engine: str) -> str:
    """The snippet format that fits a study's engine."""
    return {"llama.cpp": "llama.cpp", "sglang": "sglang"}.get(engine, "vllm")


def write_adaptive_config(spec: SpeculativeConfig | None, folder: Path, workload: str) -> Path | None:
    """Write SGLang's adaptive config for ``spec``'s per-batch-size table into ``folder``
    (``sglang-adaptive-WORKLOAD.json``); None when there is no table to write."""
    if spec is None or not spec.num_speculative_tokens_per_batch_size:
        return None
    path = folder / f"sglang-adaptive-{file_part(workload)}.json"
    write_atomic(path, sglang.adaptive_config_text(spec.num_speculative_tokens_per_batch_size))
    return path
