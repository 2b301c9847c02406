"""Security: no placeholder value can run a command, API keys never reach a file or the output,
the emulator listens on loopback unless told otherwise, and study files are written atomically.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specsweep.config import PLACEHOLDERS, parse_study_config
from specsweep.errors import ConfigError
from specsweep.runtime.launcher import free_port
from specsweep.runtime.trial_server import placeholder_values, render_command

from .conftest import emulator_processes

ROOT = Path(__file__).parents[1]
PRINT_ARGV = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


def hostile(canary: Path) -> list[str]:
    return [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x\ntouch {canary}",
        f"' ; touch {canary}; '",
        f'" ; touch {canary}; "',
        f"\\'; touch {canary} #",
        f"a && touch {canary} || b",
        f"{{port}} | touch {canary}",
    ]


def values_with(value: str) -> dict[str, str | list[str]]:
    values = placeholder_values(host="127.0.0.1", port=8000, spec=None, spec_args=[], model=None, trial=1)
    out: dict[str, str | list[str]] = {name: value for name in PLACEHOLDERS if name != "spec_args"}
    out["spec_args"] = ["--speculative-config", value, value]
    return {**values, **out}


@pytest.mark.parametrize("index", range(9))
def test_no_placeholder_value_can_run_a_command(tmp_path: Path, index: int) -> None:
    canary = tmp_path / "pwned"
    value = hostile(canary)[index]
    values = values_with(value)
    plain = [name for name in PLACEHOLDERS if name != "spec_args"]
    # argv form: each placeholder in an element of its own and inside another argument
    argv_template = (*PRINT_ARGV, *(f"{{{name}}}" for name in plain), *(f"--{n}={{{n}}}" for n in plain), "{spec_args}")
    argv = render_command(argv_template, values)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    expected = [value] * len(plain) + [f"--{n}={value}" for n in plain] + ["--speculative-config", value, value]
    assert json.loads(out) == expected
    # shell-string form: the same, through /bin/sh -c
    python = " ".join(PRINT_ARGV[:2]) + " " + repr(PRINT_ARGV[2])
    shell_template = python + " " + " ".join(f"{{{n}}} --{n}={{{n}}}" for n in plain) + " {spec_args}"
    parse_study_config({"study": {"name": "s"}, "server": {"engine": "vllm", "start": shell_template}})
    out = subprocess.run(render_command(shell_template, values), capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [x for n in plain for x in (value, f"--{n}={value}")] + [
        "--speculative-config", value, value,
    ]  # fmt: skip
    assert not canary.exists()


@pytest.mark.parametrize(
    "start",
    [
        "vllm serve '{model}'",
        'vllm serve --speculative-config "{speculative_config}"',
        "vllm serve `echo {model}`",
        "vllm serve ${port}",
        ["sh", "-c", "vllm serve {model}"],
        ["/bin/bash", "-ec", "vllm serve --port {port}"],
    ],
)
def test_templates_where_quoting_cannot_hold_are_refused(start: str | list[str]) -> None:
    with pytest.raises(ConfigError, match=r"server\.start"):
        parse_study_config({"study": {"name": "s"}, "server": {"engine": "vllm", "start": start}})


def test_quotes_without_placeholders_and_bare_placeholders_are_fine() -> None:
    start = 'VLLM_LOGGING_LEVEL=\'INFO\' vllm serve "/models/my model" --port {port} {spec_args} 2>&1 | tee -a "x"'
    parse_study_config({"study": {"name": "s"}, "server": {"engine": "vllm", "start": start}})
    parse_study_config({"study": {"name": "s"}, "server": {"engine": "vllm", "start": ["sh", "-c", "vllm serve"]}})


def test_the_api_key_reaches_the_server_and_no_file_or_output(tmp_path: Path) -> None:
    key = "sk-specsweep-canary-" + os.urandom(8).hex()
    (tmp_path / "s.toml").write_text(
        """
[study]
name = "keyed"
[server]
engine = "emulator"
api_key_env = "VLLM_API_KEY"
stop_grace_s = 5
[server.emulator]
time_scale = 200
seed = 6600
extra_args = ["--startup-seconds", "0"]
[search]
num_speculative_tokens = [2, 2]
fixed = { method = "dspark" }
[measure]
concurrency = [1]
requests = 2
max_tokens = 30
"""
    )

    def study(env_key: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        if env_key:
            env["VLLM_API_KEY"] = env_key
        return subprocess.run(
            [sys.executable, "-m", "specsweep", "study", "--config", "s.toml"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip

    result = study(key)
    assert result.returncode == 0, result.stderr
    assert "picks for " in result.stdout  # the emulator (VLLM_API_KEY set) refuses requests without the key
    assert key not in result.stdout + result.stderr
    folder = tmp_path / "studies" / "keyed"
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in files) and any(p.suffix == ".log" for p in files)
    for path in files:
        assert key.encode() not in path.read_bytes(), path
    assert emulator_processes("--seed 6600") == []


def test_the_emulator_listens_on_loopback_by_default(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "emulate", "--port", str(port), "--startup-seconds", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        listening: list[str] = []
        while not listening and time.monotonic() < deadline:
            time.sleep(0.1)
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                for line in Path(table).read_text().splitlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        listening.append(local.rsplit(":", 1)[0])
        assert listening == ["0100007F"]  # 127.0.0.1, and nothing else
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_study_files_are_written_atomically_or_appended() -> None:
    """Records go through store.write_json_atomic; the only other writes append to logs and traces."""
    writers = re.compile(r"\.write_(text|bytes)\(|open\([^)]*[\"'][wx]b?\+?[\"']|json\.dump\(")
    offenders = []
    for path in (ROOT / "src" / "specsweep").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if writers.search(line) and path.name != "store.py" and "sys.stdout" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
