"""Server command templates: the one place that knows the placeholder syntax.

``server.start``, ``server.stop`` and ``server.wait_free`` are templates in one of two forms:

- a list of strings, run as an argv without a shell: each placeholder is replaced inside its
  element, so no value can become a second argument or a command; ``{spec_args}`` stands alone
  in an element and becomes the engine's speculative flags, zero or more elements;
- one string, run through ``/bin/sh -c``: each value is shell-quoted on its own, which holds
  only where the placeholder is bare, so one inside quotes, backticks or right after ``$`` is
  refused (a value there could end the quotes and run a command).

``parse_command_template`` checks a template once; ``CommandTemplate.render`` fills it in.
Pure: no I/O, only the standard library and ``specsweep.errors``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from specsweep.errors import ConfigError

PLACEHOLDERS = (
    "host", "port", "spec_args", "speculative_config", "num_speculative_tokens", "draft_sample_method",
    "method", "model", "trial",
)  # fmt: skip
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "ash")

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_BRACED_NAME = re.compile(r"\{([a-z_]*)\}")  # also "{}", an unknown (empty) placeholder in argv
_SCRIPT_FLAG = re.compile(r"-[a-z]*c[a-z]*")  # sh -c, bash -ec, ...

Values = Mapping[str, str | Sequence[str]]  # placeholder name -> value; spec_args a list of arguments


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandTemplate:
    """A command template as written: argv (a tuple) or a shell command string.

    Text from a user goes through ``parse_command_template``; a record built from a template
    that was checked there (as ``ServerConfig`` holds it) renders without checking again.
    """

    text: tuple[str, ...] | str

    @property
    def shell(self) -> bool:
        """True for a shell command string (run through ``/bin/sh -c``)."""
        return isinstance(self.text, str)

    def render(self, values: Values) -> list[str]:
        """The argv to run. ``values`` must hold ``spec_args``; another placeholder without a value stays as written."""
        if isinstance(self.text, str):
            return ["/bin/sh", "-c", _PLACEHOLDER.sub(lambda m: _quoted(values.get(m.group(1)), m), self.text)]
        argv: list[str] = []
        for element in self.text:
            if element == "{spec_args}":
                argv.extend(values["spec_args"])
            else:
                argv.append(_PLACEHOLDER.sub(lambda m: _plain(values.get(m.group(1)), m), element))
        return argv


def _quoted(value: str | Sequence[str] | None, match: re.Match[str]) -> str:
    if value is None:
        return match.group(0)
    return shlex.quote(value) if isinstance(value, str) else " ".join(shlex.quote(v) for v in value)


def _plain(value: str | Sequence[str] | None, match: re.Match[str]) -> str:
    return value if isinstance(value, str) else match.group(0)  # a list fits only an element of its own


def has_placeholder(text: str) -> bool:
    """Whether ``text`` holds a placeholder (its value is known only when a trial starts)."""
    return _PLACEHOLDER.search(text) is not None


def parse_command_template(value: object, *, where: str) -> CommandTemplate:
    """Check a template from a study file; ``where`` (file and key path) starts every error."""
    if isinstance(value, str) and value.strip():
        _check_shell_string(value, where)
        return CommandTemplate(text=value)
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        _check_argv(tuple(value), where)
        return CommandTemplate(text=tuple(value))
    raise ConfigError(f"{where} must be a list of strings (argv, no shell) or one shell command string.")


def _check_argv(argv: tuple[str, ...], where: str) -> None:
    shell = PurePosixPath(argv[0]).name in SHELLS
    script_flag = any(_SCRIPT_FLAG.fullmatch(x) for x in argv[1:])
    if shell and script_flag and any(_PLACEHOLDER.search(x) for x in argv[1:]):
        raise ConfigError(
            f"{where} runs a shell ({argv[0]} -c) with placeholders in its script, where values are "
            "not quoted; write the command as one string instead (specsweep runs it through /bin/sh -c and "
            "shell-quotes each value)."
        )
    for element in argv:
        for name in _BRACED_NAME.findall(element):
            if name not in PLACEHOLDERS:
                raise ConfigError(
                    f"{where} uses unknown placeholder {{{name}}}; known: "
                    + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                    + "."
                )
        if "{spec_args}" in element and element != "{spec_args}":
            raise ConfigError(f"{where}: {{spec_args}} must be a list element of its own.")


def _check_shell_string(template: str, where: str) -> None:
    """Refuse placeholders where shell quoting of their values would not hold.

    Each value is shell-quoted on its own; inside '...', "..." or `...`, or right after a
    ``$``, that quoting is undone and a value could end the quotes and run a command.
    """
    quote: str | None = None
    i = 0
    while i < len(template):
        char = template[i]
        match = _PLACEHOLDER.match(template, i) if char == "{" else None
        if match and match.group(1) in PLACEHOLDERS and (quote is not None or template[i - 1 : i] == "$"):
            raise ConfigError(
                f"{where}: placeholder {match.group(0)} is inside quotes, backticks or after '$'; "
                f"write it bare, e.g. --port {match.group(0)} (specsweep shell-quotes every value)."
            )
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            i += 2
            continue
        elif quote is not None and char == quote:
            quote = None
        elif quote is None and char in "'\"`":
            quote = char
        i += 1
