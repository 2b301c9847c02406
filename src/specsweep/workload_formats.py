"""Prompts in the formats people already have, turned into workload records.

- ShareGPT: objects with ``conversations``, a list of ``{"from": "human"|"gpt"|"system", "value"}``
  turns, as one JSON array or as JSON Lines. A prompt is the conversation's first human turn,
  with a system turn before it kept (as serving benchmarks take it); a conversation with no
  human turn holds no prompt and is skipped, and said so.
- OpenAI chat JSON Lines: ``{"messages": [...]}`` per line (fine-tuning files included): the
  messages up to the last user turn; the assistant's answer after it is what the server writes.
- Plain text: one prompt per paragraph (paragraphs are separated by blank lines).

Each function returns workload records (``{"id", "subcategory", "prompt" | "messages"}``) with
where each came from, and the notes a reader needs; a malformed record is a WorkloadError that
names its line (or, in a JSON array, its position) and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specsweep.errors import WorkloadError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Converted:
    """Workload records read from another format, each with its place in the file."""

    format: str  # "specsweep", "sharegpt", "openai-chat" or "text"
    records: tuple[tuple[str, dict[str, Any]], ...]  # (where, record)
    notes: tuple[str, ...] = ()


def detect_and_convert(text: str, *, source: str, suffix: str) -> Converted | None:
    """The records of ``text`` when it is in another format than specsweep's own JSONL (None:
    it is specsweep's own, or JSONL that parse_workload explains line by line)."""
    stripped = text.lstrip()
    json_file = suffix in (".jsonl", ".json", ".ndjson")
    if suffix in (".txt", ".md") or (not json_file and stripped and stripped[0] not in "[{/"):
        return from_paragraphs(text, source=source)
    if stripped.startswith("["):
        try:
            data = _loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(
                f"workload {source} line {exc.lineno}: not valid JSON ({exc.msg}); a JSON array of ShareGPT "
                "conversations, or one JSON object per line."
            ) from None
        if not isinstance(data, list):
            raise WorkloadError(f"workload {source}: a JSON array of ShareGPT conversations expected.")
        return from_sharegpt(((f"workload {source} record {i}", item) for i, item in enumerate(data, 1)))
    first = _first_object(text)
    if isinstance(first, dict) and "conversations" in first:
        return from_sharegpt(_lines(text, source))
    if isinstance(first, dict) and "messages" in first and "prompt" not in first and _openai_only(first):
        return from_openai_chat(_lines(text, source))
    return None


def _openai_only(record: dict[str, Any]) -> bool:
    """A chat record specsweep's own format would not take as it is: other keys (OpenAI files carry
    tools, metadata, ...), an assistant answer last, or content as a list of parts."""
    messages = record["messages"] if isinstance(record["messages"], list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    return (
        bool(set(record) - {"id", "subcategory", "messages"})
        or last.get("role") == "assistant"
        or any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages)
    )


def _first_object(text: str) -> Any:
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("//"):
            try:
                return _loads(line)
            except json.JSONDecodeError:
                return None
    return None


def json_lines(text: str, source: str) -> Iterator[tuple[int, str, Any]]:
    """Each JSON Lines record with its line number and where it is, as errors name it; blank
    lines and ``//`` comments skipped; a line that is not JSON is a WorkloadError naming it."""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        where = f"workload {source} line {number}"
        try:
            yield number, where, _loads(stripped)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object.") from None


def _loads(text: str) -> Any:
    """``json.loads``, with nesting deeper than the parser recurses and integers too long to
    convert reported as JSONDecodeError, as other JSON that cannot be read is."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text, 0) from None
    except ValueError as exc:  # an integer of thousands of digits
        raise json.JSONDecodeError(str(exc).split(";")[0], text, 0) from None


def _lines(text: str, source: str) -> Iterator[tuple[str, Any]]:
    return ((where, record) for _, where, record in json_lines(text, source))


def from_sharegpt(items) -> Converted:
    """ShareGPT conversations: each one's first human turn (with a system turn before it)."""
    records, skipped = [], 0
    for where, item in items:
        if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
            raise WorkloadError(f"{where}: a ShareGPT record needs 'conversations', a list of {{from, value}} turns.")
        messages = []
        for turn in item["conversations"]:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise WorkloadError(f"{where}: each turn needs 'from' (human, gpt, system) and a string 'value'.")
            role = ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise WorkloadError(
                    f"{where}: turn 'from' {turn.get('from')!r} is not human, gpt or system (user, assistant too)."
                )
            if role == "user":
                if turn["value"].strip():
                    messages.append({"role": "user", "content": turn["value"]})
                break
            if role == "system":
                messages.append({"role": "system", "content": turn["value"]})
        if not messages or messages[-1]["role"] != "user":
            skipped += 1
            continue
        record: dict[str, Any] = {"messages": messages}
        if isinstance(item.get("id"), str | int) and not isinstance(item.get("id"), bool):
            record["id"] = str(item["id"])
        records.append((where, record))
    notes = (f"{skipped} conversation(s) with no human turn to answer were skipped",) if skipped else ()
    return Converted(format="sharegpt", records=tuple(records), notes=notes)


def from_openai_chat(items) -> Converted:
    """OpenAI chat JSON Lines: the messages up to the last user turn (the answer after it dropped)."""
    records, dropped = [], 0
    for where, item in items:
        if not isinstance(item, dict) or not isinstance(item.get("messages"), list) or not item["messages"]:
            raise WorkloadError(f"{where}: an OpenAI chat record needs 'messages', a non-empty list.")
        messages = list(item["messages"])
        while messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
            messages.pop()
            dropped += 1
        if not messages:
            raise WorkloadError(f"{where}: the messages hold no user turn to answer.")
        record: dict[str, Any] = {"messages": [_message(m, where) for m in messages]}
        for key in ("id", "subcategory"):
            if key in item:
                record[key] = item[key]
        records.append((where, record))
    notes = (f"{dropped} assistant answer(s) after the last user turn were left for the server to write",)
    return Converted(format="openai-chat", records=tuple(records), notes=notes if dropped else ())


def _message(message: Any, where: str) -> dict[str, Any]:
    """A chat message as the workload keeps it: role and text content (a list of text parts joined)."""
    if not isinstance(message, dict):
        raise WorkloadError(f"{where}: each message must be an object with 'role' and 'content'.")
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": "..."}]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        if not texts or len(texts) != len(parts):
            raise WorkloadError(f"{where}: a message's content parts must be text ({{type: text, text}}).")
        content = "\n".join(texts)
    return {"role": message.get("role"), "content": content}


def from_paragraphs(text: str, *, source: str) -> Converted:
    """Plain text: one prompt per paragraph, paragraphs separated by blank lines."""
    records: list[tuple[str, dict[str, Any]]] = []
    lines: list[str] = []
    start = 0
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line)
        elif lines:
            records.append((f"workload {source} line {start}", {"prompt": "\n".join(lines), "id": f"line-{start}"}))
            lines = []
    return Converted(format="text", records=tuple(records))
