"""A workload at a context level: every prompt behind one long shared text of realistic tokens.

A decode step reads each sequence's KV cache, so the draft length that pays moves with the
context a request carries. A context level (``measure.context``) measures each workload ``W`` a
second time as ``W@16k`` (the name: ``workload.context_variant_name``): each request is the
level's shared prefix, then the request's own prompt with its nonce, about ``level`` tokens in
all (``workload.count_tokens`` estimates them; the server's ``usage.prompt_tokens`` says them).

The prefix is one text per level and workload kind, the same for every request of the level,
so a server's prefix cache holds it after the first request (a warm-up) and the level measures
decoding at that context rather than the prefill of it; only the text after the prefix (the
nonce, then the prompt) is new to the server each time. Its text is realistic and needs no
network: for a technical workload, the Python standard library's own source files (sorted by
name, private modules left out), present wherever Python is; for any other, the bundled prose
workload's texts, in file order, then again in seeded shuffled orders when a level needs more.
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import replace
from functools import cache
from pathlib import Path

from specsweep.errors import WorkloadError
from specsweep.workload import (
    TOKEN_PATTERN,
    Workload,
    context_variant_name,
    count_tokens,
    load_workload,
    parse_context_variant,
)

PREFIX_KINDS = ("prose", "code")
CODE_WORKLOADS = ("technical",)  # bundled workloads whose prefix is code; every other one's is prose
_SEPARATOR = "\n\n"  # between the shared prefix and the request's own text
_NONCE_SAMPLES = 64  # nonces counted to estimate what a request's nonce adds


def prefix_kind(workload: Workload) -> str:
    """``code`` for a technical workload (the bundled ``technical``, or one whose prompts are
    mostly code: a workload of code subcategories), ``prose`` for any other."""
    if workload.name in CODE_WORKLOADS:
        return "code"
    kinds = workload.subcategories()
    code = sum(n for tag, n in kinds.items() if tag in ("code", "data", "config", "sql"))
    return "code" if code * 2 > len(workload.prompts) else "prose"


def own_tokens(workload: Workload) -> float:
    """A request's own tokens on average: its prompt with a nonce (what follows the shared prefix)."""
    draw = random.Random(0)
    nonces = [f"{draw.getrandbits(48):012x}" for _ in range(_NONCE_SAMPLES)]
    nonce_tokens = sum(count_tokens(f"[{n}] ") for n in nonces) / len(nonces)
    return nonce_tokens + sum(count_tokens(p.text()) for p in workload.prompts) / len(workload.prompts)


def shared_prefix(kind: str, tokens: int) -> str:
    """The first ``tokens`` tokens (as ``count_tokens`` counts) of the ``kind`` corpus, and the
    separator that ends a prefix; the same text for the same arguments on one machine."""
    if kind not in PREFIX_KINDS:
        raise ValueError(f"prefix kind is one of {PREFIX_KINDS}, not {kind!r}")
    if tokens < 1:
        return ""
    text = ""
    passes = 0
    while True:
        text += _corpus(kind, passes)
        passes += 1
        matches = list(TOKEN_PATTERN.finditer(text))
        if len(matches) >= tokens:
            return text[: matches[tokens - 1].end()] + _SEPARATOR


def context_variant(workload: Workload, context_tokens: int) -> Workload:
    """``workload`` at a context level: every prompt behind the level's one shared prefix, about
    ``context_tokens`` tokens per request in all; named ``W@16k``."""
    room = round(context_tokens - own_tokens(workload) - count_tokens(_SEPARATOR))
    if room < 1:
        raise WorkloadError(
            f"context level {context_tokens:,} is not above workload {workload.name}'s own prompts "
            f"(about {own_tokens(workload):,.0f} tokens): measure.context levels must be longer than the prompts."
        )
    kind = prefix_kind(workload)
    prefix = shared_prefix(kind, room)
    return Workload(
        name=context_variant_name(workload.name, context_tokens),
        source=f"{workload.source}, behind {room:,} tokens of shared {kind} text",
        prompts=tuple(replace(p, shared_prefix=prefix) for p in workload.prompts),
        format=workload.format,
        notes=workload.notes,
    )


def load_workload_or_level(name: str) -> Workload:
    """A workload as ``load_workload`` finds it, or, named ``W@16k`` and not a file of that name,
    workload ``W`` at that context level."""
    base, level = parse_context_variant(name)
    if level is None or Path(name).is_file():
        return load_workload(name)
    return context_variant(load_workload(base), level)


def _corpus(kind: str, passes: int) -> str:
    """One pass over the ``kind`` corpus: its first pass in its own order, later prose passes in a
    seeded shuffled order of its passages (code passes continue the next files)."""
    if kind == "code":
        return _code_corpus(passes)
    passages = list(_prose_passages())
    if passes:
        random.Random(f"context-prose:{passes}").shuffle(passages)
    return _SEPARATOR.join(passages) + _SEPARATOR


@cache
def _prose_passages() -> tuple[str, ...]:
    return tuple(p.text() for p in load_workload("prose").prompts)


_CODE_FILES_PER_PASS = 8


def _code_corpus(passes: int) -> str:
    """The standard library's public modules' source, eight files a pass (cycling if it runs out)."""
    files = _stdlib_files()
    if not files:
        raise WorkloadError(
            f"no Python standard library sources in {sysconfig.get_paths()['stdlib']}: a technical "
            "workload's context prefix is read from them."
        )
    chosen = [files[(passes * _CODE_FILES_PER_PASS + i) % len(files)] for i in range(_CODE_FILES_PER_PASS)]
    return "".join(f"# {path.name}\n{_read(path)}\n" for path in chosen)


@cache
def _stdlib_files() -> tuple[Path, ...]:
    folder = Path(sysconfig.get_paths()["stdlib"])
    return tuple(p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_") and p.is_file())


@cache
def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
