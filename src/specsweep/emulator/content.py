"""What the emulator reads from a prompt and what text it writes back.

Token counting: specsweep's one estimate (``workload.count_tokens``): letters in runs of up to
6, digits in runs of up to 3, any other non-space character on its own. This is close to a real
BPE tokenizer for English (about 1.3 tokens a word) and for dense technical text (many
single-symbol tokens).

Content class: decided from the prompt text alone, deterministically. A prompt is
``technical`` when its share of "technical characters" (digits and the symbols that code, data,
markup and formulas are made of) is high, or when it asks for a technical artefact by name and
shows a fair share of them; otherwise ``prose``.

``PromptReader`` reads a request's prompt so (its tokens and class) and keeps the long heads of
the last prompts it read: a context level's requests share a head of up to 64k tokens, and
reading it once per level keeps the emulator's own wall clock, which the time scale multiplies,
out of what a client measures. The result is exactly what reading the whole prompt gives.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from specsweep.workload import TOKEN_PATTERN, count_tokens  # noqa: F401 (re-exported: the emulator counts so)

_TECHNICAL_CHARS = frozenset('0123456789{}[]()<>=;:_/\\|#$%^&*~`@"+-')
_TECHNICAL_WORDS = re.compile(
    r"\b(json|yaml|latex|sql|regex|hex|base64|uuid|sha-?256|stack trace|traceback|terraform|"
    r"kubernetes|nginx|systemd|ansible|smiles|stoichiometr\w*|python|rust|golang|typescript|"
    r"function|struct|class|module|compile|config(uration)?|csv|table of)\b",
    re.IGNORECASE,
)
_NONCE = re.compile(r"^\s*\[[^\]\n]{1,64}\]\s*")

# Share of technical characters above which a prompt is technical on its own, and the lower
# share that suffices when the prompt also names a technical artefact.
TECHNICAL_SHARE = 0.12
TECHNICAL_SHARE_WITH_WORDS = 0.07


def technical_share(text: str) -> float:
    """Fraction of non-space characters that are digits or code/markup symbols."""
    technical, chars = _char_counts(text)
    return technical / chars if chars else 0.0


def _char_counts(text: str) -> tuple[int, int]:
    """(technical characters, non-space characters) of a text, counted in C: a 64k prompt reads fast."""
    chars = "".join(text.split())  # str.split() drops exactly the characters str.isspace() names
    return sum(chars.count(c) for c in _TECHNICAL_CHARS), len(chars)


def classify_content(text: str) -> str:
    """``technical`` or ``prose`` for a prompt (a leading ``[nonce]`` tag is ignored)."""
    body = _NONCE.sub("", text, count=1)
    return _class_of(technical_share(body), body)


def _class_of(share: float, body: str) -> str:
    if share >= TECHNICAL_SHARE:
        return "technical"
    if share >= TECHNICAL_SHARE_WITH_WORDS and len(_TECHNICAL_WORDS.findall(body)) >= 2:
        return "technical"
    return "prose"


_HEAD_CHARS = 16384  # a prompt's head is kept in whole multiples of this many characters


@dataclass(frozen=True, slots=True)
class _Head:
    tokens: list[str]
    technical: int
    chars: int


class PromptReader:
    """A prompt's tokens and content class, the long heads of the last prompts read kept."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._heads: OrderedDict[str, _Head] = OrderedDict()

    def read(self, text: str) -> tuple[list[str], str]:
        """``(TOKEN_PATTERN.findall(text), classify_content(text))``, a known head not read again."""
        body = _NONCE.sub("", text, count=1)
        lead = text[: len(text) - len(body)]
        limit = (len(body) - _HEAD_CHARS) // _HEAD_CHARS * _HEAD_CHARS  # at least _HEAD_CHARS left after it
        cut = body.rfind(" ", 0, limit) if limit > 0 else -1
        if cut <= 0:  # short: read whole
            return TOKEN_PATTERN.findall(text), _class_of(technical_share(body), body)
        # no token spans a space, and the counts add up: the head and the rest read apart give the whole
        head_text, rest = body[:cut], body[cut:]
        head = self._heads.get(head_text)
        if head is None:
            technical, chars = _char_counts(head_text)
            head = _Head(tokens=TOKEN_PATTERN.findall(head_text), technical=technical, chars=chars)
            self._heads[head_text] = head
            if len(self._heads) > self._keep:
                self._heads.popitem(last=False)
        else:
            self._heads.move_to_end(head_text)
        technical, chars = _char_counts(rest)
        total = chars + head.chars
        share = (technical + head.technical) / total if total else 0.0
        tokens = [*TOKEN_PATTERN.findall(lead), *head.tokens, *TOKEN_PATTERN.findall(rest)]
        return tokens, _class_of(share, body)


# Token strings the emulator emits, per class. They are filler with the right texture; only
# their number matters to a measurement.
# fmt: off
_PROSE_WORDS = (
    "the", "a", "of", "and", "to", "in", "was", "her", "his", "that", "it", "with", "for", "as", "on",
    "at", "by", "from", "she", "he", "they", "river", "light", "morning", "road", "house", "evening",
    "window", "quiet", "slowly", "again", "never", "always", "remembered", "walked", "said", "turned",
    "looked", "across", "beyond", "under", "old", "small", "long",
)
_TECHNICAL_PIECES = (
    "{", "}", "[", "]", "(", ")", ":", ";", ",", ".", "\"", "=", "_", "0x", "3f", "a9", "7c", "e4",
    "12", "07", "255", "id", "\n", "  ", "def", " return", " if", " self", "uuid", "-", "/", "==",
    "->", "::", "b6", "d0", "base", "64", "sha", " =",
)
# fmt: on
VOCABULARY: dict[str, tuple[str, ...]] = {
    "prose": (*(" " + word for word in _PROSE_WORDS), ",", ".", "\n\n"),
    "technical": _TECHNICAL_PIECES,
}
