"""What a secret is and how it is masked: the one place that decides both.

A secret is

- the value of a flag whose name says key, token, password or secret: ``--api-key X``,
  ``--api-key=X``, ``--hf-token X``, ``--password=X``, ``--secret X`` (any case, ``-`` or ``_``);
- the value of an environment assignment (or a ``name=value`` / ``'name': value`` pair in a log
  line) whose name says the same: ``HF_TOKEN=...``, ``VLLM_API_KEY=...``, ``PGPASSWORD=...``;
- the userinfo of a URL: ``http://user:pass@host`` keeps the user, ``http://token@host`` keeps nothing.

A name "says" one of them when its last word (split at ``-``, ``_`` and ``.``) ends with key, keys,
token, password, passwd, secret or secrets: ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``--apikey``.
``tokens`` (a count), ``tokenizer``, ``AWS_ACCESS_KEY_ID`` and names of where a secret is kept
(``--api-key-env``, ``--api-key-file``, ``--ssl-keyfile``) do not.

Masking replaces the whole value with ``***``: the flag or name stays, so the text stays
recognisable, and no part of the value is shown. What is masked here is what specsweep writes
or prints; the server itself is always given the real value.

Pure: no I/O, only the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

MASK = "***"
SECRET_WORDS = ("key", "keys", "token", "password", "passwd", "secret", "secrets")
# A value shorter than this is not looked for as plain text (it would mask every "1" or "on").
SHORTEST_KNOWN_VALUE = 4

_WORD_SPLIT = re.compile(r"[-_.]+")
_VALUE = r"""(?:'[^']*'|"(?:\\.|[^"\\])*"|\[[^\]]*\]|(?!--)[^\s'",;&|(){}\[\]<>]+)"""
# scheme://user:password@ or scheme://userinfo@ (userinfo without / ? # @ or spaces)
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/?#@:'\"]*)(?::(?P<password>[^\s/?#@'\"]*))?@"
)
_FLAG = re.compile(rf"(?P<name>(?<![\w-])--?[A-Za-z][\w.-]*)(?P<sep>=|[ \t]+)(?P<value>{_VALUE})")
_ASSIGNMENT = re.compile(rf"(?P<name>(?<![\w.-])[A-Za-z_][\w.-]*)(?P<sep>=)(?P<value>{_VALUE}?)")
_QUOTED_KEY = re.compile(rf"(?P<name>(?P<q>['\"])[\w.-]+(?P=q))(?P<sep>\s*:\s*)(?P<value>{_VALUE})")


def is_secret_name(name: str) -> bool:
    """Whether a flag or variable name says its value is a secret (``--api-key``, ``HF_TOKEN``)."""
    words = [word for word in _WORD_SPLIT.split(name.strip("-'\"").lower()) if word]
    return bool(words) and words[-1].endswith(SECRET_WORDS)


def mask_url(url: str) -> str:
    """A URL with its userinfo masked: ``http://user:***@host`` or ``http://***@host``."""
    return _URL_USERINFO.sub(lambda m: _masked_userinfo(m, None), url)


def mask_text(text: str, known: Iterable[str] = ()) -> str:
    """Free text (a shell command, an error message, a log line) with every secret masked:
    flag values, secret assignments, URL userinfo, and each ``known`` value wherever it appears."""
    return _mask(text, known, None)


def mask_argv(argv: Sequence[str], known: Iterable[str] = ()) -> tuple[str, ...]:
    """A command line with every secret masked, element by element; the value after a secret flag
    (every element up to the next flag: vLLM's ``--api-key`` takes several) becomes ``***``."""
    return _mask_argv(argv, tuple(known), None)


def secrets_in(
    *, commands: Iterable[Sequence[str] | str | None] = (), env: Mapping[str, str] | None = None
) -> frozenset[str]:
    """The secret values that masking ``commands`` (argv lists or shell strings) would hide, and
    the values of ``env``'s secret names: what to look for as plain text elsewhere (a log tail)."""
    found: list[str] = []
    for command in commands:
        if isinstance(command, str):
            _mask(command, (), found)
        elif command is not None:
            _mask_argv(command, (), found)
    found += [value for name, value in (env or {}).items() if is_secret_name(name)]
    return frozenset(v for v in (_unquoted(v) for v in found) if len(v) >= SHORTEST_KNOWN_VALUE)


def _mask_argv(argv: Sequence[str], known: tuple[str, ...], found: list[str] | None) -> tuple[str, ...]:
    out: list[str] = []
    hiding = False
    for arg in argv:
        if hiding and not arg.startswith("-"):
            out.append(MASK)
            if found is not None:
                found.append(arg)
            continue
        hiding = False
        name, eq, value = arg.partition("=")
        if arg.startswith("-") and is_secret_name(name):
            if eq:
                out.append(f"{name}={MASK}")
                if found is not None:
                    found.append(value)
            else:
                out.append(arg)
                hiding = True
            continue
        out.append(_mask(arg, known, found))
    return tuple(out)


def _mask(text: str, known: Iterable[str], found: list[str] | None) -> str:
    def pair(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")) or match.group("value") in ("", MASK):
            return match.group(0)
        if found is not None:
            found.append(match.group("value"))
        return f"{match.group('name')}{match.group('sep')}{MASK}"

    masked = _URL_USERINFO.sub(lambda m: _masked_userinfo(m, found), text)
    for pattern in (_FLAG, _ASSIGNMENT, _QUOTED_KEY):
        masked = pattern.sub(pair, masked)
    for value in sorted({v for v in known if len(v) >= SHORTEST_KNOWN_VALUE}, key=len, reverse=True):
        masked = masked.replace(value, MASK)
    return masked


def _masked_userinfo(match: re.Match[str], found: list[str] | None) -> str:
    user, password = match.group("user"), match.group("password")
    if password is None:
        if found is not None and user:
            found.append(user)
        return f"{match.group('scheme')}{MASK}@"
    if found is not None and password:
        found.append(password)
    return f"{match.group('scheme')}{user}:{MASK}@"


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value
