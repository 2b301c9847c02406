"""Workloads: JSON Lines files of prompts, bundled (``prose``, ``technical``) or the user's own.

One JSON object per line, either a plain prompt or OpenAI chat messages:

    {"id": "prose-01", "subcategory": "story", "prompt": "Continue the story ..."}
    {"id": "t-7", "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}

``id`` and ``subcategory`` are optional. Blank lines and lines starting with ``//`` are skipped.
A file in another format (ShareGPT, OpenAI chat JSON Lines, plain text) is read through
workload_formats.py into the same records.
Every request specsweep sends carries a fresh nonce at the very start of its first message, so
a prefix cache can never serve a repeated prompt and fake a short time to first token. A
prompt of a context level (``W@16k``, context_prompts.py) carries a long shared text before
it, which the nonce follows: that text is the one part a prefix cache may serve.

A text's length in tokens is estimated one way everywhere (``count_tokens``): the emulator
counts a prompt so, and a context level's shared text is cut to length so.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specsweep.errors import WorkloadError
from specsweep.workload_formats import Converted, detect_and_convert, json_lines

# Letters in runs of up to 6, digits in runs of up to 3, any other non-space character on its own:
# close to a real BPE tokenizer for English (about 1.3 tokens a word) and for dense technical text.
TOKEN_PATTERN = re.compile(r"[^\W\d_]{1,6}|\d{1,3}|[^\w\s]|_")
# A context level's name: the workload's, "@", then the level in tokens ("16k" for 16 x 1024).
_CONTEXT_SUFFIX = re.compile(r"@([1-9][0-9]*)(k?)$")


def count_tokens(text: str) -> int:
    """A text's length in tokens, as specsweep estimates it (and the emulator counts it)."""
    return len(TOKEN_PATTERN.findall(text))


def context_variant_name(workload: str, context_tokens: int) -> str:
    """The name a workload measured at a context level goes by: ``prose@16k`` (16,384 tokens),
    ``prose@10000`` for a level that is not a whole number of 1,024 tokens."""
    if context_tokens < 1:
        raise ValueError(f"a context level is a whole number of tokens >= 1, not {context_tokens}")
    level = f"{context_tokens // 1024}k" if context_tokens % 1024 == 0 else str(context_tokens)
    return f"{workload}@{level}"


def parse_context_variant(name: str) -> tuple[str, int | None]:
    """A workload name read back: (the workload, its context level in tokens), or (name, None)
    for a workload measured as it is. The inverse of :func:`context_variant_name`."""
    found = _CONTEXT_SUFFIX.search(name)
    if found is None or found.start() == 0:
        return name, None
    tokens = int(found.group(1)) * (1024 if found.group(2) else 1)
    return name[: found.start()], tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadPrompt:
    """One prompt of a workload."""

    id: str
    subcategory: str
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    # A context level's shared text, sent before the nonce (so a prefix cache may serve it); "": none
    shared_prefix: str = ""

    def text(self) -> str:
        """All the prompt's own text, as one string (the shared prefix left out)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())

    def chat_messages(self, nonce: str) -> list[dict[str, Any]]:
        """Chat messages for a request, the nonce at the start of the first message (after the
        shared prefix, when the prompt has one)."""
        messages = (
            [{"role": "user", "content": self.prompt}]
            if self.prompt is not None
            else [dict(m) for m in self.messages or ()]
        )
        first = messages[0]
        first["content"] = f"{self.shared_prefix}[{nonce}] {first.get('content') or ''}"
        return messages

    def completion_prompt(self, nonce: str) -> str:
        """A plain prompt for /v1/completions, the nonce first (after the shared prefix, if any)."""
        return f"{self.shared_prefix}[{nonce}] {self.text()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A named list of prompts."""

    name: str
    source: str
    prompts: tuple[WorkloadPrompt, ...]
    format: str = "specsweep"  # the file's format: specsweep, sharegpt, openai-chat or text
    notes: tuple[str, ...] = ()  # what reading it in another format left out

    def subcategories(self) -> Counter[str]:
        return Counter(p.subcategory for p in self.prompts)


def new_nonce() -> str:
    """A short random tag that makes a request's prompt unique from its first token."""
    return secrets.token_hex(6)


def bundled_workload_names() -> list[str]:
    """Names of the workloads shipped with specsweep."""
    folder = resources.files("specsweep") / "workloads"
    return sorted(p.name.removesuffix(".jsonl") for p in folder.iterdir() if p.name.endswith(".jsonl"))


def load_workload(name_or_path: str | Path) -> Workload:
    """A bundled workload by name (``prose``, ``technical``) or a JSONL file by path."""
    text_name = str(name_or_path)
    if text_name in bundled_workload_names():
        resource = resources.files("specsweep") / "workloads" / f"{text_name}.jsonl"
        return parse_workload(resource.read_text(encoding="utf-8"), name=text_name, source=f"bundled:{text_name}")
    path = Path(name_or_path)
    if not path.is_file():
        raise WorkloadError(
            f"workload {text_name!r} is neither a bundled workload ("
            + ", ".join(bundled_workload_names())
            + ") nor a readable JSONL file."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload {path}: cannot read it as UTF-8 text ({exc}).") from None
    converted = detect_and_convert(text, source=str(path), suffix=path.suffix.lower())
    if converted is None:
        return parse_workload(text, name=path.stem, source=str(path))
    return workload_from_records(converted, name=path.stem, source=str(path))


def workload_from_records(converted: Converted, *, name: str, source: str) -> Workload:
    """A Workload from records read in another format, each checked as a line of a JSONL file is."""
    prompts: list[WorkloadPrompt] = []
    seen: set[str] = set()
    for number, (where, record) in enumerate(converted.records, 1):
        prompt = _parse_record(record, where, default_id=f"{name}-{number}")
        if prompt.id in seen:
            prompt = replace(prompt, id=f"{prompt.id}-{number}")  # other formats' ids need not be unique
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"workload {source} ({converted.format}): no prompts in it.")
    return Workload(name=name, source=source, prompts=tuple(prompts), format=converted.format, notes=converted.notes)


def too_small(workload: Workload, requests: int) -> str | None:
    """A warning when a level sends more requests than the workload has prompts: prompts repeat
    (each with a fresh nonce), and acceptance rests on fewer different outputs than it seems."""
    if len(workload.prompts) >= requests:
        return None
    return (
        f"workload {workload.name} has {len(workload.prompts)} prompts, fewer than the {requests} requests a level "
        "sends: prompts repeat, and the acceptance measured rests on fewer different outputs; add prompts"
    )


def workload_jsonl(workload: Workload) -> str:
    """The workload in specsweep's own JSON Lines format."""
    lines = []
    for prompt in workload.prompts:
        record: dict[str, Any] = {"id": prompt.id}
        if prompt.subcategory:
            record["subcategory"] = prompt.subcategory
        if prompt.prompt is not None:
            record["prompt"] = prompt.prompt
        else:
            record["messages"] = list(prompt.messages or ())
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def parse_workload(text: str, *, name: str, source: str) -> Workload:
    """Parse JSONL text into a Workload; errors name the line and what to fix."""
    prompts: list[WorkloadPrompt] = []
    seen: set[str] = set()
    for number, where, record in json_lines(text, source):
        prompt = _parse_record(record, where, default_id=f"{name}-{number}")
        if prompt.id in seen:
            raise WorkloadError(f"{where}: id {prompt.id!r} is used twice; ids must be unique.")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"workload {source}: no prompts; add JSON lines with a 'prompt' or 'messages'.")
    return Workload(name=name, source=source, prompts=tuple(prompts))


def _parse_record(record: Any, where: str, *, default_id: str) -> WorkloadPrompt:
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: must be a JSON object with 'prompt' or 'messages'.")
    unknown = sorted(set(record) - {"id", "subcategory", "prompt", "messages"})
    if unknown:
        raise WorkloadError(f"{where}: unknown key {unknown[0]!r}; use id, subcategory, prompt or messages.")
    record_id = record.get("id", default_id)
    subcategory = record.get("subcategory", "")
    if not isinstance(record_id, str | int) or isinstance(record_id, bool):
        raise WorkloadError(f"{where}: 'id' must be a string.")
    if not isinstance(subcategory, str):
        raise WorkloadError(f"{where}: 'subcategory' must be a string.")
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        raise WorkloadError(f"{where}: give exactly one of 'prompt' (a string) or 'messages' (a list).")
    if has_prompt:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkloadError(f"{where}: 'prompt' must be a non-empty string.")
        return WorkloadPrompt(id=str(record_id), subcategory=subcategory, prompt=prompt)
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects.")
    for message in messages:
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant", "developer")
            or not isinstance(message.get("content"), str)
        ):
            raise WorkloadError(
                f"{where}: each message needs a 'role' (system, user, assistant) and a string 'content'."
            )
    return WorkloadPrompt(id=str(record_id), subcategory=subcategory, messages=tuple(messages))
