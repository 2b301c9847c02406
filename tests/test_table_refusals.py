"""A per-batch-size table on the server that runs it: what its flags and version make of it.

SGLang 0.5.23 turns adaptive mode off under some flags (one k runs) and refuses to start with it
under others; vLLM drops a table under data parallelism and, in 0.33, for the methods that run on
its V1 model runner, and in 0.32 runs those methods' tables with PIECEWISE CUDA graphs. The paste
runs one k and names what gives way, or says what the table changes; a study that would start
with a table the server refuses stops before any start; a server that says it runs no adaptive
mode fails the trial instead of measuring one k under a table's label.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import httpx
import optuna
import pytest

from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.snippet_plan import SnippetPlan, plan_snippet
from specsweep.config import parse_study_config
from specsweep.engines import sglang, vllm_tables
from specsweep.engines.registry import engine_info
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError, LaunchError
from specsweep.report.study_report import snippet_for
from specsweep.runtime import trial_server
from specsweep.runtime.identity import ServerIdentity, read_identity
from specsweep.runtime.trial_server import TrialServer
from specsweep.tuning.plan import plan_study
from specsweep.tuning.study_settings import read_study_settings
from specsweep.types import StudySettings

from .builders import recommendation_of

TABLE = [[1, 2, 3], [3, 64, 1]]


def _spec(method: str, **extra):
    raw = {"method": method, "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": TABLE}
    return validate_speculative_config(raw | ({"model": "m"} if method not in ("ngram", "suffix") else {}) | extra)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], None),
        (["--tp-size", "2", "--mem-fraction-static", "0.8"], None),
        (["--enable-two-batch-overlap"], "adaptive mode off under two-batch overlap (--enable-two-batch-overlap)"),
        (["--enable-pdmux"], "adaptive mode off under pdmux (--enable-pdmux)"),
        (["--enable-multi-layer-eagle"], "adaptive mode off under multi-layer EAGLE"),
        (["--attn-dp-size", "2"], "adaptive mode off under attention data parallelism (--attn-dp-size 2)"),
        (["--attention-data-parallel-size=4"], "attention data parallelism (--attn-dp-size 4)"),
        (["--dp-size", "2", "--enable-dp-attention"], "attention data parallelism (--attn-dp-size 2)"),
        (["--dp-size", "2"], None),  # replicas, each with its own scheduler: adaptive runs in each
        (["--attn-dp-size", "1"], None),
        (["--enable-lora"], "SGLang 0.5.23 refuses to start with --speculative-adaptive and LoRA (--enable-lora)"),
        (["--lora-paths", "a=/x"], "and LoRA (--lora-paths)"),
        (["--enable-hisparse", "--disable-radix-cache"], "and HiSparse (--enable-hisparse)"),
    ],
)
def test_sglang_adaptive_mode_from_the_server_flags(flags: list[str], said: str | None) -> None:
    """adaptive_unsupported_reason (adaptive_spec_params.py 56-101) and the LoRA and HiSparse
    hooks, read from a command line; the contract test hands the same flags to SGLang's parser."""
    got = engine_info("sglang").table_refusal_on(flags, "0.5.23")(_spec("eagle3"))
    assert got is None if said is None else said in got


def test_sglang_algorithms_without_adaptive_mode_are_refused_whatever_the_flags() -> None:
    assert sglang.table_refusal(_spec("dspark"), [], None) == (
        "SGLang's adaptive config drives EAGLE and EAGLE3 only, not DSPARK"
    )


@pytest.mark.parametrize(
    ("method", "version", "flags", "said"),
    [
        ("suffix", "0.33.0", [], "vLLM 0.33 runs suffix on its V1 model runner, which drops a per-batch-size table"),
        ("custom_class", "0.33.1", [], "vLLM 0.33 runs custom_class on its V1 model runner"),
        ("suffix", None, [], "vLLM 0.33 runs suffix"),  # an unknown version reads as the newest one read
        ("suffix", "0.32.0", [], None),  # 0.32 keeps it (with PIECEWISE graphs: the paste says so)
        ("eagle", "0.33.0", [], None),
        ("ngram", "0.33.0", ["--data-parallel-size", "2"], "under data parallelism above 1 (--data-parallel-size 2)"),
        ("eagle3", "0.32.0", ["-dp=4"], "(--data-parallel-size 4)"),
        ("eagle3", "0.32.0", ["-dp", "1"], None),
        ("eagle3", "0.32.0", ["--config", "serve.yaml", "-dp", "2"], None),  # a config file: not read here
    ],
)
def test_vllm_drops_a_table_by_version_method_and_data_parallelism(method, version, flags, said) -> None:
    got = engine_info("vllm").table_refusal_on(flags, version)(_spec(method))
    assert got is None if said is None else said in got


def test_vllm_032_says_a_v1_table_makes_full_graphs_piecewise() -> None:
    """0.32 runs suffix and custom_class on V1, where a table turns full graphs into PIECEWISE
    (_maybe_override_dynamic_sd_cudagraph_mode, config/vllm.py 1039-1056): one comment line."""
    suffix = _spec("suffix")
    (line,) = vllm_tables.paste_notes(suffix, ["--max-num-seqs", "64"], "0.32.0")
    assert line.startswith("vLLM 0.32 runs suffix on its V1 model runner, where this table turns FULL_AND_PIECEWISE")
    assert "PIECEWISE ones" in line
    assert vllm_tables.paste_notes(suffix, ["--enforce-eager"], "0.32.0") == ()  # no graphs at all
    assert vllm_tables.paste_notes(suffix, ["-O1"], "0.32.0") == ()  # piecewise already
    assert vllm_tables.paste_notes(suffix, [], "0.33.0") == ()  # 0.33 drops the table instead
    assert vllm_tables.paste_notes(_spec("eagle"), [], "0.32.0") == ()  # V2 on a GPU: full graphs stay
    assert vllm_tables.paste_notes(suffix, ["-dp", "2"], "0.32.0") == ()  # dropped: nothing to say of graphs


@pytest.mark.parametrize(
    ("engine", "method", "flags", "version", "gives_way"),
    [
        (
            "sglang",
            "eagle3",
            ["--enable-two-batch-overlap"],
            "0.5.23",
            "SGLang turns adaptive mode off under two-batch",
        ),
        ("sglang", "eagle3", ["--enable-lora"], "0.5.23", "refuses to start with --speculative-adaptive and LoRA"),
        ("vllm", "eagle3", ["--data-parallel-size", "2"], "0.32.0", "vLLM drops a per-batch-size table under data"),
        ("vllm", "suffix", [], "0.33.0", "vLLM 0.33 runs suffix on its V1 model runner"),
    ],
)
def test_a_table_the_server_would_not_run_becomes_one_k_naming_what_gives_way(
    engine: str, method: str, flags: list[str], version: str, gives_way: str
) -> None:
    """k=3 pays at one stream, k=1 at eight; the same recommendations on a server that runs the
    table keep it, and on one that would not the paste runs one k and says which level gives way."""
    drafter = Drafter(method=method, draft_sample_method="greedy")

    def at(k: int) -> Candidate:
        return Candidate(drafter=drafter, num_speculative_tokens=k)

    recs = [
        recommendation_of(1, {OFF: 20.0, at(1): 30.0, at(3): 36.0}),
        recommendation_of(8, {OFF: 100.0, at(1): 120.0, at(3): 110.0}),
    ]
    templates = {drafter: _spec(method)}
    info = engine_info(engine)
    kept = plan_snippet("w", recs, templates, max_num_seqs=64, table_refusal=info.table_refusal_on([], version))
    if method != "suffix":
        assert kept.table and kept.given_up == ()
    plan = plan_snippet("w", recs, templates, max_num_seqs=64, table_refusal=info.table_refusal_on(flags, version))
    assert plan.table == () and plan.spec is not None and plan.spec.num_speculative_tokens_per_batch_size is None
    (line,) = plan.given_up
    assert gives_way in line and "so the paste runs" in line and "% slower" in line


def _sglang_study(tmp_path: Path, start: str) -> object:
    data = {
        "study": {"name": "s"},
        "workloads": {"prose": 1.0},
        "server": {"engine": "sglang", "mode": "process", "start": start, "port": 0},
        "search": {
            "num_speculative_tokens": [1, 3],
            "fixed": {"method": "eagle", "model": "draft", "num_speculative_tokens_per_batch_size": TABLE},
        },
        "measure": {"concurrency": [1], "requests": 2, "temperature": 0.0},
    }
    return parse_study_config(data, source="s.toml")


def test_a_study_that_would_start_sglang_adaptive_beside_lora_is_refused_before_any_start(tmp_path: Path) -> None:
    start = "python -m sglang.launch_server --model-path m --port {port} --enable-lora --lora-paths a=/x {spec_args}"
    with pytest.raises(ConfigError) as refused:
        plan_study(_sglang_study(tmp_path, start))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("s.toml: search.fixed sets num_speculative_tokens_per_batch_size, but SGLang 0.5.23")
    assert "refuses to start with --speculative-adaptive and LoRA (--enable-lora)" in message


def _identity(info: dict) -> ServerIdentity:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(200, json=info)
        return (
            httpx.Response(200, json={"data": [{"id": "m"}]})
            if request.url.path == "/v1/models"
            else httpx.Response(404)
        )

    async def read() -> ServerIdentity:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as http:
            return await read_identity(http, None)

    return asyncio.run(read())


def test_sglang_says_in_server_info_whether_adaptive_mode_runs() -> None:
    """/server_info carries the resolved arguments and the launch command (0.5.23's
    build_server_info): adaptive on, off, or asked for and turned off."""
    base = {"version": "0.5.23", "speculative_algorithm": "EAGLE3"}
    on = _identity(base | {"speculative_adaptive": True})
    assert (on.engine, on.engine_version, on.adaptive) == ("sglang", "0.5.23", "on")
    asked = "sglang serve --speculative-adaptive --speculative-adaptive-config /tmp/a.json --enable-pdmux"
    turned = _identity(base | {"speculative_adaptive": False, "launch_command": asked})
    assert turned.adaptive == "turned off"
    assert "started with --speculative-adaptive and turned it off" in sglang.adaptive_line("turned off")
    assert _identity(base | {"speculative_adaptive": False, "launch_command": "sglang serve"}).adaptive == "off"
    assert (
        _identity({"version": "0.5.23", "speculative_algorithm": None, "speculative_adaptive": False}).adaptive is None
    )
    assert ServerIdentity.from_stored({"engine": "sglang", "adaptive": "turned off"}).adaptive == "turned off"
    assert ServerIdentity.from_stored({"engine": "sglang", "adaptive": "maybe"}).adaptive is None


def _sglang_said(server: dict, adaptive: str, monkeypatch):
    """An EAGLE study on an SGLang server whose /server_info says its adaptive mode is ``adaptive``
    once it is ready (at once)."""
    said = ServerIdentity(engine="sglang", engine_version="0.5.23", model="m", adaptive=adaptive)
    monkeypatch.setattr(trial_server, "read_server_identity", lambda url, engine: said)
    monkeypatch.setattr(TrialServer, "_wait_ready", lambda self, url: None)
    return parse_study_config(
        {"study": {"name": "s"}, "workloads": {"prose": 1.0}, "server": {"engine": "sglang", **server},
         "search": {"num_speculative_tokens": [1, 3], "fixed": {"method": "eagle", "model": "d"}}},
        source="s.toml",
    )  # fmt: skip


def test_a_trial_whose_server_turned_adaptive_off_fails_instead_of_measuring_one_k(tmp_path, monkeypatch) -> None:
    """An attached SGLang server restarted with the table's flags but without adaptive mode (its
    /server_info says so) runs one k: the trial fails in one line rather than store it as the table."""
    config = _sglang_said({"mode": "attach", "port": 30000}, "turned off", monkeypatch)
    asked: list[str] = []
    server = TrialServer(config.server, engine_info("sglang"), log_path=tmp_path / "log", ask_user=asked.append)
    with pytest.raises(LaunchError, match="does not run the per-batch-size table: SGLang was started with"):
        server.start(_spec("eagle"), trial=0)
    # the user restarts the server: the prompt says what the table file the flags name holds
    assert "with the table file /tmp/sglang-adaptive.json on the server holding:" in asked[0]
    assert '"3": {"candidate_steps": [1]}' in asked[0]
    server.start(validate_speculative_config({"method": "eagle", "model": "d", "num_speculative_tokens": 3}), trial=1)


def test_a_started_sglang_server_reads_the_tables_adaptive_config_written_beside_its_log(tmp_path, monkeypatch) -> None:
    """A process-mode start with a table writes SGLang's adaptive config before the server starts,
    beside the trial's log, and names that file in the flags: the server (here a script that copies
    the file its flags name) reads the config the paste would write, pinning each range's k."""
    seen = tmp_path / "seen.json"
    copy = "import sys, shutil; a = sys.argv; shutil.copy(a[a.index('--speculative-adaptive-config') + 1], a[1])"
    python = sys.executable
    config = _sglang_said(
        {"mode": "process", "start": [python, "-c", copy, str(seen), "{spec_args}"]}, "on", monkeypatch
    )
    server = TrialServer(config.server, engine_info("sglang"), log_path=tmp_path / "trial-0003.log")
    try:
        started = server.start(_spec("eagle"), trial=3)
        for _ in range(200):  # the script runs in its own process: up to 10 s on a loaded machine
            if seen.exists():
                break
            time.sleep(0.05)
    finally:
        server.stop()
    written = tmp_path / "trial-0003-table.json"
    assert str(written) in started.argv
    assert json.loads(seen.read_text()) == json.loads(written.read_text()) == {
        "1": {"candidate_steps": [3]}, "3": {"candidate_steps": [1]},
    }  # fmt: skip
    # no table: no file, no adaptive flags
    server.start(validate_speculative_config({"method": "eagle", "model": "d", "num_speculative_tokens": 3}), trial=4)
    server.stop()
    assert not (tmp_path / "trial-0004-table.json").exists()


def test_the_study_keeps_the_flags_its_server_ran_or_the_launch_command_an_attached_one_gave() -> None:
    """The paste is planned with the latest started server's flags (spec flags, place and secrets
    aside); in attach mode, where no command is kept, with SGLang's own launch command."""
    study = optuna.create_study()
    for name, value in (("engine", "sglang"), ("concurrency", [1]), ("workloads", {"w": 1.0})):
        study.set_user_attr(name, value)
    assert read_study_settings(study, []).server_args is None  # no server started yet
    started = ["python", "-m", "sglang.launch_server", "--port", "30001", "--enable-pdmux",
               "--speculative-algorithm", "EAGLE", "--api-key", "sk-secret"]  # fmt: skip
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"argv": started}))
    assert read_study_settings(study, []).server_args == (
        "python", "-m", "sglang.launch_server", "--enable-pdmux", "--api-key", "***",
    )  # fmt: skip
    info = {"version": "0.5.23", "speculative_algorithm": "EAGLE3", "speculative_adaptive": False,
            "launch_command": "python -m sglang.launch_server --attn-dp-size 2 --api-key sk-secret "
                              "--speculative-adaptive"}  # fmt: skip
    attached = _identity(info)
    assert attached.launch_args is not None and "sk-secret" not in attached.launch_args
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"argv": [], "server": asdict(attached)}))
    args = read_study_settings(study, []).server_args
    assert args is not None and "--attn-dp-size" in args and "sk-secret" not in args
    assert "attention data parallelism" in (
        engine_info("sglang").table_refusal_on(args, "0.5.23")(_spec("eagle")) or ""
    )


class _Analysis:
    """The one thing snippet_for asks of an analysis: the plan of a workload."""

    def __init__(self, plan: SnippetPlan) -> None:
        self.plan = plan

    def snippet(self, workload: str) -> SnippetPlan:
        return self.plan


def test_a_vllm_032_paste_carries_the_graph_mode_line_for_the_measured_server() -> None:
    suffix = _spec("suffix")
    plan = SnippetPlan(
        workload="w", spec=suffix, choice_by_concurrency={}, table=suffix.num_speculative_tokens_per_batch_size,
        max_batch=64, max_batch_known=True, given_up=(), untested=(),
    )  # fmt: skip
    settings = StudySettings(
        workload_weights={"w": 1.0}, concurrency_levels=(1, 8), objective_concurrency=1, k_range=(1, 3),
        baseline=None, engine="vllm", engine_version="0.32.0", server_args=("vllm", "serve", "m"),
    )  # fmt: skip
    text = snippet_for(_Analysis(plan), "w", "vllm", settings=settings)  # type: ignore[arg-type]
    comment, flags = text.splitlines()
    assert comment.startswith("# vLLM 0.32 runs suffix on its V1 model runner, where this table turns")
    assert flags.startswith("--speculative-config ")
    assert snippet_for(_Analysis(plan), "w", "json", settings=settings).startswith("{")  # JSON has no comments
    on_033 = replace(settings, engine_version="0.33.0")
    assert not snippet_for(_Analysis(plan), "w", "vllm", settings=on_033).startswith("#")
