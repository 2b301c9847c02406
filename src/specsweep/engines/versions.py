"""Which of an engine's known vocabularies a server's version speaks.

Each engine module keeps its vocabularies by version (``VOCABULARIES``), each read from that
version's released source (docs/engines.md names the files and lines). A version specsweep
knows gets its own; any other (or an unread one) gets the newest it knows, with one line that
says so, since an engine's newest vocabulary is the likeliest to match a newer server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from specsweep.errors import ConfigError

V = TypeVar("V")

_NUMBERS = re.compile(r"\d+")


def version_numbers(text: str) -> tuple[int, ...]:
    """The numbers of a version string: "0.33.0" -> (0, 33, 0), "b11434" -> (11434,)."""
    return tuple(int(n) for n in _NUMBERS.findall(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionChoice(Generic[V]):
    """The vocabulary a version gets, and the line to say when it is not the version's own."""

    vocabulary: V
    known_as: str  # the key of the vocabulary taken
    note: str | None  # None: the server's version is one specsweep knows


def choose_vocabulary(engine: str, known: Mapping[str, V], version: str | None) -> VersionChoice[V]:
    """The vocabulary for ``version``: a known key that is a prefix of it by number ("0.33" for
    "0.33.1"), else the newest known, with a note."""
    newest = max(known, key=version_numbers)
    if version:
        numbers = version_numbers(version)
        for key in sorted(known, key=version_numbers, reverse=True):
            wanted = version_numbers(key)
            if numbers[: len(wanted)] == wanted:
                return VersionChoice(vocabulary=known[key], known_as=key, note=None)
    names = ", ".join(sorted(known, key=version_numbers))
    said = f"{engine} {version}" if version else f"{engine} of an unread version"
    return VersionChoice(
        vocabulary=known[newest],
        known_as=newest,
        note=f"{said}: specsweep knows the vocabulary of {engine} {names} (from their source) and renders, "
        f"validates and pastes for {newest}, the newest of them.",
    )


# vLLM fields of its own drafting and suffix decoding, which no other engine has a setting for.
VLLM_ONLY = "a vLLM setting"
VLLM_ONLY_FIELDS = dict.fromkeys(
    (
        "disable_padded_drafter_batch", "parallel_drafting", "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
    ),
    VLLM_ONLY,
)  # fmt: skip


def refuse_unexpressed(raw: Mapping[str, object], engine: str, reasons: Mapping[str, str]) -> None:
    """ConfigError, in one line, for the first spec-config field in ``raw`` that ``engine`` has no
    flag for (``reasons``: field -> why): a study that opened it would measure identical servers
    under different keys. ``rejection_sample_method`` counts only when it is not vLLM's default."""
    for name, reason in reasons.items():
        if name not in raw or (name == "rejection_sample_method" and raw[name] == "standard"):
            continue
        shown = f"{name} {raw[name]!r}" if name == "rejection_sample_method" else name
        raise ConfigError(
            f"{engine} has no flag for speculative_config.{shown} ({reason}): specsweep would start the same "
            "server under another key; leave it out of search.fixed and search.open."
        )
