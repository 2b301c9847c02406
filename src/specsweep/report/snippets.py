"""Config snippets ready to paste, in each engine's own syntax.

Every vLLM form carries the same compact JSON: ``--speculative-config '{...}'`` on a command
line (``json.loads`` takes it after shell unquoting), a YAML string for ``vllm serve --config``
files (a string, not a mapping, because older vLLM releases pass mapping values to the parser
as Python reprs), and list items for a docker compose ``command:``.
"""

from __future__ import annotations

import json
import shlex

from specsweep.engines import llamacpp, sglang
from specsweep.types import SpeculativeConfig

FORMATS = ("vllm", "vllm-yaml", "compose", "sglang", "llama.cpp", "json")


def _yaml_single_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render_snippet(spec: SpeculativeConfig | None, fmt: str = "vllm") -> str:
    """The flags (or file fragment) that set ``spec`` on the server; speculation off when None."""
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
        args = llamacpp.render_spec_args(spec)
        return " ".join(shlex.quote(a) for a in args) if args else "--spec-type none"
    if fmt == "sglang":
        args = sglang.render_spec_args(spec)
        return " ".join(shlex.quote(a) for a in args) if args else "# speculation off: no --speculative-* flags"
    raise ValueError(f"unknown snippet format {fmt!r}; choose one of {', '.join(FORMATS)}")


def snippet_format_for(engine: str) -> str:
    """The snippet format that fits a study's engine."""
    return {"llama.cpp": "llama.cpp", "sglang": "sglang"}.get(engine, "vllm")
