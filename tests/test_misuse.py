"""Misuse of every command: generated bad input, run as a user runs it, and what must never happen.

The cases (``tests/misuse_cases.py``): study files with wrong types, unknown keys, out-of-range
values and bad templates; every flag of every command with values of the wrong kind; workload
files that are not workloads; endpoints that answer wrongly (this file's own server); the
emulator serving with bad flags; and HTTP bodies of every shape sent to the emulator. Each case
runs in a working folder of its own, beside a folder nothing may touch, and asserts:

- no traceback, on stdout or stderr, and no exception escaping the command;
- a failure exits non-zero, with one error line; a case that must fail never exits 0, and a
  command that measures never exits 0 having measured nothing;
- nothing is written outside the working folder;
- a secret handed to the command appears in no output and no file it writes.

Most cases call the command line in this process (typer's runner: the same code, without the
second or two a child process takes to import it); the emulator's serving cases run it as a child
process.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specsweep.cli import app, old_spellings
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

from .builders import emulator_study, measured_study, specsweep, write_study
from .misuse_cases import SERVER_MODES, Case, Link, all_cases

CASES = all_cases()
# What a command that measures prints when it measured nothing: its exit code must not be 0 then.
NOTHING_MEASURED = ("no configuration was measured successfully", "every request failed")

# -- the working folder, and what is outside it ------------------------------------------------


def _tree(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` but ``skip``, with its size and modification time."""
    found = {}
    for path in root.rglob("*"):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        info = path.lstat()
        found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return found


def _fill(text: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        text = text.replace("{" + name + "}", value)
    return text


def _prepare(case: Case, tmp_path: Path, places: dict[str, str], stored_study: Path | None) -> Path:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("left alone\n")
    for name, content in case.files:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(_fill(content.target, places))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(_fill(content, places), encoding="utf-8")
    if case.study:
        assert stored_study is not None
        shutil.copytree(stored_study, work / "studies" / "tiny")
    return work


# -- the test's own server, answering wrongly --------------------------------------------------

_MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


_CHUNK = {"choices": [{"index": 0, "delta": {"content": "hi"}, "text": "hi", "finish_reason": None}]}


class _WrongServer(http.server.BaseHTTPRequestHandler):
    """Answers every request in its server's ``mode``: each a way an endpoint can be wrong."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json", length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode in ("http-500", "html", "empty", "not-found", "never-answers"):
            return self._answer(mode)
        if self.path.startswith("/v1/models"):
            return self._send(200, b'{"data": "x"}' if mode == "wrong-json" else _MODELS)
        if self.path.startswith("/metrics"):
            return self._send(200, bytes(range(256)) * 4 if mode == "metrics-garbage" else b"", "text/plain")
        return self._send(404, b'{"error": "no"}')

    def do_POST(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(mode)

    def _answer(self, mode: str) -> None:
        done = {"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}}
        bodies = {
            "garbage-sse": _sse(b"{not json", bytes(range(1, 200)), b"[DONE]"),
            "no-usage": _sse(_CHUNK, done, b"[DONE]"),
            "negative-usage": _sse(
                _CHUNK, {"choices": [], "usage": {"prompt_tokens": "x", "completion_tokens": -5}}, b"[DONE]"
            ),
            "metrics-garbage": _sse(_CHUNK, done, usage, b"[DONE]"),
            "huge-line": b"data: " + b"x" * 3_000_000 + b"\n\n",
        }
        if mode == "never-answers":
            time.sleep(8)
            return self._send(200, b"")
        if mode == "http-500":
            return self._send(500, b'{"error": {"message": "engine\\nexploded", "code": 500}}')
        if mode == "html":
            return self._send(200, b"<html><body>proxy login</body></html>", "text/html")
        if mode == "empty":
            return self._send(200, b"", "text/event-stream")
        if mode == "not-found":
            return self._send(404, b"Not Found", "text/plain")
        if mode == "wrong-json":
            return self._send(200, b'{"choices": 5, "usage": "lots"}')
        if mode == "truncated":
            body = _sse(_CHUNK, _CHUNK)
            self._send(200, body[: len(body) // 2], "text/event-stream", length=len(body) + 500)
            self.close_connection = True
            return None
        return self._send(200, bodies[mode], "text/event-stream")


@pytest.fixture(scope="module")
def wrong_servers() -> Iterator[dict[str, str]]:
    """One loopback server per way of answering wrongly: ``{"server:MODE": URL}``."""
    servers = []
    for mode in SERVER_MODES:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongServer)
        server.daemon_threads = True
        server.mode = mode  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield {f"server:{s.mode}": f"http://127.0.0.1:{s.server_address[1]}" for s in servers}  # type: ignore[attr-defined]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def stored_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small emulator study measured once, for the cases of report, recommend and rig."""
    return measured_study(tmp_path_factory.mktemp("stored"), "tiny", k=(1, 2))


def _closed_url() -> str:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


# -- one case ------------------------------------------------------------------------------------


def _run(case: Case, argv: list[str], work: Path) -> tuple[int, str, str, BaseException | None]:
    """The command line in a child process (``case.child``) or in this one; exit code, stdout,
    stderr and any exception that escaped it."""
    env: dict[str, str | None] = {"COLUMNS": "200", "SPECSWEEP_MISUSE_UNSET": None}
    if case.child:
        try:
            done = specsweep(*argv, cwd=work, timeout=60)
        except Exception as exc:  # a timeout: it served, or hung, where it should have refused
            return -1, "", "", exc
        return done.returncode, done.stdout, done.stderr, None
    here = os.getcwd()
    os.chdir(work)
    try:
        result = CliRunner().invoke(app, old_spellings(argv), env=env)
    finally:
        os.chdir(here)
    escaped = result.exception if result.exception and not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.stdout, result.stderr, escaped


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_misuse_fails_in_one_line_and_writes_only_where_it_was_told(
    case: Case, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    places = {"closed": _closed_url(), "outside": str(tmp_path / "outside")}
    if any("{server:" in a for a in case.argv):
        places |= request.getfixturevalue("wrong_servers")
    stored = request.getfixturevalue("stored_study") if case.study else None
    work = _prepare(case, tmp_path, places, stored)
    before, given = _tree(tmp_path, work), _tree(work)
    argv = [_fill(a, places) for a in case.argv]
    code, out, err, escaped = _run(case, argv, work)
    said = f"exit {code}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
    assert escaped is None, f"{escaped!r}\n{said}"
    assert "Traceback" not in out + err, said
    if case.expect == "error":
        assert code != 0, said
    if code != 0:
        errors = [line for line in err.splitlines() if line.startswith(("specsweep: error:", "Error:", "ERROR "))]
        if not case.child:
            assert len(errors) == 1, said
    elif argv[0] in ("study", "measure") and "--dry-run" not in argv:
        assert not any(words in out + err for words in NOTHING_MEASURED), said
    assert _tree(tmp_path, work) == before, f"written outside the working folder\n{said}"
    if case.secret:
        assert case.secret not in out + err, said
        for name, state in _tree(work).items():  # what the command wrote or changed, not what it was given
            path = work / name
            if state != given.get(name) and path.is_file() and not path.is_symlink() and path.suffix != ".log":
                assert case.secret.encode() not in path.read_bytes(), f"{path}\n{said}"


def test_the_cases_number_at_least_three_hundred() -> None:
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


# -- HTTP bodies sent to the emulator --------------------------------------------------------

_DEEP = "[" * 100_000 + "]" * 100_000
BODIES: dict[str, tuple[bytes | str, dict[str, str]]] = {
    "nested-100k-list": (_DEEP, {}),
    "nested-100k-object": ('{"a":' * 100_000 + "1" + "}" * 100_000, {}),
    "nested-100k-in-messages": ('{"messages": ' + _DEEP + ', "max_tokens": 4}', {}),
    "nested-100k-in-prompt": ('{"prompt": ' + _DEEP + ', "max_tokens": 4}', {}),
    "charset-unknown": ('{"prompt": "x", "max_tokens": 4}', {"content-type": "application/json; charset=nope"}),
    "integer-5000-digits": ('{"prompt": "x", "max_tokens": ' + "9" * 5000 + "}", {}),
    "not-utf8": (b"\xff\xfe\x00", {}),
    "empty": (b"", {}),
    "not-json": ("hello", {}),
    "a-list": ("[1, 2]", {}),
    "a-string": ('"x"', {}),
    "nan-temperature": ('{"prompt": "x", "temperature": NaN, "max_tokens": 4}', {}),
    "infinite-max-tokens": ('{"prompt": "x", "max_tokens": Infinity}', {}),
    "huge-max-tokens": (
        json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**40}),
        {},
    ),
    "text-part-a-number": (
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 4}),
        {},
    ),
    "content-a-table": (json.dumps({"messages": [{"role": "user", "content": {}}], "max_tokens": 4}), {}),
    "message-a-string": (json.dumps({"messages": ["hi"], "max_tokens": 4}), {}),
    "model-a-list": (json.dumps({"prompt": "x", "model": [1], "max_tokens": 4}), {}),
    "n-two": (json.dumps({"prompt": "x", "n": 2, "max_tokens": 4}), {}),
    "stream-options-a-list": (json.dumps({"prompt": "x", "stream": True, "stream_options": [1], "max_tokens": 4}), {}),
    "max-tokens-text": (
        json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": "4"}),
        {},
    ),
    "max-tokens-zero": (
        json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
        {},
    ),
    "prompt-3-mb": (json.dumps({"prompt": "word " * 600_000, "max_tokens": 4}), {}),
}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One emulator for the body cases (its URL and log), stopped by its PID at the end."""
    port = free_port()
    log = tmp_path_factory.mktemp("emulator") / "emulator.log"
    argv = emulator_argv(port=port, time_scale=200.0, seed=0, extra=["--startup-seconds", "0"])
    server = ServerProcess(argv, log_path=log)
    server.start()
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        yield f"http://127.0.0.1:{port}", log
    finally:
        server.stop(grace_s=5)


def _check_answer(response: httpx.Response) -> None:
    assert response.status_code in (200, 400, 404, 413), (response.status_code, response.text[:300])
    if response.status_code in (400, 404):
        error = response.json()["error"]
        assert error["message"] and error["code"] == response.status_code


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("name", list(BODIES))
def test_any_body_to_the_emulator_is_answered_and_logged_in_one_line(
    emulator: tuple[str, Path], name: str, path: str
) -> None:
    url, log = emulator
    before = log.read_text().count("\n")
    body, headers = BODIES[name]
    response = httpx.post(url + path, content=body, headers=headers, timeout=60)
    _check_answer(response)
    added = log.read_text().splitlines()[before:]
    assert not any("Traceback" in line for line in added), added
    if response.status_code in (400, 404):
        assert len([line for line in added if f"POST {path}: HTTP {response.status_code}" in line]) == 1, added


_field = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**30), st.floats(allow_nan=True), st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from(["role", "content", "text", "type"]),
                                                             st.text(max_size=4), max_size=3),
)  # fmt: skip
_message = st.one_of(
    _field,
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", ""])},
                          optional={"content": st.one_of(_field, st.lists(_field, max_size=2))}),
)  # fmt: skip
_body = st.fixed_dictionaries(
    {"max_tokens": st.one_of(st.integers(-2, 12), st.text(max_size=2), st.floats(0, 5))},  # never a long answer
    optional={
        "prompt": _field, "messages": st.one_of(_field, st.lists(_message, max_size=3)), "model": _field,
        "temperature": _field, "stream": _field, "stream_options": st.one_of(_field, st.fixed_dictionaries(
            {}, optional={"include_usage": _field, "continuous_usage_stats": _field})), "n": _field,
        "max_completion_tokens": st.one_of(st.integers(-2, 12), st.text(max_size=2)),
    },
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_body, chat=st.booleans())
def test_any_generated_body_to_the_emulator_is_answered_without_a_traceback(
    emulator: tuple[str, Path], body: dict, chat: bool
) -> None:
    url, log = emulator
    path = "/v1/chat/completions" if chat else "/v1/completions"
    _check_answer(httpx.post(url + path, content=json.dumps(body), timeout=60))
    assert "Traceback" not in log.read_text()


# -- a resume after the study file changed ---------------------------------------------------


def test_a_resume_after_the_measured_settings_changed_names_them_and_leaves_nothing_running(
    stored_study: Path, tmp_path: Path
) -> None:
    shutil.copytree(stored_study, tmp_path / "studies" / "tiny")
    changed = emulator_study("tiny", k=(1, 2), requests=2, max_tokens=30, temperature=0.7, concurrency=(1, 2))
    write_study(tmp_path / "s.toml", changed)
    storage = f"sqlite:///{tmp_path / 'studies' / 'tiny' / 'study.db'}"
    states = [t.state for t in optuna.load_study(study_name="tiny", storage=storage).trials]
    result = specsweep("study", "--config", "s.toml", "--resume", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("specsweep: error: "), result.stderr
    for said in (
        "measure.temperature 0.0 (now 0.7)",
        "measure.concurrency [1] (now [1, 2])",
        "search.draft_sample_method",
    ):
        assert said in result.stderr, result.stderr
    # the output length is what a level measures too: a resume at another one is refused alone
    write_study(tmp_path / "s.toml", emulator_study("tiny", k=(1, 2), requests=2, max_tokens=30))
    longer = specsweep("study", "--config", "s.toml", "--resume", "--max-tokens", "60", cwd=tmp_path)
    assert longer.returncode == 1 and longer.stderr.count("\n") == 1, longer.stderr
    assert "measure.max_tokens 30 (now 60)" in longer.stderr, longer.stderr
    assert "measure.max_tokens" not in result.stderr  # unchanged in the first resume: not named
    after = [t.state for t in optuna.load_study(study_name="tiny", storage=storage).trials]
    assert after == states and optuna.trial.TrialState.RUNNING not in after
