"""Which vocabulary a server's version gets, and a study that learns its server's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsweep.config import parse_study_config
from specsweep.engines import llamacpp, sglang, vllm
from specsweep.engines.versions import choose_vocabulary, version_numbers
from specsweep.errors import ConfigError
from specsweep.tuning.events import Note
from specsweep.tuning.records import read_trials
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

from .builders import emulator_study

PROFILES = Path(__file__).parents[1] / "src" / "specsweep" / "emulator" / "profiles"


@pytest.mark.parametrize(
    ("version", "known_as", "noted"),
    [
        ("0.33.0", "0.33", False),
        ("0.33.2", "0.33", False),
        ("0.32.0", "0.32", False),
        ("0.3.2", "0.33", True),  # not "0.32": numbers, not characters
        ("0.34.0", "0.33", True),
        (None, "0.33", True),
    ],
)
def test_a_version_gets_its_own_vocabulary_or_the_newest_with_a_line(version, known_as, noted) -> None:
    choice = choose_vocabulary("vLLM", vllm.VOCABULARIES, version)
    assert choice.known_as == known_as and (choice.note is not None) is noted
    if noted:
        assert "0.33, the newest" in choice.note and (version or "unread") in choice.note


def test_each_engines_version_strings() -> None:
    assert version_numbers("b11434-5d1c0ab") == (11434, 5, 1, 0)
    assert llamacpp.vocabulary_note("b11434-5d1c0ab") is None
    assert "llama.cpp build b9000" in llamacpp.vocabulary_note("b9000")
    assert "does not say its build number" in llamacpp.vocabulary_note("b0-unknown")
    assert sglang.vocabulary_note("0.5.23") is None and "0.5.23, the newest" in sglang.vocabulary_note("0.5.30")


def test_a_study_validates_the_rest_for_the_version_its_server_says(tmp_path: Path) -> None:
    """Before any start the newest vocabulary (0.33) admits rejection_sample_method 'fly'. The
    emulator here names vLLM 0.32, which has no 'fly': once its server has said so, the study stops
    with the configuration and the version named, keeping what it measured."""
    profile = tmp_path / "v032.toml"
    profile.write_text(
        (PROFILES / "dgx-spark-v4-flash.toml").read_text().replace('version = "0.33.0"', 'version = "0.32.0"')
    )
    data = emulator_study(
        "versions", profile=str(profile), k=(2, 2), study={"sampler": "grid"},
        search={"no_speculation": False, "open": {"rejection_sample_method": ["standard", "fly"]}},
    )  # fmt: skip
    config = parse_study_config(data)
    notes: list[str] = []
    runner = StudyRunner(
        config, study_paths(config, tmp_path), on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None
    )
    assert runner.space.size() == 2
    with pytest.raises(
        ConfigError, match=r"for emulator 0\.32\.0.*rejection_sample_method must be one of \(vLLM 0\.32\)"
    ):
        runner.run()
    measured = [t for t in read_trials(runner.study) if t.results]
    assert [t.spec.rejection_sample_method for t in measured] == ["standard"]  # measured, and kept
    assert not any("newest" in note for note in notes)  # 0.32 is a version specsweep knows
