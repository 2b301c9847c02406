"""`specsweep study` end to end on the emulator, and the study loop's failure handling."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import httpx
import optuna
import pytest

from specsweep.config import SearchSpace, parse_study_config
from specsweep.emulator.profile import DEFAULT_PROFILE, load_profile
from specsweep.engines import vllm_graphs
from specsweep.engines.registry import engine_info
from specsweep.engines.vllm import parse_speculative_config
from specsweep.errors import ConfigError
from specsweep.runtime.identity import ServerIdentity, read_identity
from specsweep.runtime.trial_server import StartedServer, placeholder_values, render_command, template_argv
from specsweep.tuning.events import Note
from specsweep.tuning.records import is_repeat, measured_configs, record_config
from specsweep.tuning.space import build_space
from specsweep.tuning.stored import pick_best
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_settings import read_study_settings, with_server_facts, write_study_settings
from specsweep.tuning.study_store import settings_of, study_paths
from specsweep.tuning.trial import captured_widths_of
from specsweep.types import BootFacts, CapturedWidths, Configuration

from .builders import emulator_study, picks_of, specsweep, write_study
from .conftest import print_truth

BENCH_PROFILES = Path(__file__).resolve().parents[1] / "bench" / "profiles"


def true_rates(workload: str, concurrency: int, k_max: int) -> dict[tuple[int, str], float]:
    """The emulator's true rate of every (k, draft method) at the profile's reference temperature, k = 0 meaning off."""
    rates = {(0, "off"): print_truth("--concurrency", str(concurrency))[workload]["levels"][0]["output_tokens_per_s"]}
    for k in range(1, k_max + 1):
        for method in ("greedy", "probabilistic"):
            config = json.dumps({"num_speculative_tokens": k, "draft_sample_method": method})
            truth = print_truth("--speculative-config", config, "--concurrency", str(concurrency))
            rates[(k, method)] = truth[workload]["levels"][0]["output_tokens_per_s"]
    return rates


def true_best(workload: str, concurrency: int, k_max: int) -> tuple[int, str]:
    """The emulator's true best (k, draft method) at the profile's reference temperature, k = 0 meaning off."""
    rates = true_rates(workload, concurrency, k_max)
    return max(rates, key=rates.__getitem__)


def emulator_processes(marker: str, *, cwd: Path | None = None) -> list[str]:
    """Emulator processes whose command line holds ``marker`` (and that run in ``cwd``, if given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                here = Path(os.readlink(entry / "cwd")) if cwd is not None else None
            except OSError:
                continue
            if "emulate" in cmdline and marker in cmdline and (cwd is None or here == cwd):
                found.append(cmdline)
    return found


def test_default_study_recommends_the_true_best_draft_length(tmp_path: Path) -> None:
    result = specsweep("study", "--workload", "technical", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    # The README's first command, piped: at a glance (tests/test_study_console.py checks the shape
    # at 80 and 120 columns, on a terminal and piped, and --verbose's search lines).
    lines = out.splitlines()
    paste = [line for line in lines if line.startswith("--speculative-config ")]
    assert len(lines) <= 30 and len(paste) == 1 and "\x1b" not in out, out
    assert max(len(line) for line in lines if line not in paste) <= 100, out
    assert "on the built-in emulator" in out and out.count("modelled") == 1
    picks = picks_of(out)
    best = {}
    for level in (1, 4):
        # Both picks were measured (a paste runs only what was measured); shown as such in the table.
        best[level] = tuple(picks[("technical", level)].split(" ", 1))
        best[level] = (int(best[level][0].removeprefix("k=")), best[level][1])
        assert best[level] == true_best("technical", level, 5)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    shown = readme.split("## What a study prints", 1)[1].split("```", 2)[1].strip("\n").splitlines()
    assert len(shown) <= 30 and any(line.startswith("concurrency  pick") for line in shown)  # the README shows it
    assert best[1][0] < 5  # shorter than the report's k = 5
    snippet = re.search(r"--speculative-config '(.+)'", out)
    spec = parse_speculative_config(snippet.group(1))
    # one k per concurrency level: a per-batch-size table when they differ
    assert [spec.k_for_batch_size(level) for level in (1, 4)] == [best[1][0], best[4][0]]
    folder = tmp_path / "studies" / "emulator-technical"
    # The report and the snippet from a copy of the study folder under another name, with no
    # server running: its storage holds one study, which is the one opened.
    copy = tmp_path / "elsewhere" / "copied"
    shutil.copytree(folder, copy)
    report = specsweep("report", str(copy), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    for name in ("report.md", "report.html", "results.json", "figures/acceptance-technical.png",
                 "figures/throughput-technical.png", "figures/history.png"):  # fmt: skip
        assert (copy / "report" / name).stat().st_size > 0, name
    results = json.loads((copy / "report" / "results.json").read_text())
    assert [(r["concurrency"], r["choice"]["num_speculative_tokens"]) for r in results["recommendations"]] == [
        (1, best[1][0]), (4, best[4][0]),
    ]  # fmt: skip
    recommended = specsweep("recommend", str(copy), "--format", "json", cwd=tmp_path)
    assert recommended.returncode == 0, recommended.stderr
    assert parse_speculative_config(recommended.stdout) == spec
    # SGLang's DSPARK and llama.cpp's draft-dspark draft with the draft's top token: their pastes
    # are chosen from the study's greedy drafting and say so, never from the probabilistic picks
    # above (greedy ran at k = 5 only here: about off's rate at one stream, far below it at four)
    for fmt, flag in (("sglang", "--speculative-dspark-block-size"), ("llama.cpp", "--spec-draft-n-max")):
        pasted = specsweep("recommend", str(copy), "--format", fmt, cwd=tmp_path)
        assert pasted.returncode == 0, pasted.stderr
        assert "greedy drafting of it (measured at k = 5)" in " ".join(pasted.stdout.split()), pasted.stdout
        assert flag not in pasted.stdout, pasted.stdout
    assert (folder / "study.db").is_file()
    starts = int(re.search(r"\((\d+) server starts this run\)", out).group(1))
    assert starts <= 7  # the grid has 11 configurations
    assert len(list((folder / "trials").glob("trial-*.json"))) == starts
    assert emulator_processes("--time-scale 100.0", cwd=tmp_path) == []
    # Running the README's command again continues the stored study: no restart, same answer.
    again = specsweep("study", "--workload", "technical", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "continuing the stored study" in again.stdout and "(0 server starts this run)" in again.stdout
    assert picks_of(again.stdout)[("technical", 1)] == f"k={best[1][0]} {best[1][1]}"


def small_study(tmp_path: Path, **overrides) -> dict:
    return emulator_study("t", seed=4242, **overrides)


def test_boot_failures_fail_the_trial_and_the_study_goes_on(tmp_path: Path) -> None:
    data = small_study(tmp_path)
    data["server"]["emulator"]["extra_args"] += ["--fail-boot-above-k", "3"]
    config = parse_study_config(data)
    events = []
    runner = StudyRunner(config, study_paths(config, tmp_path), on_event=events.append)
    outcome = runner.run()
    assert any(isinstance(e, Note) and "temperature is 0" in e.text for e in events)
    failed = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1 and "OutOfMemoryError" in failed[0].user_attrs["fail_reason"], [
        (t.number, t.params, t.user_attrs.get("fail_reason")) for t in failed
    ]
    assert json.loads(failed[0].user_attrs["spec"])["num_speculative_tokens"] == 4
    complete = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    first = [t.user_attrs["key"] for t in complete if not is_repeat(t)]
    # off and the largest k that boots (3) once each (temperature 0: one draft method, no restart spent
    # on both); measured again only where the search asked to separate leaders
    assert len(first) == len(set(first)) and {"off", '{"method":"dspark","num_speculative_tokens":3}'} <= set(first)
    assert outcome.starts == len(complete) + len(failed)
    # what the study counts of its starts is what the started emulator said: its boot (0 s modelled,
    # --startup-seconds 0), its clock, the most sequences it batches (the default profile's)
    times = [t.user_attrs["times"] for t in complete if "reused_from" not in t.user_attrs]
    assert times and all(t["boot_s"] == 0.0 and t["modelled"] for t in times)
    assert failed[0].user_attrs["times"]["modelled"]  # a failed start is timed on the emulator's clock too
    assert outcome.study.user_attrs["max_num_seqs"] == load_profile(DEFAULT_PROFILE).max_num_seqs
    assert emulator_processes("--seed 4242") == []


def test_a_started_server_carries_what_it_says_of_its_boot_clock_and_batch(tmp_path: Path) -> None:
    """The emulator's /version gives its modelled boot, max_num_seqs and captured widths; any other
    server's boot is the wall clock until ready, its max_num_seqs its command's flag, and its
    captured widths are not known."""

    def emulator(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            block = {
                "profile": "p",
                "time_scale": 50.0,
                "startup_s": 240.0,
                "max_num_seqs": 4,
                "captured_widths": said_widths,
            }
            return httpx.Response(200, json={"version": "0.33.0", "emulator": block})
        return httpx.Response(200, json={"data": [{"id": "m"}]})

    def vllm(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"version": "0.33.0"} if request.url.path == "/version" else {"data": []})

    def identity(handler, engine: str) -> ServerIdentity:
        async def read() -> ServerIdentity:
            async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as http:
                return await read_identity(http, engine)

        return asyncio.run(read())

    def started(said: ServerIdentity, flagged: int | None) -> StartedServer:
        return StartedServer(
            url="http://x", argv=(), startup_s=4.9, boot=BootFacts(), log_path=tmp_path / "log", identity=said,
            max_num_seqs=said.max_num_seqs or flagged, captured_widths=said.captured_widths,
        )  # fmt: skip

    said_widths: object = [8, 1, 2, 4, 2]  # as a server may say them: read ascending, once each
    on_emulator = started(identity(emulator, "emulator"), None)
    assert (on_emulator.boot_s, on_emulator.clock.time_scale, on_emulator.max_num_seqs) == (240.0, 50.0, 4)
    assert on_emulator.modelled and on_emulator.captured_widths == (1, 2, 4, 8)
    # kept with the trial as the identity is, and read back the same
    assert ServerIdentity.from_stored(asdict(on_emulator.identity)) == on_emulator.identity
    real = started(identity(vllm, "vllm"), 8)
    assert (real.boot_s, real.clock.time_scale, real.max_num_seqs, real.modelled) == (4.9, 1.0, 8, False)
    assert real.captured_widths == ()  # vLLM says nothing of its graphs, and none is guessed
    # widths with anything but positive whole numbers in them are not taken (a part would pad wrongly)
    for wrong in ([1, 0, 4], [1, "2"], [1, True], 8, "1,2"):
        said_widths = wrong
        assert identity(emulator, "emulator").captured_widths == ()
    # a server stored by a version that did not keep these reads as one that said nothing
    assert ServerIdentity.from_stored({"engine": "vllm", "time_scale": 1.0}).boot_s is None
    assert ServerIdentity.from_stored({"engine": "emulator", "max_num_seqs": 4}).captured_widths == ()
    server = {"engine": "vllm", "start": ["vllm", "serve", "m", "--max-num-seqs", "8", "--port", "{port}"]}
    assert template_argv(parse_study_config(emulator_study("t", seed=1) | {"server": server}).server)[-3:] == [
        "8", "--port", "0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "widths"),
    [
        (str(BENCH_PROFILES / "l4-eagle3-graphs.toml"), (1, 2, 4, 8, 16, 24, 32, 48, 64, 96)),
        (None, ()),  # the default profile captures no graphs: steps are not padded
    ],
)
def test_the_first_start_gives_the_study_its_servers_captured_widths(
    tmp_path: Path, profile: str | None, widths: tuple[int, ...]
) -> None:
    """The widths the started emulator says it captured graphs for become the study's, read by
    the search's next decision (the runner's settings) and by the report (the stored settings)."""
    method = {"method": "eagle3", "model": "bench/eagle3-head"} if profile else {"method": "dspark"}
    config = parse_study_config(small_study(tmp_path, profile=profile, k=(1, 2), search={"fixed": method}))
    runner = StudyRunner(config, study_paths(config, tmp_path))
    assert not runner.settings.captured_widths  # no server said them yet
    runner.run(max_trials=1)
    assert runner.settings.captured_widths == CapturedWidths(every_k=widths)
    assert runner.study.user_attrs["captured_widths"] == list(widths)
    assert read_study_settings(runner.study).captured_widths == CapturedWidths(every_k=widths)
    assert runner.settings.max_num_seqs == load_profile(profile or DEFAULT_PROFILE).max_num_seqs
    # a run that continues the study has them before it starts anything
    assert with_server_facts(settings_of(config, runner.space), runner.study).captured_widths.every_k == widths


def test_a_vllm_server_that_captured_graphs_gives_the_study_its_widths_by_k_from_its_command(tmp_path: Path) -> None:
    """vLLM does not say its widths; once its log says it captured graphs, its command, version and
    spec config give them per draft length by vLLM's own rule (engines/vllm_graphs.py, checked
    against vLLM's code), stored and read back the same. A CPU build's log says nothing of graphs,
    and no widths are taken; nor from llama.cpp, whose rule is not known."""
    log = "INFO 12-05 [gpu_model_runner.py:4210] Graph capturing finished in 9 secs, took 0.42 GiB\n"
    boot = engine_info("vllm").parse_boot_facts(log)
    assert boot.graphs_captured and not engine_info("vllm").parse_boot_facts("INFO Starting vLLM").graphs_captured
    argv = ("vllm", "serve", "m", "--max-num-seqs", "8", "--port", "8000", "--speculative-config", "{}")
    spec = parse_speculative_config('{"method": "eagle3", "model": "h", "num_speculative_tokens": 2}')
    server = StartedServer(
        url="http://x", argv=argv, startup_s=60.0, boot=boot, log_path=tmp_path / "log",
        identity=ServerIdentity(engine="vllm", engine_version="0.33.0", model="m"), max_num_seqs=8,
    )  # fmt: skip
    widths = captured_widths_of(engine_info("vllm"), server, spec, "0.33.0", 3)
    bare = ["m", "--max-num-seqs", "8"]
    for k in range(4):
        one = None if k == 0 else replace(spec, num_speculative_tokens=k)
        assert widths.at(k) == vllm_graphs.captured_widths("0.33.0", bare, one), k
    assert widths.at(2)[:4] == (3, 6, 9, 12)
    assert CapturedWidths.from_stored(widths.to_stored()) == widths
    cpu = replace(server, boot=BootFacts())
    none = captured_widths_of(engine_info("vllm"), cpu, spec, "0.33.0", 3)
    assert not none and not none.unknown  # no graphs captured: steps unpadded, and known to be
    unknown = captured_widths_of(engine_info("llama.cpp"), server, spec, "0.33.0", 3)
    assert not unknown and unknown.unknown  # graphs captured at widths no rule says
    assert CapturedWidths.from_stored(unknown.to_stored()) == unknown
    assert CapturedWidths.from_stored([]) == CapturedWidths()  # stored before: unpadded, as then


def test_consecutive_failures_stop_the_study(tmp_path: Path) -> None:
    data = small_study(tmp_path, search={"no_speculation": False})
    data["server"]["emulator"]["extra_args"] += ["--fail-boot-above-k", "0"]
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    assert "2 trials in a row failed" in outcome.stop_reason and "OutOfMemoryError" in outcome.stop_reason


def test_interrupt_keeps_the_measured_trials_and_resume_finishes(tmp_path: Path) -> None:
    config_file = write_study(
        tmp_path / "s.toml",
        # the grid, so the study is still starting servers when Ctrl-C comes (the search may stop sooner)
        emulator_study("interrupted", seed=4343, time_scale=100, k=(1, 3), requests=3, max_tokens=300,
                       study={"sampler": "grid"}),
    )  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "study", "--config", str(config_file)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in process.stdout:  # wait until one trial is done and the next has started
        lines.append(line)
        if line.startswith("    1  "):  # trial 1's row
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "stopped by the user" in err and "--resume" in err and "Traceback" not in err
    assert emulator_processes("--seed 4343") == []
    storage = f"sqlite:///{tmp_path / 'studies' / 'interrupted' / 'study.db'}"
    study = optuna.load_study(study_name="interrupted", storage=storage)
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.COMPLETE in states and optuna.trial.TrialState.FAIL in states
    result = specsweep("study", "--config", str(config_file), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name="interrupted", storage=storage)
    keys = {t.user_attrs["key"] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    # the resumed run ends with a recommendation, having measured off and the largest k at least
    assert "picks for " in result.stdout and {"off", '{"method":"dspark","num_speculative_tokens":3}'} <= keys
    again = specsweep("study", "--config", str(config_file), cwd=tmp_path)
    assert again.returncode == 1 and "--resume" in again.stderr


def test_placeholders_cannot_inject_commands(tmp_path: Path) -> None:
    spec = parse_speculative_config(
        '{"method":"draft_model","model":"m\\"; touch /tmp/pwned; echo \\"","num_speculative_tokens":2}'
    )
    values = placeholder_values(
        host="127.0.0.1", port=8000, spec=spec, spec_args=["--speculative-config", spec.to_json()],
        model="$(touch /tmp/pwned) `id`", trial=1,
    )  # fmt: skip
    argv = render_command(("vllm", "serve", "{model}", "--port", "{port}", "{spec_args}"), values)
    assert argv == [
        "vllm",
        "serve",
        "$(touch /tmp/pwned) `id`",
        "--port",
        "8000",
        "--speculative-config",
        spec.to_json(),
    ]
    shell = render_command("printf '%s\\n' {model} {spec_args}", values)
    out = subprocess.run(shell, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["$(touch /tmp/pwned) `id`", "--speculative-config", spec.to_json()]
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize(
    ("table", "values", "message"),
    [
        ("study", {"name": "bad name!"}, "study.name"),
        ("study", {"sampler": "cmaes"}, "study.sampler"),
        ("study", {"trials": 0}, "study.trials"),
        ("study", {"colour": "red"}, "unknown key study.colour"),
        ("server", {"engine": "tgi"}, "server.engine"),
        ("server", {"engine": "vllm"}, "server.start is required"),
        ("server", {"engine": "vllm", "start": ["vllm", "serve", "--port", "{prot}"]}, "unknown placeholder {prot}"),
        ("server", {"engine": "vllm", "start": ["vllm", "--x={spec_args}"]}, "list element of its own"),
        ("server", {"engine": "vllm", "mode": "commands", "start": "docker start v"}, "server.stop is required"),
        ("search", {"num_speculative_tokens": [3, 1]}, "search.num_speculative_tokens"),
        ("search", {"draft_sample_method": ["gumbel"]}, "draft_sample_method"),
        ("search", {"fixed": {"num_speculative_tokens": 3}}, "may not name"),
        ("search", {"baseline": {"method": "mtp"}}, "search.baseline"),
        ("measure", {"concurrency": [1, 1]}, "twice"),
        ("measure", {"temperature": 3.0}, "temperature"),
        ("objective", {"concurrency": 8}, "objective.concurrency"),
        ("workloads", {"prose": -1}, "workloads.prose"),
    ],
)
def test_bad_study_files_name_the_key(tmp_path: Path, table: str, values: dict, message: str) -> None:
    data = small_study(tmp_path)
    if table == "server":
        data["server"] = {k: v for k, v in data["server"].items() if k != "emulator"}
    data.setdefault(table, {}).update(values)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_study_config(data, source="s.toml")


def test_config_reference_documents_every_key() -> None:
    from specsweep.config import KNOWN_KEYS

    text = (Path(__file__).parents[1] / "docs" / "study-config.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", text, flags=re.M))
    documented = {row for row in rows if row.rsplit(".", 1)[0] in KNOWN_KEYS}
    expected = {f"{table}.{key}" for table, keys in KNOWN_KEYS.items() for key in keys} | {"workloads.NAME"}
    assert documented == expected
    # the llama.cpp field -> flag table names every field of llama.cpp's own
    from specsweep.engines.llamacpp import FIELDS

    assert set(FIELDS) <= rows - documented


def test_example_studies_parse() -> None:
    from specsweep.config import load_study_config

    examples = sorted((Path(__file__).parents[1] / "studies").glob("*.toml"))
    assert len(examples) >= 4
    for path in examples:
        load_study_config(path)


def test_commands_mode_and_attach_mode_drive_a_real_server(tmp_path: Path) -> None:
    """Start/stop commands (as for docker or ssh) and attach mode, with the emulator as the server."""
    from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

    port = free_port()
    emulator = (
        f"{sys.executable} -m specsweep emulate --host 127.0.0.1 --port {{port}} --startup-seconds 0 --time-scale 200"
    )
    marker = f"[-]-port {port} "  # a regex that does not match the shell running it
    data = small_study(
        tmp_path,
        search={"num_speculative_tokens": [2, 2], "no_speculation": True},
    )
    data["server"] = {
        "engine": "vllm",
        "mode": "commands",
        "port": port,
        "ready_timeout_s": 30,
        "stop_grace_s": 5,
        "start": emulator + " {spec_args} --seed 4444",
        "stop": f"pkill -TERM -f -- '{marker}'",
        "wait_free": f"! pgrep -f -- '{marker}'",
    }
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    complete = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert {t.user_attrs["key"] for t in complete} == {"off", '{"method":"dspark","num_speculative_tokens":2}'}
    assert emulator_processes("--seed 4444") == []

    # attach mode: the "user" restarts the server when asked
    attach_port = free_port()
    data["server"] = {"engine": "vllm", "mode": "attach", "port": attach_port, "ready_timeout_s": 30}
    data["study"]["name"] = "attached"
    config = parse_study_config(data)
    servers: list[ServerProcess] = []
    asked: list[str] = []

    def restart_by_hand(message: str) -> None:
        asked.append(message)
        for server in servers:
            server.stop(grace_s=5)
        spec = re.search(r"--speculative-config (\S+)", message)
        argv = emulator_argv(
            port=attach_port, speculative_config=spec.group(1).strip("'") if spec else None, time_scale=200,
            seed=4545, extra=["--startup-seconds", "0"],
        )  # fmt: skip
        servers.append(ServerProcess(argv, log_path=tmp_path / f"attach-{len(servers)}.log"))
        servers[-1].start()

    try:
        outcome = StudyRunner(config, study_paths(config, tmp_path), ask_user=restart_by_hand).run()
    finally:
        for server in servers:
            server.stop(grace_s=5)
    complete = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # one restart asked of the user per measured trial (repeats to separate the two included)
    assert len(asked) == len(complete) >= 2 and "speculation off" in asked[0]
    assert any("num_speculative_tokens" in message for message in asked)
    assert {t.user_attrs["key"] for t in complete if not is_repeat(t)} == {
        "off",
        '{"method":"dspark","num_speculative_tokens":2}',
    }


def test_slo_constraints_mark_configurations_infeasible(tmp_path: Path) -> None:
    from specsweep.tuning.stored import best_overall, measured_configs

    data = small_study(tmp_path, search={"num_speculative_tokens": [1, 1]}, objective={"max_ttft_p95_s": 1e-6})
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    configs = measured_configs(outcome.study)
    assert len(configs) == 2 and not any(c.feasible for c in configs)
    assert best_overall(configs) is None
    assert all(t.user_attrs["constraints"][1] > 0 for t in outcome.study.trials)


# A study as earlier versions stored it: the study's and its trials' attributes written out as
# strings, not through the code that writes them now, so a change to that code cannot hide here.
STORED_SPEC = '{"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'


def stored_trial(number: int, key: str, spec: str | None, rate: float) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        params={"num_speculative_tokens": 0 if spec is None else 3, "draft_sample_method": "probabilistic"},
        distributions={
            "num_speculative_tokens": optuna.distributions.CategoricalDistribution([0, 3]),
            "draft_sample_method": optuna.distributions.CategoricalDistribution(["greedy", "probabilistic"]),
        },
        value=rate,
        user_attrs={
            "worker": "host-1", "key": key, "spec": spec, "constraints": [0.0],
            "results": {"technical": {"1": {"output_tokens_per_s": rate, "errors": 0, "requests": 8}}},
        },
    )  # fmt: skip
    trial.number = number
    return trial


def test_a_stored_study_reads_and_writes_its_configurations_as_it_always_did(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    for name, value in {"workloads": {"technical": 1.0}, "concurrency": [1], "objective_concurrency": 1,
                        "num_speculative_tokens_range": [1, 3], "baseline_key": STORED_SPEC}.items():  # fmt: skip
        study.set_user_attr(name, value)
    study.add_trial(stored_trial(0, "off", None, 20.0))
    study.add_trial(stored_trial(1, STORED_SPEC, STORED_SPEC, 30.0))

    study = optuna.load_study(study_name="old", storage=storage)
    configs = measured_configs(study)
    assert [c.key for c in configs] == ["off", STORED_SPEC]
    assert configs[0].spec is None and configs[1].configuration == Configuration.from_key(STORED_SPEC)
    assert configs[1].spec is not None and configs[1].spec.to_json() == STORED_SPEC
    settings = read_study_settings(study, configs)
    assert settings.baseline is not None and settings.baseline.key == STORED_SPEC
    pick = pick_best(configs, workload="technical", concurrency=1, baseline=settings.baseline)
    assert pick is not None and (pick.rate, pick.off_rate, pick.baseline_rate) == (30.0, 20.0, 30.0)

    # written again by today's code: the same attributes, character for character
    again = optuna.create_study(study_name="new", storage=storage, direction="maximize")
    write_study_settings(again, settings)
    assert again.user_attrs["baseline_key"] == STORED_SPEC
    space = build_space(SearchSpace(num_speculative_tokens=(3, 3), fixed={"method": "dspark"}, no_speculation=True),
                        temperature=1.0, engine_has_draft_sample_method=True)  # fmt: skip
    for params, key in ((space.params_for(None), "off"), (space.params_for(json.loads(STORED_SPEC)), STORED_SPEC)):
        trial = again.ask()
        configuration = space.configuration(params)
        assert configuration.key == key
        record_config(trial, configuration)
        stored = again.trials[trial.number].user_attrs
        assert (stored["key"], stored["spec"]) == (key, None if key == "off" else key)
    # a speculation-off baseline is stored as "off" and read back as speculation off
    write_study_settings(again, replace(settings, baseline=Configuration(spec=None)))
    assert again.user_attrs["baseline_key"] == "off"
    assert read_study_settings(again, configs).baseline == Configuration(spec=None)
