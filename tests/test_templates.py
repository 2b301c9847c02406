"""Command templates (specsweep.templates): which templates are refused and why, and what a
rendered template runs. The shell is the judge for shell-string templates: values go through a
real /bin/sh and come back out through printf, byte for byte.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.errors import ConfigError
from specsweep.runtime.trial_server import placeholder_values
from specsweep.templates import PLACEHOLDERS, CommandTemplate, parse_command_template

PLAIN = [name for name in PLACEHOLDERS if name != "spec_args"]

# -- checking -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        ["vllm", "serve", "{model}", "--port", "{port}", "{spec_args}"],
        ["run", "--trial={trial}", "--name=x{method}y"],
        ["sh", "-c", "vllm serve"],  # a shell script without placeholders
        ["/bin/bash", "serve.sh", "{port}"],  # a script file, not -c
        "vllm serve {model} --port {port} {spec_args} 2>&1 | tee -a 'log file'",
        "echo \\'{port}",  # an escaped quote opens nothing
        "awk '{print $1}' {host}",  # not a placeholder: braces of the script's own
        "echo \"$HOME\" {port} 'a''b'",
    ],
)
def test_templates_that_are_accepted_keep_their_text(value: str | list[str]) -> None:
    template = parse_command_template(value, where="s.toml: server.start")
    assert template.text == (value if isinstance(value, str) else tuple(value))
    assert template.shell == isinstance(value, str)


REFUSED = [
    ("vllm serve '{model}'", "placeholder {model} is inside quotes, backticks or after '$'"),
    ('vllm serve "--port={port}"', "placeholder {port} is inside quotes"),
    ("vllm serve `echo {trial}`", "placeholder {trial} is inside quotes"),
    ("vllm serve ${port}", "placeholder {port} is inside quotes, backticks or after '$'"),
    ('echo "a\\"{host}"', "placeholder {host} is inside quotes"),  # an escaped quote does not close
    ("echo 'a' \"b\" '{method}", "placeholder {method} is inside quotes"),
    (["sh", "-c", "vllm serve {model}"], "runs a shell (sh -c) with placeholders in its script"),
    (["/usr/bin/zsh", "-lc", "x {port}"], "runs a shell (/usr/bin/zsh -c)"),
    (["sh", "-c", "x", "{port}"], "runs a shell (sh -c) with placeholders"),  # in any argument after -c
    (["vllm", "--port", "{prot}"], "uses unknown placeholder {prot}; known: {host}, {port}, {spec_args},"),
    (["vllm", "{}"], "uses unknown placeholder {}"),
    (["vllm", "--x={spec_args}"], ": {spec_args} must be a list element of its own."),
    ("", "must be a list of strings (argv, no shell) or one shell command string."),
    ("   ", "must be a list of strings"),
    ([], "must be a list of strings"),
    (["vllm", 8000], "must be a list of strings"),
    (8000, "must be a list of strings"),
    (("vllm", "serve"), "must be a list of strings"),  # TOML gives lists; anything else is refused
]


@pytest.mark.parametrize(("value", "message"), REFUSED)
def test_refused_templates_name_the_key_and_the_fix(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_command_template(value, where="s.toml: server.stop")
    text = str(caught.value)
    assert text.startswith("s.toml: server.stop") and message in text and "\n" not in text


@pytest.mark.parametrize("name", PLACEHOLDERS)
@pytest.mark.parametrize("context", ["'{}'", '"{}"', "`{}`", "${}", "'a b {}'", '"x"\'{}\'"'])
def test_every_placeholder_is_refused_where_quoting_cannot_hold(name: str, context: str) -> None:
    template = "run " + context.replace("{}", "{" + name + "}")
    with pytest.raises(ConfigError, match=re.escape("{" + name + "} is inside quotes")):
        parse_command_template(template, where="s.toml: server.start")
    parse_command_template("run {" + name + "}", where="s.toml: server.start")  # bare, it is fine


# -- rendering --------------------------------------------------------------------------------

_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_hostile = st.one_of(
    _value, st.sampled_from(["; id", "$(id)", "`id`", "' ; id ; '", '" ; id ; "', "{port}", "a\nb", "-x"])
)
_values = st.fixed_dictionaries({name: _hostile for name in PLAIN})
_spec_args = st.lists(_hostile, max_size=3)


@settings(max_examples=200, deadline=None)
@given(_values, _spec_args)
def test_argv_templates_put_each_value_in_its_element(values: dict[str, str], spec_args: list[str]) -> None:
    template = parse_command_template(
        ["prog", *(f"{{{n}}}" for n in PLAIN), "{spec_args}", *(f"--{n}={{{n}}}" for n in PLAIN), "{spec_args}", "end"],
        where="t",
    )
    argv = template.render({**values, "spec_args": spec_args})
    expected = ["prog", *(values[n] for n in PLAIN), *spec_args, *(f"--{n}={values[n]}" for n in PLAIN), *spec_args]
    assert argv == [*expected, "end"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values, _spec_args)
def test_the_shell_gets_back_exactly_the_values(
    tmp_path_factory: pytest.TempPathFactory, values: dict[str, str], spec_args: list[str]
) -> None:
    """printf prints each argument it receives, NUL-terminated: one per value, unchanged.

    It runs in an empty folder, so a quoting bug shows as wrong output, not as stray files here.
    """
    bare = " ".join(f"{{{n}}} --{n}={{{n}}}" for n in PLAIN)
    template = parse_command_template(f"printf '%s\\0' {bare} {{spec_args}} end", where="t")
    argv = template.render({**values, "spec_args": spec_args})
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    folder = tmp_path_factory.mktemp("shell")
    out = subprocess.run(argv, cwd=folder, capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    expected = [x for n in PLAIN for x in (values[n], f"--{n}={values[n]}")] + [*spec_args, "end"]
    assert out.split("\0")[:-1] == expected
    assert list(folder.iterdir()) == []


def test_a_placeholder_without_a_value_is_left_as_written() -> None:
    template = CommandTemplate(text=("run", "{port}", "{model}", "--{x}"))
    assert template.render({"port": "1", "spec_args": []}) == ["run", "1", "{model}", "--{x}"]
    shell = CommandTemplate(text="awk '{print}' {port} {model}")
    assert shell.render({"port": "a b"}) == ["/bin/sh", "-c", "awk '{print}' 'a b' {model}"]


def test_spec_args_off_leaves_nothing_behind() -> None:
    assert CommandTemplate(text=("serve", "{spec_args}", "--x")).render({"spec_args": []}) == ["serve", "--x"]
    assert CommandTemplate(text="serve {spec_args} --x").render({"spec_args": []}) == ["/bin/sh", "-c", "serve  --x"]


def test_a_trial_has_a_value_for_every_placeholder_and_no_other() -> None:
    values = placeholder_values(host="h", port=1, spec=None, spec_args=[], model=None, trial=3)
    assert list(values) == list(PLACEHOLDERS)
