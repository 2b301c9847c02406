"""Secrets are masked everywhere specsweep writes or prints: what a secret is (specsweep.secrets),
and a study, report, rig, measure, watch and dry run with secrets planted in every place a user
can put one, whose files and console hold none of them (the server's own logs aside)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from specsweep.cli.options import check_url
from specsweep.secrets import is_secret_name, mask_argv, mask_text, mask_url, secrets_in

from .builders import specsweep, write_study


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("--api-key", True), ("--api_key", True), ("--API-KEY", True), ("--hf-token", True), ("--password", True),
        ("--secret", True), ("--ssl-keyfile-password", True), ("HF_TOKEN", True), ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True), ("PGPASSWORD", True), ("apiKey", True), ("'api_key'", True),
        ("--max-num-batched-tokens", False), ("--num-speculative-tokens", False), ("--tokenizer", False),
        ("TOKENIZERS_PARALLELISM", False), ("--api-key-env", False), ("--api-key-file", False),
        ("--ssl-keyfile", False), ("AWS_ACCESS_KEY_ID", False), ("--kv-cache-dtype", False), ("--port", False),
    ],
)  # fmt: skip
def test_a_name_says_whether_its_value_is_secret(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    ("argv", "masked"),
    [
        (["vllm", "--api-key", "sk-1", "--port", "8"], ["vllm", "--api-key", "***", "--port", "8"]),
        (["vllm", "--api-key", "k1", "k2", "--port", "8"], ["vllm", "--api-key", "***", "***", "--port", "8"]),
        (["x", "--hf-token=hf_abc", "--password=p w"], ["x", "--hf-token=***", "--password=***"]),
        (["env", "HF_TOKEN=hf_abc", "vllm"], ["env", "HF_TOKEN=***", "vllm"]),
        (["x", "--max-num-batched-tokens", "8192"], ["x", "--max-num-batched-tokens", "8192"]),
        (["x", "--endpoint", "http://u:p4ss@h:1/v1"], ["x", "--endpoint", "http://u:***@h:1/v1"]),
        (
            ["/bin/sh", "-c", "HF_TOKEN=hf_a vllm serve --api-key 'sk 1' --secret s3 --port 8"],
            ["/bin/sh", "-c", "HF_TOKEN=*** vllm serve --api-key *** --secret *** --port 8"],
        ),
    ],
)  # fmt: skip
def test_a_command_line_keeps_its_flags_and_loses_its_secrets(argv: list[str], masked: list[str]) -> None:
    assert mask_argv(argv) == tuple(masked)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("could not reach http://bob:hunter2@host:9090/api", "could not reach http://bob:***@host:9090/api"),
        ("clone https://ghp_abc@github.com/x", "clone https://***@github.com/x"),
        ("Namespace(api_key=['sk-1'], model='m')", "Namespace(api_key=***, model='m')"),
        ("args: {'api_key': ['sk-1'], 'hf_token': 'hf_2'}", "args: {'api_key': ***, 'hf_token': ***}"),
        ("GET /metrics?token=abc&x=1", "GET /metrics?token=***&x=1"),
    ],
)  # fmt: skip
def test_free_text_loses_its_secrets(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "named by --api-key-env (server.api_key_env in a study file)",
        "max_num_batched_tokens=8192 num_speculative_tokens=3 --max-tokens 600",
        "http://127.0.0.1:8000/v1 answered 404",
        'k=2 dspark: {"method":"dspark","num_speculative_tokens":2}',
    ],
)
def test_text_without_secrets_is_left_as_it_is(text: str) -> None:
    assert mask_text(text) == text


def test_known_values_are_masked_wherever_they_appear_and_short_ones_are_not_looked_for() -> None:
    known = secrets_in(
        commands=["HF_TOKEN=hf_inline vllm --api-key 'sk quoted'", ("x", "--secret", "s3cr3t", "--token=on")],
        env={"HUGGING_FACE_HUB_TOKEN": "hf_env_value", "VLLM_LOGGING_LEVEL": "INFO", "MY_KEY": "1"},
    )
    assert known == {"hf_inline", "sk quoted", "s3cr3t", "hf_env_value"}  # "on" and "1": too short to look for
    assert mask_text("boot failed: invalid key s3cr3t (hf_env_value)", known) == "boot failed: invalid key *** (***)"
    assert mask_url("http://user:pw@h:1/x") == "http://user:***@h:1/x" and mask_url("http://h:1") == "http://h:1"


PLANTED = {
    "flag": "sk-flag-planted-4e1c",  # --api-key in the start command (and sent by specsweep from PLANTED_KEY)
    "inline": "hf-inline-planted-9a7d",  # HF_TOKEN=... in a shell-string start
    "table": "hf-table-planted-51b0",  # [server.env] HUGGING_FACE_HUB_TOKEN
    "argv": "sk-argv-planted-c32f",  # --api-key=... in an argv start (dry run)
    "endpoint": "pw-endpoint-planted-7d21",  # userinfo of --endpoint (measure, watch)
    "prometheus": "pw-prometheus-planted-0be6",  # userinfo of --prometheus
    "failed": "sk-failed-planted-d9a8",  # a start command that prints it and fails
}
STEADY = 'name = "steady"\n[[window]]\nduration_s = 3600\nstreams = 1\nmix = { technical = 1.0 }\n'


def study_file(name: str, start: str | list[str], **server: object) -> dict:
    return {
        "study": {"name": name, "max_consecutive_failures": 1, "sampler": "grid"},
        "server": {"engine": "vllm", "mode": "process", "start": start, "ready_timeout_s": 30, "stop_grace_s": 5,
                   **server},
        "search": {"num_speculative_tokens": [2, 2], "fixed": {"method": "dspark"}},
        "measure": {"concurrency": [1], "requests": 2, "max_tokens": 30},
    }  # fmt: skip


def specsweep_together(cwd: Path, **commands: tuple[str, ...]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Independent ``specsweep`` commands run at once (each a child process, as builders.specsweep)."""
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "specsweep", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def test_an_endpoint_without_its_scheme_is_shown_masked() -> None:
    with pytest.raises(typer.BadParameter) as refused:
        check_url("user:hunter22@127.0.0.1:8000")
    assert "hunter22" not in str(refused.value) and "write http://user:***@127.0.0.1:8000" in str(refused.value)


@pytest.mark.slow
def test_no_secret_reaches_a_file_or_the_console(tmp_path: Path, start_emulator) -> None:
    emulate = f"{shlex.quote(sys.executable)} -m specsweep emulate --host {{host}} --port {{port}} --time-scale 200"
    start = f"HF_TOKEN={PLANTED['inline']} {emulate} --startup-seconds 0 --api-key {PLANTED['flag']} {{spec_args}}"
    table = {"HUGGING_FACE_HUB_TOKEN": PLANTED["table"]}
    write_study(tmp_path / "keyed.toml", study_file("keyed", start, api_key_env="PLANTED_KEY", env=table))
    argv = [sys.executable, "-m", "specsweep", "emulate", "--port", "{port}", f"--api-key={PLANTED['argv']}"]
    write_study(tmp_path / "argv.toml", study_file("argv", [*argv, "{spec_args}"]))
    failing = f"echo starting with --api-key {PLANTED['failed']} and {PLANTED['failed']}; exit 3"
    write_study(tmp_path / "failing.toml", study_file("failing", failing))
    (tmp_path / "steady.toml").write_text(STEADY)
    server = start_emulator(time_scale=100, extra=["--traffic", str(tmp_path / "steady.toml")])
    host = server.url.removeprefix("http://")

    keyed = specsweep("study", "--config", "keyed.toml", cwd=tmp_path, env={"PLANTED_KEY": PLANTED["flag"]})
    assert keyed.returncode == 0, keyed.stderr
    runs = {"study": keyed} | specsweep_together(
        tmp_path,
        report=("report", "studies/keyed"),
        rig=("rig", "studies/keyed"),
        dry_run=("study", "--config", "keyed.toml", "--dry-run"),
        dry_run_argv=("study", "--config", "argv.toml", "--dry-run"),
        failed_start=("study", "--config", "failing.toml"),
        measure=(
            "measure", "--endpoint", f"http://user:{PLANTED['endpoint']}@{host}", "--requests", "2",
            "--concurrency", "1", "--max-tokens", "30", "--out", "measured",
        ),
        watch=(
            "watch", "--endpoint", f"http://user:{PLANTED['endpoint']}@{host}", "--interval", "0.25s",
            "--window", "100s", "--duration", "2s", "--out", "watched",
        ),
        watch_prometheus=("watch", "--prometheus", f"http://user:{PLANTED['prometheus']}@{host}", "--since", "1h"),
    )  # fmt: skip
    failed = {name for name, run in runs.items() if run.returncode != 0}
    assert failed == {"failed_start", "watch_prometheus"}, {n: runs[n].stderr for n in failed}
    # each of them refused in one line, its secret masked, not left out (a study that measured
    # nothing exits 1 with its last trial's reason)
    assert "failed: server did not start" in runs["failed_start"].stdout
    assert "--api-key *** and ***" in runs["failed_start"].stdout
    assert "measured no configuration" in runs["failed_start"].stderr
    assert "--api-key *** and ***" in runs["failed_start"].stderr
    assert "http://user:***@" in runs["watch_prometheus"].stderr
    assert "--api-key *** " in runs["dry_run"].stdout and "HF_TOKEN=***" in runs["dry_run"].stdout
    assert "--api-key=***" in runs["dry_run_argv"].stdout
    assert "--api-key ***" in runs["rig"].stdout
    assert f"http://user:***@{host}" in runs["measure"].stdout + runs["watch"].stdout

    # The server's own logs are kept as it wrote them: readable by the user only, and not searched.
    server_logs = {*(tmp_path / "studies").glob("*/logs/*.log"), server.log_path}
    assert {stat.S_IMODE(p.stat().st_mode) for p in server_logs - {server.log_path}} == {0o600}
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p not in server_logs and p.suffix != ".toml"]
    assert {"study.db", "rig.json", "report.md", "measurement.json", "results.json"} <= {p.name for p in written}
    assert any(p.parent.name == "trials" for p in written)
    console = {name: run.stdout + run.stderr for name, run in runs.items()}
    for what, value in PLANTED.items():
        assert [p.relative_to(tmp_path) for p in written if value.encode() in p.read_bytes()] == [], what
        assert [name for name, text in console.items() if value in text] == [], what
    assert os.listdir(tmp_path / "studies" / "keyed" / "servers") == []  # no lease left (it holds the stop command)
