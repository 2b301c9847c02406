"""The misuse cases of ``tests/test_misuse.py``: generated bad input for every command.

Each case is a command line, the files to put in its working folder first, and what may come of
it. Placeholders in a command line are filled in when it runs: ``{closed}`` (a loopback URL where
nothing listens), ``{server:MODE}`` (the test's own server that answers wrongly, see
``test_misuse.py``), ``{outside}`` (a folder beside the working folder that nothing may touch).
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomli_w
import typer.models

from specsweep.cli import emulate, measure, recommend, report, rig, study, watch, workloads
from specsweep.config import KNOWN_KEYS

from .builders import emulator_study


@dataclass(frozen=True, slots=True)
class Link:
    """A symbolic link to put in the working folder, to ``target``."""

    target: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One command line a user might type wrongly, and what it may do."""

    id: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, str | bytes | Link], ...] = ()  # written into the working folder first
    # "error": it must exit non-zero; "any": either, but an exit 0 must have done its work
    expect: Literal["error", "any"] = "error"
    child: bool = False  # run as a child process (`python -m specsweep`), not in this process
    study: bool = False  # a small stored study is copied to studies/tiny in the working folder first
    secret: str | None = None  # a value that must appear in no output and no file written


STUDY_FILE = "s.toml"
SECRET = "sk-misuse-0123456789abcdef"
CLOSED = "{closed}"


def tiny_study(**changes: Any) -> dict[str, Any]:
    """The study every study-file case starts from: the emulator, k 1..2, two requests a level."""
    data = emulator_study("tiny", k=(1, 2), requests=2, max_tokens=30)
    for path, value in changes.items():
        *tables, key = path.split(".")
        node = data
        for table in tables:
            node = node.setdefault(table, {})
        if value is _DELETE:
            node.pop(key, None)
        else:
            node[key] = value
    return data


_DELETE = object()


def _toml(data: dict[str, Any]) -> str:
    return tomli_w.dumps(data)


# -- study files (study --config FILE --dry-run: parsed and planned, nothing started) ----------

_WRONG_VALUES: dict[str, Any] = {
    "text": "x",
    "negative": -1,
    "zero": 0,
    "huge": 10**15,
    "fraction": 0.5,
    "bool": True,
    "list": [],
    "table": {"a": 1},
}


def study_file_cases() -> Iterator[Case]:
    """Every known key of every table set to a value of each wrong kind; unknown keys and tables;
    bad command templates; files that are not TOML."""
    dry = ("study", "--config", STUDY_FILE, "--dry-run")
    for table, keys in KNOWN_KEYS.items():
        for key in keys:
            for kind, value in _WRONG_VALUES.items():
                data = tiny_study(**{f"{table}.{key}": value})
                yield Case(id=f"study-file-{table}.{key}-{kind}", argv=dry, files=((STUDY_FILE, _toml(data)),),
                           expect="any")  # fmt: skip
        if keys:
            data = tiny_study(**{f"{table}.no_such_key": 1})
            yield Case(id=f"study-file-{table}-unknown-key", argv=dry, files=((STUDY_FILE, _toml(data)),))
    for name, weight in {
        "prose-negative": -1.0,
        "prose-text": "x",
        "prose-zero": 0.0,
        "prose-nan": float("nan"),
    }.items():
        data = tiny_study(workloads={"prose": weight})
        yield Case(id=f"study-file-workloads-{name}", argv=dry, files=((STUDY_FILE, _toml(data)),))
    for name, table in {
        "missing-file": {"no-such.jsonl": 1.0},
        "a-folder": {"afolder": 1.0},
        "empty": {},
        "outside-file": {"{outside}/victim.txt": 1.0},  # read, not written: it may be anywhere
    }.items():
        data = tiny_study(workloads=table)
        yield Case(id=f"study-file-workloads-{name}", argv=dry, files=((STUDY_FILE, _toml(data)), ("afolder/x", "")),
                   expect="any" if name == "outside-file" else "error")  # fmt: skip
    yield from _template_cases(dry)
    texts: dict[str, str | bytes] = {
        "not-toml": "[study\nname = ",
        "empty": "",
        "not-utf8": b"\xff\xfe[study]\n",
        "nul": '[study]\nname = "a\x00b"\n',
        "unknown-table": _toml(tiny_study(nope={"a": 1})),
        "table-is-a-value": _toml({**tiny_study(), "measure": 3}),
        "no-study-table": _toml({k: v for k, v in tiny_study().items() if k != "study"}),
        "k-reversed": _toml(tiny_study(**{"search.num_speculative_tokens": [4, 1]})),
        "k-one-value": _toml(tiny_study(**{"search.num_speculative_tokens": [3]})),
        "k-of-text": _toml(tiny_study(**{"search.num_speculative_tokens": ["a", "b"]})),
        "concurrency-repeated": _toml(tiny_study(**{"measure.concurrency": [1, 1]})),
        "concurrency-empty": _toml(tiny_study(**{"measure.concurrency": []})),
        "temperature-3": _toml(tiny_study(**{"measure.temperature": 3.0})),
        "temperature-nan": _toml(tiny_study(**{"measure.temperature": float("nan")})),
        "timeout-inf": _toml(tiny_study(**{"measure.timeout_s": float("inf")})),
        "draft-method-unknown": _toml(tiny_study(**{"search.draft_sample_method": ["gumbel"]})),
        "fixed-method-unknown": _toml(tiny_study(**{"search.fixed": {"method": "nope"}})),
        "open-not-a-list": _toml(tiny_study(**{"search.open": {"method": "dspark"}})),
        "profile-unknown": _toml(tiny_study(**{"server.emulator.profile": "no-such-rig"})),
        "profile-a-folder": _toml(tiny_study(**{"server.emulator.profile": "afolder/.toml"})),
        "extra-args-text": _toml(tiny_study(**{"server.emulator.extra_args": "--seed 1"})),
        "name-with-slash": _toml(tiny_study(**{"study.name": "a/b"})),
        "name-dotdot": _toml(tiny_study(**{"study.name": ".."})),
        "name-empty": _toml(tiny_study(**{"study.name": ""})),
        "storage-not-a-url": _toml(tiny_study(**{"study.storage": "somewhere"})),
    }
    for name, text in texts.items():
        yield Case(id=f"study-file-{name}", argv=dry, files=((STUDY_FILE, text), ("afolder/.toml", "x")))
    huge = tiny_study(**{"measure.max_tokens": 100_000_000_000})
    yield Case(id="study-file-max-tokens-beyond-the-context", argv=dry, files=((STUDY_FILE, _toml(huge)),))


def _template_cases(dry: tuple[str, ...]) -> Iterator[Case]:
    """Process-mode start commands whose templates are wrong."""
    starts: dict[str, Any] = {
        "quoted-placeholder": "python -m specsweep emulate --port '{port}' {spec_args}",
        "unknown-placeholder": "python -m specsweep emulate --port {port} {nope}",
        "unclosed-brace": "python -m specsweep emulate --port {port",
        "unclosed-quote": "python -m specsweep emulate --port {port} '",
        "empty": "",
        "empty-list": [],
        "list-of-numbers": [1, 2],
        "sh-c": ["sh", "-c", "emulate --port {port}"],
        "dollar-placeholder": "python -m specsweep emulate --port ${port}",
        "no-port": "python -m specsweep emulate {spec_args}",
    }
    for name, start in starts.items():
        data = tiny_study(**{"server.mode": "process", "server.start": start, "server.emulator": _DELETE})
        yield Case(id=f"study-file-start-{name}", argv=dry, files=((STUDY_FILE, _toml(data)),), expect="any")
    leaky = tiny_study(**{
        "server.mode": "process", "server.engine": "vllm", "server.emulator": _DELETE,
        "server.start": f"python -m specsweep emulate --port {{port}} --api-key {SECRET} {{spec_args}}",
    })  # fmt: skip
    yield Case(id="study-file-secret-in-start", argv=dry, files=((STUDY_FILE, _toml(leaky)),), expect="any",
               secret=SECRET)  # fmt: skip


# -- flags of every command, generated from their declarations ---------------------------------

_NUMBERS = {"negative": "-1", "zero": "0", "text": "abc", "huge": "1" + "0" * 30, "nan": "nan", "inf": "inf"}
_PATHS = {
    "unwritable": "/proc/x/y",
    "missing": "no/such/place",
    "a-file": "afile",
    "a-folder": "afolder",
    "empty": "",
}
_URLS = {
    "no-scheme": "127.0.0.1:8000",
    "scheme-only": "http://",
    "port-0": "http://127.0.0.1:0",
    "port-99999": "http://127.0.0.1:99999",
    "bad-ipv6": "http://[::1",
    "ftp": "ftp://127.0.0.1/",
    "closed": CLOSED,
    "spaces": "http://127.0.0.1: 80",
}
_DURATIONS = {"zero": "0s", "negative": "-5s", "text": "soon", "unit": "5y", "nan": "nan", "huge": "1e308d"}
_STRINGS = {"empty": "", "quote": "'", "brace": "{", "newline": "a\nb", "long": "x" * 5000}
_JSON = {"not-json": "{bad", "a-list": "[1]", "deep": "[" * 100_000 + "]" * 100_000, "null": "null", "empty": "{}"}
_SPECIAL: dict[str, dict[str, str]] = {
    "endpoint": _URLS,
    "prometheus": _URLS,
    "timeout": _DURATIONS,
    "interval": _DURATIONS,
    "window": _DURATIONS,
    "duration": _DURATIONS,
    "since": _DURATIONS,
    "step": _DURATIONS,
    "speculative_config": _JSON,
    "running_config": _JSON,
    "concurrency": {"zero": "0", "repeated": "1,1", "gap": "1,,2", "negative": "-1", "text": "a", "empty": ""},
    "storage": {
        "not-a-url": "somewhere",
        "sqlite-unwritable": "sqlite:////proc/x/study.db",
        "postgres-closed": "postgresql://u@127.0.0.1:1/db",
        "unknown-scheme": "mongo://127.0.0.1/x",
        "journal-missing-folder": "journal:///no/such/folder/j.log",
    },
    "workload": {"missing": "no-such-workload", "a-folder": "afolder", "empty": "", "text-file": "afile"},
    "profile": {"missing": "no-such-rig", "a-file": "afile.toml", "a-folder": "afolder"},
    "traffic": {"missing": "no-such-schedule", "a-file": "afile.toml"},
    "start": {"text": "yesterday", "iso-garbage": "2026-13-45T99:00"},
    "end": {"text": "yesterday"},
    "engine": {"unknown": "nope", "empty": ""},
    "api_key_env": {"unset": "SPECSWEEP_MISUSE_UNSET", "empty": ""},
    "study_name": {"slash": "a/b", "dotdot": "..", "empty": ""},
    "name": {"slash": "a/b", "dotdot": "..", "empty": ""},
}

# The part of each command line that makes it fail fast, or not start a server, whatever the flag.
_BASES: dict[str, tuple[str, ...]] = {
    "study": ("study", "--config", STUDY_FILE, "--dry-run"),
    "measure": ("measure", "--endpoint", CLOSED, "--requests", "1", "--max-tokens", "8", "--timeout", "5s"),
    "report": ("report", "studies/tiny"),
    "recommend": ("recommend", "studies/tiny"),
    "rig": ("rig", "studies/tiny"),
    "emulate": ("emulate", "--print-truth"),
    "workloads": ("workloads", "import", "afile.jsonl"),
    "watch": ("watch", "--endpoint", CLOSED, "--duration", "1s", "--interval", "0.2s"),
}
# Flags that only act when the study runs: tried without --dry-run, with these values that must fail.
_STUDY_RUN_FLAGS = {
    "storage": {"not-a-url", "sqlite-unwritable", "unknown-scheme", "journal-missing-folder"},
    "studies_dir": {"unwritable", "a-file"},
    "rig": {"unwritable", "missing", "a-file", "a-folder", "empty"},
    "worker": set(),
}
# Values a flag may take that are not misuse (the case then only must not fail loudly or write outside).
# The emulate flags --print-truth reads: the others are ignored by the command line these cases run.
_TRUTH_FLAGS = {"speculative_config", "profile", "concurrency", "temperature", "max_tokens", "prompt_tokens", "traffic"}
_FINE = {"zero", "negative", "empty", "huge", "a-folder", "missing", "text-file", "slash", "dotdot", "gap"}

_COMMANDS = {
    "study": study.study, "measure": measure.measure, "report": report.report, "recommend": recommend.recommend,
    "rig": rig.rig, "emulate": emulate.emulate, "workloads": workloads.workloads, "watch": watch.watch,
}  # fmt: skip


def _flag_of(name: str, info: Any) -> str | None:
    if isinstance(info, typer.models.ArgumentInfo):
        return None
    decls = [d for d in (getattr(info, "param_decls", None) or ()) if d.startswith("--")]
    return decls[0] if decls else "--" + name.replace("_", "-")


def flag_cases() -> Iterator[Case]:
    """Each option of each command, with values of the wrong kind for what it takes."""
    study_file = ((STUDY_FILE, _toml(tiny_study())), ("afile", "x"), ("afile.toml", "x = "), ("afolder/x", ""),
                  ("afile.jsonl", '{"prompt": "hello"}\n'))  # fmt: skip
    for command, function in _COMMANDS.items():
        hints = typing.get_type_hints(function)
        for name, parameter in inspect.signature(function).parameters.items():
            flag = _flag_of(name, parameter.default)
            kind = hints.get(name)
            if flag is None or kind is bool or getattr(parameter.default, "hidden", False):
                continue
            values = _SPECIAL.get(name) or (_NUMBERS if kind in (int, float) else _PATHS if kind is Path else _STRINGS)
            base = _BASES[command]
            if command == "study" and name in _STUDY_RUN_FLAGS:
                # without --dry-run, and only values that must fail: one that works would run the study
                base = base[:-1]
                values = {label: v for label, v in values.items() if label in _STUDY_RUN_FLAGS[name]}
            if name in ("endpoint", "prometheus"):
                base = tuple(a for a in base if a not in (CLOSED, "--endpoint"))
            for label, value in values.items():
                expect: Literal["error", "any"] = "error"
                if label in _FINE or values is _STRINGS or (command == "emulate" and name not in _TRUTH_FLAGS):
                    expect = "any"  # a value that may be fine, or a flag --print-truth does not read
                if (kind in (int, float) and label in ("text", "nan", "inf")) or name in ("endpoint", "prometheus"):
                    expect = "error"  # not a number, or nothing listens there
                if command in ("measure", "watch"):
                    expect = "error"  # nothing listens where these point
                yield Case(id=f"flag-{command}-{flag[2:]}-{label}", argv=(*base, flag, value), files=study_file,
                           expect=expect, study=command in ("report", "recommend", "rig"))  # fmt: skip
    yield from _flag_specials(study_file)


def _flag_specials(files: tuple[tuple[str, str | bytes | Link], ...]) -> Iterator[Case]:
    """Command lines the generated ones do not reach: runs that write, names that become paths,
    and the emulator serving."""
    yield Case(id="report-out-unwritable", argv=("report", "studies/tiny", "--out", "/proc/x"), study=True)
    yield Case(id="report-out-a-file", argv=("report", "studies/tiny", "--out", "afile"), files=files, study=True)
    yield Case(id="rig-out-unwritable", argv=("rig", "studies/tiny", "--out", "/proc/x"), study=True)
    yield Case(id="report-no-study", argv=("report", "afolder"), files=files)
    yield Case(id="report-corrupt-db", argv=("report", "broken"), files=(("broken/study.db", b"not sqlite"),))
    yield Case(id="recommend-unknown-workload", argv=("recommend", "studies/tiny", "--workload", "nope"), study=True)
    yield Case(id="study-studies-dir-unwritable", argv=("study", "--config", STUDY_FILE, "--studies-dir", "/proc/x"),
               files=files)  # fmt: skip
    yield Case(id="study-resume-nothing", argv=("study", "--config", STUDY_FILE, "--resume"), files=files)
    yield Case(id="study-again-without-resume", argv=("study", "--config", STUDY_FILE), files=files, study=True)
    yield Case(id="workloads-import-out-unwritable", argv=("workloads", "import", "afile.jsonl", "--out", "/proc/x"),
               files=files)  # fmt: skip
    yield Case(id="workloads-import-over-itself", argv=("workloads", "import", "afile.jsonl", "--name", "afile"),
               files=files)  # fmt: skip
    yield Case(id="workloads-import-two-files", argv=("workloads", "import", "afile.jsonl", "afile"), files=files)
    yield Case(id="workloads-name-without-import", argv=("workloads", "prose", "--name", "x"))
    yield Case(id="workloads-import-name-escapes", argv=("workloads", "import", "afile.jsonl", "--name", "../escaped"),
               files=files)  # fmt: skip
    yield Case(id="study-name-escapes", argv=("study", "--config", STUDY_FILE, "--study-name", "../escaped"),
               files=files)  # fmt: skip
    yield Case(id="measure-url-with-password", argv=("measure", "--endpoint", f"http://user:{SECRET}@127.0.0.1:1"),
               secret=SECRET)  # fmt: skip
    yield Case(id="measure-rig-not-json", argv=(*_BASES["measure"], "--rig", "afile"), files=files)
    yield Case(id="measure-rig-a-study-db", argv=(*_BASES["measure"], "--rig", "studies/tiny/study.db"), study=True)
    yield Case(id="watch-no-source", argv=("watch",))
    yield Case(id="watch-prometheus-flags-alone", argv=("watch", "--endpoint", CLOSED, "--since", "1h"))
    yield Case(id="watch-rig-not-json", argv=(*_BASES["watch"], "--rig", "afile"), files=files)
    for name, argv in {
        "port-99999": ("--port", "99999"),
        "port-negative": ("--port", "-1"),
        "host-invalid": ("--host", "999.0.0.1"),
        "trace-unwritable": ("--trace", "/proc/x/trace.jsonl"),
        "speculative-config-not-json": ("--speculative-config", "{bad"),
        "speculative-config-unknown-method": ("--speculative-config", '{"method": "nope"}'),
        "profile-missing": ("--profile", "no-such-rig"),
        "traffic-missing": ("--traffic", "no-such-schedule"),
    }.items():
        yield Case(id=f"emulate-serve-{name}", argv=("emulate", "--startup-seconds", "0", *argv), child=True)


# -- workload files (workloads FILE: read and checked, nothing started) ------------------------


def workload_cases() -> Iterator[Case]:
    """Files that are not workloads, or are workloads with wrong records."""
    line = json.dumps
    files: dict[str, tuple[str, str | bytes | Link]] = {
        "empty": ("w.jsonl", ""),
        "blank-lines": ("w.jsonl", "\n\n\n"),
        "not-json": ("w.jsonl", "hello\n"),
        "half-json": ("w.jsonl", '{"prompt": "a"\n'),
        "json-list-line": ("w.jsonl", "[1, 2]\n"),
        "number-line": ("w.jsonl", "5\n"),
        "no-prompt": ("w.jsonl", line({"id": "a"}) + "\n"),
        "prompt-number": ("w.jsonl", line({"prompt": 5}) + "\n"),
        "prompt-empty": ("w.jsonl", line({"prompt": ""}) + "\n"),
        "prompt-null": ("w.jsonl", line({"prompt": None}) + "\n"),
        "messages-empty": ("w.jsonl", line({"messages": []}) + "\n"),
        "messages-text": ("w.jsonl", line({"messages": "hi"}) + "\n"),
        "message-no-role": ("w.jsonl", line({"messages": [{"content": "hi"}]}) + "\n"),
        "message-content-number": ("w.jsonl", line({"messages": [{"role": "user", "content": 3}]}) + "\n"),
        "both-prompt-and-messages": ("w.jsonl", line({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})),
        "id-list": ("w.jsonl", line({"prompt": "a", "id": [1]}) + "\n"),
        "subcategory-table": ("w.jsonl", line({"prompt": "a", "subcategory": {"x": 1}}) + "\n"),
        "duplicate-ids": ("w.jsonl", line({"prompt": "a", "id": "x"}) + "\n" + line({"prompt": "b", "id": "x"}) + "\n"),
        "unknown-field": ("w.jsonl", line({"prompt": "a", "colour": "red"}) + "\n"),
        "deep-json": ("w.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
        "huge-line": ("w.jsonl", line({"prompt": "word " * 400_000}) + "\n"),
        "huge-integer": ("w.jsonl", '{"prompt": "a", "id": ' + "9" * 5000 + "}\n"),
        "nan": ("w.jsonl", '{"prompt": NaN}\n'),
        "not-utf8": ("w.jsonl", b"\xff\xfe\x00\x01\n"),
        "bom": ("w.jsonl", "\ufeff" + line({"prompt": "a"}) + "\n"),
        "nul": ("w.jsonl", '{"prompt": "a\x00b"}\n'),
        "json-array-file": ("w.json", "[1, 2, 3]"),
        "json-object-file": ("w.json", '{"prompt": "a"}'),
        "json-empty-array": ("w.json", "[]"),
        "sharegpt-no-human": ("w.json", line([{"conversations": [{"from": "gpt", "value": "x"}]}])),
        "sharegpt-bad-turn": ("w.json", line([{"conversations": [{"from": "human"}]}])),
        "openai-only-assistant": ("w.jsonl", line({"messages": [{"role": "assistant", "content": "x"}]}) + "\n"),
        "text-empty": ("w.txt", ""),
        "text-blank": ("w.txt", "\n \n\t\n"),
        "text-binary": ("w.txt", bytes(range(256))),
        "unknown-suffix": ("w.csv", "prompt\nhello\n"),
    }
    for name, (path, content) in files.items():
        yield Case(id=f"workload-{name}", argv=("workloads", path), files=((path, content),), expect="any")
    yield Case(id="workload-missing", argv=("workloads", "no-such.jsonl"))
    yield Case(id="workload-a-folder", argv=("workloads", "afolder"), files=(("afolder/x", ""),))
    yield Case(id="workload-dev-null", argv=("workloads", "/dev/null"))
    yield Case(
        id="workload-symlink-loop", argv=("workloads", "loop.jsonl"), files=(("loop.jsonl", Link("loop.jsonl")),)
    )
    yield Case(
        id="workload-link-outside",
        argv=("workloads", "import", "in.jsonl", "--name", "victim"),
        files=(("in.jsonl", '{"prompt": "a"}\n'), ("victim.jsonl", Link("{outside}/victim.txt"))),
        expect="any",
    )


# -- endpoints that answer wrongly (the test's own server) -------------------------------------

SERVER_MODES = (
    "http-500", "garbage-sse", "truncated", "wrong-json", "no-usage", "negative-usage", "html", "empty", "not-found",
    "metrics-garbage", "huge-line", "never-answers",
)  # fmt: skip


def endpoint_cases() -> Iterator[Case]:
    """measure and watch against a server that answers each wrong way."""
    quick = ("--requests", "1", "--max-tokens", "8", "--timeout", "3s", "--concurrency", "1")
    for mode in SERVER_MODES:
        url = f"{{server:{mode}}}"
        measure = ("measure", "--endpoint", url, *quick)
        if mode == "never-answers":  # each request waits out its timeout: one case is enough
            yield Case(id=f"endpoint-{mode}-measure-chat", argv=measure)
            continue
        expect: Literal["error", "any"] = "any" if mode == "metrics-garbage" else "error"  # its streams are right
        if mode in ("http-500", "no-usage", "truncated"):  # no warm-up: the level itself meets the fault
            yield Case(id=f"endpoint-{mode}-measure-no-warmup", argv=(*measure, "--model", "m", "--warmup", "0"))
        yield Case(id=f"endpoint-{mode}-measure-chat", argv=measure, expect=expect)
        yield Case(id=f"endpoint-{mode}-measure-completions", argv=(*measure, "--api", "completions", "--model", "m"),
                   expect=expect)  # fmt: skip
        yield Case(id=f"endpoint-{mode}-measure-json-out", argv=(*measure, "--json", "--out", "out"), expect=expect)
        yield Case(id=f"endpoint-{mode}-watch", argv=("watch", "--endpoint", url, "--duration", "1s", "--interval",
                   "0.2s"), expect="any")  # fmt: skip


def all_cases() -> list[Case]:
    return [*study_file_cases(), *flag_cases(), *workload_cases(), *endpoint_cases()]
