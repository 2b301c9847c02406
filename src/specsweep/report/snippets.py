"""Config snippets ready to paste, in each engine's own syntax.

Every vLLM form carries the same compact JSON: ``--speculative-config '{...}'`` on a command
line (``json.loads`` takes it after shell unquoting), a YAML string for ``vllm serve --config``
files (a string, not a mapping, because older vLLM releases pass mapping values to the parser
as Python reprs), and list items for a docker compose ``command:``.

SGLang and llama.cpp speak their own flags (engines/sglang.py, engines/llamacpp.py): a llama.cpp
paste uses the flag names of the build the study read (``help_flags``), and an SGLang paste with
a per-batch-size table is self-contained: it carries the adaptive config's text in a heredoc that
writes it at an absolute path on the server, then the flags naming that path. SGLang opens the
file while it parses its arguments, so a path relative to where specsweep ran would fail on
another host or in a container, and a copy step would need a second path for each side.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import PurePosixPath

from specsweep.engines import llamacpp, sglang
from specsweep.names import file_part
from specsweep.types import SpeculativeConfig

FORMATS = ("vllm", "vllm-yaml", "compose", "sglang", "llama.cpp", "json")
HEREDOC_END = "SGLANG_ADAPTIVE"  # ends the heredoc that writes an adaptive config


def _yaml_single_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render_snippet(
    spec: SpeculativeConfig | None,
    fmt: str = "vllm",
    *,
    help_flags: frozenset[str] | None = None,
    adaptive_config_path: PurePosixPath | None = None,
) -> str:
    """The flags (or file fragment) that set ``spec`` on the server; speculation off when None.

    ``help_flags``: the llama.cpp build's flag names, as the study read them; ``adaptive_config_path``:
    the absolute path on the server where an SGLang paste writes the adaptive config of ``spec``'s
    table (None: ``/tmp/sglang-adaptive.json``)."""
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
        return _sglang_paste(spec, adaptive_config_path or sglang.ADAPTIVE_CONFIG_PATH)
    raise ValueError(f"unknown snippet format {fmt!r}; choose one of {', '.join(FORMATS)}")


def snippet_format_for(engine: str) -> str:
    """The snippet format that fits a study's engine."""
    return {"llama.cpp": "llama.cpp", "sglang": "sglang"}.get(engine, "vllm")


def adaptive_config_path_for(workload: str) -> PurePosixPath:
    """Where an SGLang paste writes a workload's adaptive config on the server."""
    return PurePosixPath("/tmp") / f"sglang-adaptive-{file_part(workload)}.json"


def _sglang_paste(spec: SpeculativeConfig | None, path: PurePosixPath) -> str:
    """SGLang's flags; with a per-batch-size table, first the lines that write its adaptive config
    at ``path`` on the server (a quoted heredoc: run where the server starts, in its container
    too), then the flags naming that absolute path, which SGLang opens while parsing them."""
    args = sglang.render_spec_args(spec, adaptive_config_path=str(path))
    if spec is None or not args:
        return "# speculation off: no --speculative-* flags"
    lines = []
    if spec.draft_sample_method != "greedy":
        lines.append(
            f"# SGLang has no draft sampling choice: draft_sample_method {spec.draft_sample_method} is not pasted"
        )
    table = spec.num_speculative_tokens_per_batch_size
    if table:
        body = sglang.adaptive_config_text(table)
        lines.append(
            "# run first where the server starts (in its container too): it writes the adaptive config, one "
            "candidate pinning each range, that the flags below name"
        )
        lines += [f"cat > {shlex.quote(str(path))} <<'{HEREDOC_END}'", *body.splitlines(), HEREDOC_END]
    lines.append(" ".join(shlex.quote(a) for a in args))
    if table:
        lines.append(
            "# SGLang pads a batch up to its next CUDA-graph batch size before it picks the range: a range "
            "starting at S holds from S when S-1 is one of those sizes (--cuda-graph-bs-decode)"
        )
    return "\n".join(lines)
