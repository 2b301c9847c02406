"""A paste for another engine than the one a study measured is chosen from what that engine runs.

SGLang drafts with the draft's top token, as llama.cpp's dspark does: from a vLLM study that
measured dspark both ways, the SGLang and llama.cpp pastes rest on its greedy (top-token)
drafting, and say so; from one that measured probabilistic drafting only, they keep its k and say, in the
paste's note line, that what the engine runs was never measured and what to measure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specsweep.engines.registry import engine_info
from specsweep.engines.vllm import validate_speculative_config
from specsweep.tuning.stored import analyze_stored_study, load_stored_study

from .builders import emulator_study, specsweep, write_study


def _study(folder: Path, name: str, samplings: list[str], *, off: bool = True) -> Path:
    folder.mkdir()
    data = emulator_study(
        name, k=(1, 3), requests=3, max_tokens=40, temperature=0.8, study={"sampler": "grid"},
        search={"draft_sample_method": samplings, "no_speculation": off},
    )  # fmt: skip
    write_study(folder / "s.toml", data)
    done = specsweep("study", "--config", "s.toml", cwd=folder, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder / "studies" / name


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _study(tmp_path_factory.mktemp("x") / "both", "both", ["greedy", "probabilistic"])


def test_which_engines_run_a_drafting_as_measured() -> None:
    def spec(method: str, sampling: str):
        return validate_speculative_config(
            {"method": method, "model": "d", "num_speculative_tokens": 2, "draft_sample_method": sampling}
        )

    assert engine_info("vllm").runs_as_measured(spec("dspark", "probabilistic"))
    assert not engine_info("sglang").runs_as_measured(spec("eagle", "probabilistic"))
    assert engine_info("sglang").runs_as_measured(spec("eagle", "greedy"))
    assert not engine_info("llama.cpp").runs_as_measured(spec("dspark", "probabilistic"))  # the top token
    assert engine_info("llama.cpp").runs_as_measured(spec("draft_model", "probabilistic"))  # --spec-draft-sampling


@pytest.mark.parametrize("engine", ["sglang", "llama.cpp"])
def test_a_paste_for_a_top_token_engine_rests_on_top_token_measurements(both: Path, engine: str) -> None:
    plan = analyze_stored_study(load_stored_study(both), paste_engine=engine).analysis.snippet("prose")
    words = {"sglang": "SGLang"}.get(engine, engine)
    assert plan is not None and plan.unmeasured == (
        f"{words} drafts dspark with the draft's top token: this paste is chosen from the study's greedy drafting "
        "of it (measured at k = 1, 2, 3), not its probabilistic drafting",
    )
    assert {c.drafter.draft_sample_method for c in plan.choice_by_concurrency.values() if c.drafter} <= {"greedy"}
    assert plan.spec is None or plan.spec.draft_sample_method == "greedy"


def test_a_paste_whose_top_token_drafting_was_never_measured_says_so(tmp_path: Path) -> None:
    folder = _study(tmp_path / "sampled", "sampled", ["probabilistic"], off=False)  # the pick drafts
    vllm = specsweep("recommend", str(folder), "--format", "vllm")
    assert vllm.returncode == 0 and not vllm.stdout.startswith("#"), vllm.stdout
    assert '"method":"dspark"' in vllm.stdout
    for engine, words in (("sglang", "SGLang"), ("llama.cpp", "llama.cpp")):
        done = specsweep("recommend", str(folder), "--format", engine)
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first == (
            f"# {words} drafts dspark with the draft's top token, which this study never measured: this k comes "
            f'from probabilistic drafting; measure dspark with draft_sample_method "greedy" to choose its k for '
            f"{words}"
        ), done.stdout
