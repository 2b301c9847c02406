"""Run by SGLang's own interpreter (a venv with the sglang 0.5.23 wheel and CPU torch): parse each
command line with SGLang's server-argument parser and run its resolution pipeline (the
speculative hooks included), as ``sglang serve`` does before it loads anything, and read back
what the speculative fields resolved to.

No GPU is needed: the resolution reads config files and the ``--device`` given. One stand-in: PyPI
ships torchvision for Linux only as CUDA builds, which fail to load beside CPU torch, and
``sglang.srt.configs`` imports it at module level for multimodal preprocessing that resolution
never runs; an inert module takes its place (transformers has already found it absent).

stdin: {"cases": [[argv...], ...]}
stdout: one JSON list, per case {"ok": bool, "error": str | None, "resolved": {field: value}}
"""

import json
import sys
import types

import transformers.utils.import_utils  # noqa: F401  decides torchvision is absent before the stand-in exists


class _Inert(types.ModuleType):
    def __getattr__(self, name: str) -> "_Inert":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(f"{self.__name__}.{name}")


for _name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
    sys.modules[_name] = _Inert(_name)

from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "speculative_adaptive_config",
    "speculative_draft_model_revision",
    "speculative_draft_model_quantization",
)


def resolve(argv: list[str]) -> dict:
    try:
        args = prepare_server_args(argv)
        args.resolve_once()
    # SGLang refuses with ValueError, AssertionError or NotImplementedError; any failure is one case's result.
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600], "resolved": None}
    view = resolved_view(args)
    return {"ok": True, "error": None, "resolved": {name: getattr(view, name) for name in FIELDS}}


def main() -> None:
    request = json.load(sys.stdin)
    print(json.dumps([resolve(argv) for argv in request["cases"]]))


if __name__ == "__main__":
    main()
