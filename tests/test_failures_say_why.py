"""A study or a measurement that measured nothing exits non-zero with one line that carries the
server's own reason; values no server can answer are refused before a start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep.engines.registry import engine_info, max_model_len_flag
from specsweep.runtime.client import ERROR_CHARS, server_error_line

from .builders import emulator_study, specsweep, write_study

# Below the emulator profile's max model length (400,000), so no check before a start can refuse
# it, yet with any prompt beyond it: the server refuses every request, as vLLM does.
REFUSED_MAX_TOKENS = 399_990
CONTEXT = "maximum context length is 400000 tokens"


def one_line_failure(done, *, says: tuple[str, ...]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specsweep: error: "), done.stderr
    for words in says:
        assert words in lines[0], lines[0]
    return lines[0]


def test_the_server_error_is_its_first_line_trimmed_and_without_the_key() -> None:
    body = json.dumps({"error": {"message": "bad key sk-secret-1 for Bearer abc.def\nsecond line\n"}})
    assert server_error_line(body, secret="sk-secret-1") == "bad key *** for Bearer ***"
    assert server_error_line("\n\n  first   words \nsecond") == "first words"
    long = server_error_line("x" * 5000)
    assert len(long) == ERROR_CHARS and long.endswith("...")
    assert server_error_line("") == "(empty body)"


@pytest.mark.parametrize(
    ("engine", "argv", "found"),
    [
        ("vllm", ["vllm", "serve", "m", "--max-model-len", "8192"], (8192, "--max-model-len")),
        ("vllm", ["vllm", "serve", "m", "--max-model-len=4096"], (4096, "--max-model-len")),
        ("vllm", ["vllm", "serve", "m", "--max-model-len", "auto"], None),
        ("sglang", ["python", "-m", "sglang.launch_server", "--context-length", "32768"], (32768, "--context-length")),
        ("llama.cpp", ["llama-server", "-m", "x.gguf", "-c", "2048"], (2048, "-c")),
        ("llama.cpp", ["llama-server", "--ctx-size", "0"], None),  # 0: the model's own
        ("llama.cpp", ["llama-server", "-m", "x.gguf"], None),
    ],
)
def test_the_max_model_len_of_a_start_command(engine: str, argv: list[str], found: tuple[int, str] | None) -> None:
    assert max_model_len_flag(engine_info(engine), argv) == found


def test_max_tokens_beyond_the_server_is_refused_before_a_start(tmp_path: Path) -> None:
    emulator = write_study(tmp_path / "e.toml", emulator_study("huge", max_tokens=100_000_000_000))
    vllm = emulator_study("vllm-short", max_tokens=9000)
    vllm["server"] = {"engine": "vllm", "start": "vllm serve m --port {port} --max-model-len 8192 {spec_args}"}
    vllm_file = write_study(tmp_path / "v.toml", vllm)
    for config, says in (
        (emulator, ("measure.max_tokens (100,000,000,000)", "(400,000, profile dgx-spark-v4-flash)")),
        (vllm_file, ("measure.max_tokens (9,000)", "(8,192, --max-model-len in server.start)")),
    ):
        for dry in ((), ("--dry-run",)):
            done = specsweep("study", "--config", str(config), *dry, cwd=tmp_path)
            one_line_failure(done, says=says)
    assert not (tmp_path / "studies").exists()


def test_a_study_whose_every_request_is_refused_exits_1_with_the_servers_reason(tmp_path: Path) -> None:
    data = emulator_study("refused", k=(1, 1), concurrency=(1, 4), max_tokens=REFUSED_MAX_TOKENS)
    config = write_study(tmp_path / "s.toml", data)
    done = specsweep("study", "--config", str(config), cwd=tmp_path)
    one_line_failure(
        done,
        says=("study refused measured no configuration", "every request at concurrency 1 failed: HTTP 400:", CONTEXT),
    )
    assert "concurrency 4 not measured" in done.stderr
    trial = json.loads((tmp_path / "studies" / "refused" / "trials" / "trial-0000.json").read_text())
    level = trial["workloads"]["prose"]["levels"][0]
    assert all(CONTEXT in record["error"] for record in level["records"])
    assert any(CONTEXT in note for note in level["notes"])
    report = specsweep("report", "studies/refused", cwd=tmp_path)
    line = one_line_failure(report, says=("trial(s) failed, the last: measurement failed", CONTEXT))
    assert "--resume" not in line


def test_measure_whose_every_request_is_refused_exits_1_and_names_the_level_left(start_emulator) -> None:
    emulator = start_emulator(time_scale=200)
    done = specsweep(
        "measure", "--endpoint", emulator.url, "--concurrency", "1,4", "--requests", "4",
        "--max-tokens", str(REFUSED_MAX_TOKENS),
    )  # fmt: skip
    one_line_failure(
        done, says=("every request at concurrency 1 failed: HTTP 400:", CONTEXT, "; concurrency 4 not measured")
    )
    said = " ".join(done.stdout.split())  # as read: lines wrap at the console's width
    assert f"4 request(s) failed (HTTP 400 x4); the first: HTTP 400: This model's {CONTEXT}" in said
