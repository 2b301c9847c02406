"""What a user does after the first study, through the command line on the emulator: each step
works, or fails before it costs anything, in one line that says what to do."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest

from specsweep.emulator.content import classify_content
from specsweep.report.figures import TrialPoint, history_figure_data
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.workload import load_workload

from .builders import emulator_study, picks_of, specsweep, write_study
from .conftest import emulator_processes, print_truth

PROBABILISTIC_K2 = '{"method":"dspark","num_speculative_tokens":2,"draft_sample_method":"probabilistic"}'


def one_error_line(result) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("specsweep: error: ")
    return result.stderr


def served_requests(url: str) -> float:
    """Requests the emulator has finished, from its own counter."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@pytest.fixture(scope="module")
def two_drafter_study(tmp_path_factory) -> Path:
    """A small grid study of dspark drafting greedily and probabilistically: its folder (rig.json inside)."""
    folder = tmp_path_factory.mktemp("journeys")
    data = emulator_study(
        "both", seed=2501, k=(1, 2), concurrency=(1,), requests=3, temperature=0.6,
        study={"sampler": "grid"}, search={"draft_sample_method": ["greedy", "probabilistic"]},
    )  # fmt: skip
    write_study(folder / "both.toml", data)
    result = specsweep("study", "--config", "both.toml", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "studies" / "both"


def test_rig_names_each_drafter_by_method_and_draft_sampling(two_drafter_study: Path) -> None:
    result = specsweep("rig", str(two_drafter_study))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("concurrency 1,")]
    assert [line.split(":")[0].strip() for line in lines] == [
        "concurrency 1, speculation off",
        "concurrency 1, dspark (greedy)",
        "concurrency 1, dspark (probabilistic)",
    ]


def test_measure_with_a_rig_of_several_drafters_asks_which_before_any_request(
    two_drafter_study: Path, start_emulator
) -> None:
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=200)
    rig = str(two_drafter_study / "rig.json")
    common = ("measure", "--endpoint", server.url, "--rig", rig, "--requests", "3", "--max-tokens", "60",
              "--temperature", "0.6")  # fmt: skip
    for named in ((), ("--drafter", "dspark")):
        error = one_error_line(specsweep(*common, *named))
        assert "'dspark (greedy)', 'dspark (probabilistic)'" in error
        assert "--drafter 'dspark (probabilistic)'" in error
    assert served_requests(server.url) == 0  # refused before any request
    wrong = one_error_line(specsweep(*common, "--drafter", "eagle3"))
    assert "no drafter 'eagle3'" in wrong and "'dspark (greedy)'" in wrong
    # the name the error gives is the name --drafter takes
    result = specsweep(*common, "--drafter", "dspark (probabilistic)")
    assert result.returncode == 0, result.stderr
    assert re.search(r"running k=2 probabilistic measured", result.stdout), result.stdout


def test_watch_takes_the_drafter_as_the_rig_names_it(two_drafter_study: Path, start_emulator) -> None:
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=200)
    rig = str(two_drafter_study / "rig.json")
    watch = ("watch", "--endpoint", server.url, "--rig", rig, "--interval", "0.2s", "--duration", "1s")
    error = one_error_line(specsweep(*watch))
    assert "--drafter 'dspark (probabilistic)'" in error
    result = specsweep(*watch, "--drafter", "dspark (probabilistic)")
    assert result.returncode == 0, result.stderr
    assert "dspark (probabilistic)" in result.stdout


def test_a_study_that_measured_only_speculation_off_says_what_to_run(tmp_path: Path) -> None:
    write_study(tmp_path / "s.toml", emulator_study("lonely", seed=2502, k=(1, 3)))
    result = specsweep("study", "--config", "s.toml", "--trials", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "turn speculation off" not in result.stdout and "+0.0%" not in result.stdout
    assert "no recommendation: study lonely has measured only speculation off" in result.stdout
    assert "specsweep study --resume --study-name lonely" in " ".join(result.stdout.split())  # wrapped at 80
    assert "specsweep report" not in result.stdout  # it has nothing to report yet
    for command in ("report", "recommend"):
        error = one_error_line(specsweep(command, "studies/lonely", cwd=tmp_path))
        assert "measured only speculation off" in error and "--resume" in error


def test_resume_of_a_study_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    write_study(tmp_path / "s.toml", emulator_study("here", seed=2503))
    (tmp_path / "studies" / "here").mkdir(parents=True)
    (tmp_path / "studies" / "here" / "study.db").write_bytes(b"")  # an empty database
    error = one_error_line(specsweep("study", "--config", "s.toml", "--study-name", "nosuch", "--resume", cwd=tmp_path))
    assert "there is no study 'nosuch'" in error and "drop --resume" in error
    assert not (tmp_path / "studies" / "nosuch").exists()
    error = one_error_line(specsweep("report", "studies/here", cwd=tmp_path))
    assert "holds no study" in error and "run specsweep study" in error


@pytest.fixture
def web_server(tmp_path: Path):
    """A plain web server (Python's http.server), not an LLM server, on a free loopback port."""
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    server = ServerProcess(argv, log_path=tmp_path / "web.log")
    server.start()
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/", timeout_s=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace_s=5)


@pytest.mark.parametrize("command", ["measure", "watch"])
def test_an_endpoint_without_its_scheme_says_how_to_write_it(command: str) -> None:
    result = specsweep(command, "--endpoint", "127.0.0.1:8000")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "write http://127.0.0.1:8000" in result.stderr


def test_a_web_server_that_is_not_an_llm_server_is_named_as_such(web_server: str) -> None:
    for extra in ((), ("--model", "any")):
        error = one_error_line(specsweep("measure", "--endpoint", web_server, "--requests", "2", *extra))
        assert "is not vLLM, SGLang or llama-server" in error and "pass --model" not in error
        assert "<html" not in error.lower()


def test_a_server_whose_readiness_path_is_not_found_fails_fast_and_names_the_key(tmp_path: Path) -> None:
    data = emulator_study("web", seed=2504, k=(1, 2))
    data["study"]["max_consecutive_failures"] = 1
    data["server"] = {
        "engine": "vllm",
        "start": [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}", "--directory", str(tmp_path)],
        "ready_timeout_s": 600,
        "stop_grace_s": 2,
    }
    write_study(tmp_path / "web.toml", data)
    started = time.monotonic()
    result = specsweep("study", "--config", "web.toml", cwd=tmp_path)
    assert time.monotonic() - started < 120  # not the 600 s ready timeout
    # the trial's row, its reason wrapped at the console's width
    failed = [row for row in result.stdout.split("\n\n") if "failed:" in row]
    failed = [" ".join(row.split()) for row in failed]
    assert len(failed) == 1 and "/health answered HTTP 404" in failed[0], result.stdout
    assert "set server.ready_path" in failed[0] and "raise the ready timeout" not in failed[0]
    error = one_error_line(result)  # nothing was measured: exit 1, one line with the trial's reason
    assert "study web measured no configuration" in error and "set server.ready_path" in error


def test_ctrl_c_during_a_boot_fails_the_trial_and_says_how_to_resume(tmp_path: Path) -> None:
    seed = 2505
    # a 300 s modelled boot at time scale 100: 3 s of wall clock to press Ctrl-C in
    write_study(tmp_path / "s.toml", emulator_study("boot", seed=seed, time_scale=100, startup_s=300))
    process = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "study", "--config", "s.toml", "--verbose"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = tmp_path / "studies" / "boot" / "logs" / "trial-0000.log"
    deadline = time.monotonic() + 60
    while not ((log.is_file() and "specsweep emulate" in log.read_text()) or emulator_processes(f"--seed {seed}")):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)  # the server is booting
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "stopped by the user" in err and "continue with --resume" in err, err
    assert emulator_processes(f"--seed {seed}") == []
    study = optuna.load_study(study_name="boot", storage=f"sqlite:///{tmp_path}/studies/boot/study.db")
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert study.trials[0].user_attrs["fail_reason"] == "interrupted by the user"
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)


@pytest.mark.parametrize("at", ["    0  ", "          next:"])
def test_ctrl_c_between_trials_leaves_no_trial_running(tmp_path: Path, at: str) -> None:
    """At a trial's line the search is deciding; at its next: line it is asking for the trial."""
    write_study(tmp_path / "s.toml", emulator_study("between", seed=2506, k=(1, 3)))
    process = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "study", "--config", "s.toml", "--verbose"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(at):
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "stopped by the user" in err and "continue with --resume" in err, err
    study = optuna.load_study(study_name="between", storage=f"sqlite:///{tmp_path}/studies/between/study.db")
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE


def test_measure_on_the_emulator_prints_modelled_rates_as_the_study_does(start_emulator, tmp_path: Path) -> None:
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=100)
    out = tmp_path / "m.json"
    result = specsweep(
        "measure", "--endpoint", server.url, "--workload", "technical", "--concurrency", "1", "--requests", "6",
        "--max-tokens", "200", "--temperature", "0.6", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())  # as read: lines wrap at the console's width
    assert "the emulator runs 100 times faster; undone" in said and "aggregate output, wall clock" not in said
    assert "ITL is not measured on an emulator 100 times faster" in said and "ITL p50" not in said
    truth = print_truth(
        "--speculative-config", PROBABILISTIC_K2, "--concurrency", "1", "--max-tokens", "200", "--temperature", "0.6"
    )["technical"]["levels"][0]["output_tokens_per_s"]
    printed = float(re.search(r"([\d.]+) tok/s aggregate output, modelled", result.stdout).group(1))
    assert printed == pytest.approx(truth, rel=0.15)  # the modelled hardware's rate, not 100 times it
    data = json.loads(out.read_text())
    assert data["clock"] == "modelled" and data["levels"][0]["output_tokens_per_s"] == pytest.approx(truth, rel=0.15)
    # the requests' own times are the modelled hardware's too: one stream, so tokens over time is the rate
    records = data["levels"][0]["records"]
    by_records = sum(r["completion_tokens"] for r in records) / sum(r["latency_s"] for r in records)
    assert by_records == pytest.approx(truth, rel=0.15)


def test_files_meant_for_sharing_are_readable_by_others(two_drafter_study: Path) -> None:
    result = specsweep("report", str(two_drafter_study))
    assert result.returncode == 0, result.stderr
    written = [two_drafter_study / "rig.json", *(two_drafter_study / "report").rglob("*.*")]
    assert {p.name for p in written} >= {"rig.json", "report.md", "report.html", "results.json"}
    umask = os.umask(0o022)
    os.umask(umask)
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def test_the_report_says_each_thing_once(two_drafter_study: Path) -> None:
    out = two_drafter_study.parent.parent / "once"
    result = specsweep("report", str(two_drafter_study), "--out", str(out))
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "speculation off: speculation off" not in text
    assert "Step time: one step model over" in text
    # a beta-geometric fit at its geometric limit is shown by its mean, not by alpha=4229515.9
    assert not re.search(r"alpha=\d{5,}", text) and "alpha and beta unbounded (its geometric limit)" in text, text
    figure = history_figure_data(
        [TrialPoint(number=0, state="COMPLETE", value=1.0, label="speculation off")], "tok/s at concurrency 1"
    )
    assert [p.title for p in figure.panels] != [figure.title] and figure.panels[0].title == ""


def test_options_mean_one_thing_across_commands(two_drafter_study: Path, start_emulator, tmp_path: Path) -> None:
    """--out DIR is where files go, --json prints JSON on stdout, durations read 30s/10m or seconds;
    the old spellings (measure --json FILE, watch --report, rig -o, --format) still work."""
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=200)
    measure = ("measure", "--endpoint", server.url, "--concurrency", "1", "--requests", "2", "--max-tokens", "40")
    written = specsweep(*measure, "--out", str(tmp_path / "m"), "--timeout", "10m")
    assert written.returncode == 0, written.stderr
    assert json.loads((tmp_path / "m" / "measurement.json").read_text())["levels"][0]["requests"] == 2
    printed = specsweep(*measure, "--json", "--timeout", "600")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["levels"][0]["requests"] == 2 and "single stream" in printed.stderr
    old = specsweep(*measure, "--json", str(tmp_path / "old.json"))
    assert old.returncode == 0 and json.loads((tmp_path / "old.json").read_text())["levels"][0]["requests"] == 2
    rig = str(two_drafter_study / "rig.json")
    watch = ("watch", "--endpoint", server.url, "--rig", rig, "--drafter", "probabilistic", "--interval", "0.2")
    for flag, folder in (("--out", "w-new"), ("--report", "w-old")):
        result = specsweep(*watch, "--duration", "1s", flag, str(tmp_path / folder), "--snippet-format", "json")
        assert result.returncode == 0, result.stderr
        assert (tmp_path / folder / "results.json").is_file()
    for args, path in ((("--out", str(tmp_path / "r")), tmp_path / "r" / "rig.json"),
                       (("-o", str(tmp_path / "old-rig.json")), tmp_path / "old-rig.json")):  # fmt: skip
        assert specsweep("rig", str(two_drafter_study), *args).returncode == 0 and path.is_file()
    for flag in ("--snippet-format", "--format"):
        result = specsweep("report", str(two_drafter_study), "--out", str(tmp_path / flag), flag, "sglang")
        assert result.returncode == 0 and "--speculative-algorithm" in (tmp_path / flag / "report.md").read_text()


def glossary_terms() -> set[str]:
    text = (Path(__file__).parent.parent / "docs" / "glossary.md").read_text()
    return {term.lower() for term in re.findall(r"\*\*([^*]+)\*\*", text)}


def test_the_console_speaks_the_glossarys_words(tmp_path: Path) -> None:
    baseline = {"method": "dspark", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    data = emulator_study(
        "words", seed=2507, k=(1, 3), requests=3, temperature=0.6,
        search={"draft_sample_method": ["greedy", "probabilistic"], "baseline": baseline},
    )  # fmt: skip
    write_study(tmp_path / "s.toml", data)
    result = specsweep("study", "--config", "s.toml", "--verbose", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    terms = glossary_terms()
    phases = re.findall(r"^\s+next: ([a-z -]+):", result.stdout, re.MULTILINE)
    assert phases and set(phases) <= terms, (phases, result.stdout)
    for word in ("cell", "step model", "rig", "baseline", "tied", "speculation off", "drafter"):
        assert word in terms
    assert "vs k=3 probabilistic (baseline)" in result.stdout  # --verbose's best measured lines
    assert "baseline: k=3 probabilistic" in result.stdout  # the picks table's title names its "vs baseline'
    report = specsweep("report", "studies/words", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "| vs k=3 probabilistic (baseline) |" in (tmp_path / "studies/words/report/report.md").read_text()


def test_dry_run_prints_the_plan_and_every_command_and_starts_nothing(tmp_path: Path) -> None:
    seed = 2508
    baseline = {"method": "dspark", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    data = emulator_study(
        "dry", seed=seed, k=(1, 3), concurrency=(1, 4), temperature=0.6,
        search={"draft_sample_method": ["greedy", "probabilistic"], "baseline": baseline},
    )  # fmt: skip
    write_study(tmp_path / "s.toml", data)
    result = specsweep("study", "--config", "s.toml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "studies").exists() and emulator_processes(f"--seed {seed}") == []
    prose = " ".join(result.stdout.split())  # piped: prose wrapped at 80 columns, commands whole
    assert "7 distinct configurations" in prose and "concurrency 1, 4" in prose
    # the emulator's command once, then each configuration's part of it (tests/test_dry_run_output.py)
    assert sum(" -m specsweep emulate " in line for line in result.stdout.splitlines()) == 1
    parts = [line.strip() for line in result.stdout.splitlines() if line.startswith("    --")]
    assert len(parts) == 7
    for k in (1, 2, 3):
        for sampling in ("greedy", "probabilistic"):
            fields = {"method": "dspark", "num_speculative_tokens": k}
            if sampling == "probabilistic":
                fields["draft_sample_method"] = "probabilistic"
            spec = json.dumps(fields, separators=(",", ":"))
            assert sum(f"--speculative-config '{spec}'" in c for c in parts) == 1, (spec, parts)
    assert sum("--speculative-config" not in c for c in parts) == 1  # speculation off
    assert "measured first: speculation off, k=3 dspark (probabilistic) (baseline)" in prose
    # a start command without {spec_args} would measure one server seven times: said before anything runs
    data["server"] = {"engine": "vllm", "start": [sys.executable, "-m", "http.server", "{port}"]}
    write_study(tmp_path / "same.toml", data)
    same = specsweep("study", "--config", "same.toml", "--dry-run", cwd=tmp_path)
    assert same.returncode == 0 and "every configuration runs the same command" in " ".join(same.stdout.split())


def test_measure_reports_tpot_and_itl_as_the_emulator_steps(start_emulator) -> None:
    # a slow time scale: at a fast one the client's scheduling jitter, scaled up, moves the gaps
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=5)
    result = specsweep(
        "measure", "--endpoint", server.url, "--workload", "technical", "--requests", "8", "--max-tokens", "150",
        "--temperature", "0.6", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TPOT p50" in result.stderr and "ITL p50" in result.stderr  # the text, beside the JSON on stdout
    truth = print_truth(
        "--speculative-config", PROBABILISTIC_K2, "--concurrency", "1,4", "--max-tokens", "150", "--temperature", "0.6"
    )["technical"]["levels"]
    for level, true in zip(json.loads(result.stdout)["levels"], truth, strict=True):
        # one streamed chunk per verification step: the gap between chunks is the step time
        assert level["itl"]["p50_s"] == pytest.approx(true["step_time_s"], rel=0.12), (level["itl"], true)
        # the truth's decode rate is every stream's together
        assert level["tpot"]["p50_s"] == pytest.approx(true["batch_size"] / true["decode_tokens_per_s"], rel=0.12)
        assert level["itl"]["p99_s"] >= level["itl"]["p50_s"]


@pytest.fixture(scope="module")
def latency_study(tmp_path_factory) -> Path:
    """A grid study of dspark drafting probabilistically, k = 1..3 and off, at 1 and 4 streams."""
    folder = tmp_path_factory.mktemp("latency")
    data = emulator_study(
        "itl", seed=2509, time_scale=5, k=(1, 3), workloads={"technical": 1.0}, concurrency=(1, 4), requests=4,
        max_tokens=150, temperature=0.6, study={"sampler": "grid"}, search={"draft_sample_method": "probabilistic"},
    )  # fmt: skip
    write_study(folder / "itl.toml", data)
    result = specsweep("study", "--config", "itl.toml", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


def rows_of(csv_path: Path) -> list[dict[str, str]]:
    with csv_path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def recommended_k(stdout: str) -> dict[str, str]:
    """The report's picks table: concurrency -> the pick's short label."""
    return {str(b): label for (_, b), label in picks_of(stdout).items()}


def short_label(configuration: str) -> str:
    """results.csv's "k=3 dspark (probabilistic)" as the picks table says it, "k=3 probabilistic"."""
    return re.sub(r" \S+ \((\w+)\)", r" \1", configuration)


def test_the_report_keeps_latency_per_configuration_and_level_in_csv_and_json(latency_study: Path) -> None:
    result = specsweep("report", "studies/itl", cwd=latency_study)
    assert result.returncode == 0, result.stderr
    folder = latency_study / "studies/itl/report"
    rows = rows_of(folder / "results.csv")
    # one row per trial, workload and level: 4 configurations x 2 levels
    assert [(r["trial"], r["workload"], r["concurrency"]) for r in rows] == [
        (str(t), "technical", str(b)) for t in range(4) for b in (1, 4)
    ]
    assert all(float(r["itl_p99_s"]) >= float(r["itl_p50_s"]) > 0 and float(r["tpot_p50_s"]) > 0 for r in rows)
    measured = json.loads((folder / "results.json").read_text())["measured"]
    assert all(level["itl_p99_s"] for m in measured for level in m["results"]["technical"].values())
    assert "## Latency: time per output token and inter-token latency" in (folder / "report.md").read_text()


def test_a_latency_target_keeps_the_recommendation_within_it(latency_study: Path) -> None:
    free = specsweep("report", "studies/itl", cwd=latency_study)
    assert free.returncode == 0, free.stderr
    rows = rows_of(latency_study / "studies/itl/report/results.csv")
    p99 = {(short_label(r["configuration"]), int(r["concurrency"])): float(r["itl_p99_s"]) for r in rows}
    chosen = recommended_k(free.stdout)
    # a target between speculation off's ITL p99 at 4 streams and the unconstrained pick's, which drafts
    # (a slow time scale, so the client's jitter does not swamp the steps: off's steps are the shortest)
    assert chosen["4"] != "speculation off" and p99[("speculation off", 4)] < p99[(chosen["4"], 4)], p99
    limit_ms = 500 * (p99[("speculation off", 4)] + p99[(chosen["4"], 4)])
    bound = specsweep(
        "report", "studies/itl", "--max-itl-p99", f"{limit_ms:.3f}", "--out", "bound", "--verbose", cwd=latency_study
    )
    assert bound.returncode == 0, bound.stderr
    picks = recommended_k(bound.stdout)
    said = " ".join(bound.stdout.split())
    assert picks["4"] != chosen["4"] and "Latency target: ITL p99 <= " in said
    assert "latency target: inter-token latency p99 at most" in said
    for level, pick in picks.items():
        assert p99[(pick, int(level))] <= limit_ms / 1000 or "the target is not met here" in said
    # the same target given to the study is kept with it, and its end and recommend respect it
    again = specsweep(
        "study", "--config", "itl.toml", "--resume", "--max-itl-p99", f"{limit_ms:.3f}", cwd=latency_study
    )
    assert again.returncode == 0, again.stderr
    assert recommended_k(again.stdout) == picks
    paste = specsweep("recommend", "studies/itl", cwd=latency_study)
    limited = specsweep("recommend", "studies/itl", "--max-itl-p99", "100000", cwd=latency_study)
    assert paste.returncode == limited.returncode == 0 and paste.stdout != limited.stdout


SHAREGPT = [
    {
        "id": "a1",
        "conversations": [{"from": "human", "value": "Write a long story."}, {"from": "gpt", "value": "Once"}],
    },
    {
        "id": "a2",
        "conversations": [{"from": "system", "value": "Be terse."}, {"from": "human", "value": "Explain TCP."}],
    },
    {"id": "a3", "conversations": [{"from": "gpt", "value": "a reply with nothing asked"}]},
]
CHAT = [
    {"messages": [{"role": "user", "content": "Write a Rust server."}, {"role": "assistant", "content": "fn main"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Explain B-trees."}]}], "metadata": {}},
]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("sharegpt.json", json.dumps(SHAREGPT), None),
        ("sharegpt.jsonl", "\n".join(json.dumps(r) for r in SHAREGPT), None),
        ("chat.jsonl", "\n".join(json.dumps(r) for r in CHAT), [
            [{"role": "user", "content": "Write a Rust server."}], [{"role": "user", "content": "Explain B-trees."}],
        ]),
        ("notes.txt", "Write an essay on rivers.\nMake it long.\n\n\nDescribe a market.\n", [
            "Write an essay on rivers.\nMake it long.", "Describe a market.",
        ]),
    ],
)  # fmt: skip
def test_prompts_in_the_formats_users_have_are_imported_or_read_directly(
    tmp_path: Path, name: str, text: str, expected: list | None
) -> None:
    (tmp_path / name).write_text(text)
    result = specsweep("workloads", "import", name, "--out", "imported", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stem = name.rsplit(".", 1)[0]
    records = [json.loads(line) for line in (tmp_path / "imported" / f"{stem}.jsonl").read_text().splitlines()]
    got = [r.get("messages", r.get("prompt")) for r in records]
    sharegpt_prompts = [
        [{"role": "user", "content": "Write a long story."}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Explain TCP."}],
    ]
    assert got == (expected or sharegpt_prompts)
    if stem == "sharegpt":
        assert "1 conversation(s) with no human turn to answer were skipped" in result.stdout
    # the imported file and the original read alike wherever --workload is taken
    for path in (name, f"imported/{stem}.jsonl"):
        checked = specsweep("workloads", path, cwd=tmp_path)
        assert checked.returncode == 0 and f"│ {len(got)} " in checked.stdout, checked.stdout


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("bad.json", '[{"conversations": [{"from": "human", "value": "x"}]}, {"conversations": 3}]', "record 2:"),
        ("bad.jsonl", '{"conversations": [{"from": "human", "value": "x"}]}\n\n{"conversations": [{"from": "robot", '
         '"value": "y"}]}', "line 3: turn 'from' 'robot'"),
        ("bad-chat.jsonl", '{"messages": [{"role": "user", "content": "x"}], "tools": []}\n{"messages": []}',
         "line 2: an OpenAI chat record needs 'messages'"),
        ("cut.json", '[{"conversations": [', "line 1: not valid JSON"),
    ],
)  # fmt: skip
def test_a_malformed_import_names_its_line_and_the_fix(tmp_path: Path, name: str, text: str, says: str) -> None:
    (tmp_path / name).write_text(text)
    error = one_error_line(specsweep("workloads", "import", name, cwd=tmp_path))
    assert f"workload {name} {says}" in error, error


def test_a_workload_too_small_for_a_level_is_warned(start_emulator, tmp_path: Path) -> None:
    server = start_emulator(speculative_config=PROBABILISTIC_K2, time_scale=200)
    (tmp_path / "two.txt").write_text("Write a long story.\n\nExplain TCP in depth.\n")
    result = specsweep("measure", "--endpoint", server.url, "--workload", "two.txt", "--concurrency", "1",
                       "--requests", "4", "--max-tokens", "30", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "workload two has 2 prompts, fewer than the 4 requests a level sends" in result.stdout
    write_study(tmp_path / "s.toml", emulator_study("small", workloads={"two.txt": 1.0}, requests=4))
    plan = specsweep("study", "--config", "s.toml", "--dry-run", cwd=tmp_path)
    assert plan.returncode == 0 and "workload two has 2 prompts" in plan.stdout


def test_the_report_shows_which_kind_of_output_drafts_badly(tmp_path: Path) -> None:
    """A workload of prose stories and technical code: the emulator drafts each class at its own
    acceptance, and the report's subcategory table shows each class's tokens per step."""
    mixed = [p for p in load_workload("prose").prompts if p.subcategory == "story"][:6]
    mixed += [p for p in load_workload("technical").prompts if p.subcategory == "code"][:6]
    assert {classify_content(p.text()) for p in mixed[:6]} == {"prose"}
    assert {classify_content(p.text()) for p in mixed[6:]} == {"technical"}
    (tmp_path / "mixed.jsonl").write_text(
        "\n".join(json.dumps({"id": p.id, "subcategory": p.subcategory, "prompt": p.prompt}) for p in mixed)
    )
    spec = {"method": "dspark", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    data = emulator_study(
        "kinds", seed=2510, k=(3, 3), workloads={"mixed.jsonl": 1.0}, requests=24, max_tokens=200, temperature=0.6,
        search={"draft_sample_method": "probabilistic", "no_speculation": False},
    )  # fmt: skip
    write_study(tmp_path / "s.toml", data)
    assert specsweep("study", "--config", "s.toml", cwd=tmp_path).returncode == 0
    result = specsweep("report", "studies/kinds", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "studies/kinds/report/report.md").read_text()
    assert "## mixed.jsonl: acceptance by subcategory" in text
    rows = dict(re.findall(r"^\| (story|code) \| ([\d.]+) \(\d+\) \|$", text, re.MULTILINE))
    truth = print_truth("--speculative-config", json.dumps(spec), "--concurrency", "1", "--max-tokens", "200",
                        "--temperature", "0.6")  # fmt: skip
    assert float(rows["story"]) == pytest.approx(truth["prose"]["expected_tokens_per_step"], rel=0.08)
    assert float(rows["code"]) == pytest.approx(truth["technical"]["expected_tokens_per_step"], rel=0.08)
    assert text.index("| code |") < text.index("| story |")  # the kind that drafts worst first
