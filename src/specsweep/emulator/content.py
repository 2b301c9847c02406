"""What the emulator reads from a prompt and what text it writes back.

Token counting: specsweep's one estimate (``workload.count_tokens``): letters in runs of up to
6, digits in runs of up to 3, any other non-space character on its own. This is close to a real
BPE tokenizer for English (about 1.3 tokens a word) and for dense technical text (many
single-symbol tokens).

Content class: decided from the prompt text alone, deterministically. A prompt is
``technical`` when its share of "technical characters" (digits and the symbols that code, data,
markup and formulas are made of) is high, or when it asks for a technical artefact by name and
shows a fair share of them; otherwise ``prose``.
"""

from __future__ import annotations

import re

from specsweep.workload import count_tokens  # noqa: F401 (re-exported: the emulator counts so)

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
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in _TECHNICAL_CHARS for c in chars) / len(chars)


def classify_content(text: str) -> str:
    """``technical`` or ``prose`` for a prompt (a leading ``[nonce]`` tag is ignored)."""
    body = _NONCE.sub("", text, count=1)
    share = technical_share(body)
    if share >= TECHNICAL_SHARE:
        return "technical"
    if share >= TECHNICAL_SHARE_WITH_WORDS and len(_TECHNICAL_WORDS.findall(body)) >= 2:
        return "technical"
    return "prose"


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
