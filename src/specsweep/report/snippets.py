"""Config snippets ready to paste, in each engine's own syntax."""

from __future__ import annotations

import json
import shlex

from specsweep.engines import llamacpp, sglang
from specsweep.types import SpeculativeConfig


def render_snippet(spec: SpeculativeConfig | None, fmt: str = "vllm") -> str:
    """The flags (or file fragment) that set ``spec`` on the server; speculation off when None."""
    if fmt == "vllm":
        if spec is None:
            return "# speculation off: remove --speculative-config"
        return f"--speculative-config {shlex.quote(spec.to_json())}"
    if fmt == "vllm-yaml":
        if spec is None:
            return "# speculation off: remove speculative-config"
        return "speculative-config: " + json.dumps(json.loads(spec.to_json()))
    if fmt == "json":
        return "null" if spec is None else spec.to_json()
    if fmt == "llama.cpp":
        args = llamacpp.render_spec_args(spec)
        return " ".join(shlex.quote(a) for a in args) if args else "--spec-type none"
    if fmt == "sglang":
        args = sglang.render_spec_args(spec)
        return " ".join(shlex.quote(a) for a in args) if args else "# speculation off: no --speculative-* flags"
    raise ValueError(f"unknown snippet format {fmt!r}")
