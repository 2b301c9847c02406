"""llama.cpp's chained draft-mtp drafts at most as many tokens as the model has MTP layers, and
says nothing (common/speculative.cpp, b11434): a study past that cap is refused before any start,
from the GGUF header of the model the MTP heads come from, and a trial whose server log shows the
cap fails with the reason."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from specsweep.config import SearchSpace
from specsweep.engines import llamacpp_caps
from specsweep.engines.registry import engine_info
from specsweep.errors import ConfigError
from specsweep.runtime.gguf import gguf_metadata
from specsweep.server_config import ServerConfig
from specsweep.tuning.space import build_space, check_draft_caps

from .builders import emulator_study, specsweep, write_study


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, pairs: dict[str, Any]) -> Path:
    """A GGUF v3 header with ``pairs`` (strings as strings, ints as u32, lists as string arrays)
    and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs))
    for key, value in pairs.items():
        out += _text(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + _text(value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_text(v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    path.write_bytes(out)
    return path


def mtp_model(path: Path, arch: str, layers: int) -> Path:
    return write_gguf(path, {
        "general.architecture": arch, "tokenizer.ggml.tokens": ["a", "bb", "ccc"], f"{arch}.block_count": 48,
        f"{arch}.nextn_predict_layers": layers,
    })  # fmt: skip


def test_the_header_is_read_without_the_tensors(tmp_path: Path) -> None:
    model = mtp_model(tmp_path / "m.gguf", "step35", 3)
    assert gguf_metadata(model) == {"general.architecture": "step35", "step35.block_count": 48,
                                    "step35.nextn_predict_layers": 3}  # fmt: skip
    (tmp_path / "not.gguf").write_text("GGUF but no header")
    assert gguf_metadata(tmp_path / "not.gguf") is None
    assert gguf_metadata(tmp_path / "missing.gguf") is None


def test_chained_heads_cap_the_draft_only_past_one_layer_and_apart_from_the_targets_memory() -> None:
    def cap(arch: str, layers: int | None) -> int | None:
        header: dict[str, Any] = {"general.architecture": arch}
        if layers is not None:
            header[f"{arch}.nextn_predict_layers"] = layers
        return llamacpp_caps.mtp_chain_cap(header)

    assert cap("step35", 3) == 3
    assert cap("qwen35", 1) is None  # one head, drafted autoregressively up to n_max
    assert cap("gemma4-assistant", 4) is None  # shares the target's memory: every head in one graph
    assert cap("gemma3", None) is None


def _space(k: tuple[int, int], **fixed: Any):
    engine = engine_info("llama.cpp")
    search = SearchSpace(num_speculative_tokens=k, fixed={"method": "mtp", **fixed})
    return build_space(
        search, temperature=0.0, engine_has_draft_sample_method=True, validate=engine.validate_spec,
        samples_drafts=engine.drafts_from_a_distribution,
    )  # fmt: skip


def _server(target: Path) -> ServerConfig:
    return ServerConfig(engine="llama.cpp", mode="process", start=("llama-server", "-m", str(target), "{spec_args}"))


def test_a_study_past_the_mtp_layers_of_its_target_stops_before_any_start(tmp_path: Path) -> None:
    target = mtp_model(tmp_path / "step.gguf", "step35", 3)
    engine = engine_info("llama.cpp")
    check_draft_caps(_space((1, 3)), engine, _server(target), "s.toml")
    with pytest.raises(ConfigError) as caught:
        check_draft_caps(_space((1, 5)), engine, _server(target), "s.toml")
    assert str(caught.value) == (
        f"s.toml: [search] llama.cpp build 11434 chains draft-mtp over the 3 MTP layers of {target} and drafts at "
        "most 3 tokens, without a word: k = 4 would run as k = 3 under another key; keep "
        "search.num_speculative_tokens at or below 3."
    )
    # With -md the MTP heads are the draft's: its header decides, not the target's.
    draft = mtp_model(tmp_path / "draft.gguf", "step35", 2)
    with pytest.raises(ConfigError, match=r"over the 2 MTP layers of .*draft\.gguf"):
        check_draft_caps(_space((1, 3), model=str(draft)), engine, _server(target), "s.toml")
    # A target that cannot be read here (a path on another host) is left to the server; vLLM has no such cap.
    check_draft_caps(_space((1, 5)), engine, _server(tmp_path / "elsewhere.gguf"), "s.toml")
    check_draft_caps(_space((1, 5)), engine_info("vllm"), _server(target), "s.toml")


def test_a_started_server_whose_loader_shows_the_cap_fails_the_trial() -> None:
    """For a model no file path named (-hf), the loader's header dump in the log says it."""
    spec = engine_info("llama.cpp").validate_spec({"method": "mtp", "num_speculative_tokens": 5})
    log = (
        "llama_model_loader: loaded meta data with 40 key-value pairs and 900 tensors from /c/step.gguf "
        "(version GGUF V3)\n"
        "llama_model_loader: - kv   0:                       general.architecture str              = step35\n"
        "llama_model_loader: - kv  31:                step35.nextn_predict_layers u32              = 3\n"
        "srv  load_model: loaded\n"
    )
    reason = engine_info("llama.cpp").boot_refusal(log, spec)
    assert reason is not None and reason.startswith(
        "llama.cpp build 11434 chains draft-mtp over the 3 MTP layers of the target model and drafts at most 3"
    )
    shorter = engine_info("llama.cpp").validate_spec({"method": "mtp", "num_speculative_tokens": 3})
    assert engine_info("llama.cpp").boot_refusal(log, shorter) is None


def test_study_dry_run_refuses_the_space_in_one_line(tmp_path: Path) -> None:
    """As a user meets it: `study --dry-run` (which starts nothing, as `study` before its first
    start) stops on the cap, one line; the build's --help is a stand-in listing the draft flags."""
    program = tmp_path / "llama-server"
    program.write_text('#!/bin/sh\necho "--spec-type TYPE"\necho "--spec-draft-n-max N"\n')
    program.chmod(0o755)
    mtp_model(tmp_path / "step.gguf", "step35", 3)
    data = emulator_study("mtp", k=(1, 5))
    data["server"] = {
        "engine": "llama.cpp",
        "mode": "process",
        "start": [str(program), "-m", "step.gguf", "{spec_args}"],
    }
    data["search"]["fixed"] = {"method": "mtp"}
    write_study(tmp_path / "s.toml", data)
    done = specsweep("study", "--config", "s.toml", "--dry-run", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "specsweep: error: s.toml: [search] llama.cpp build 11434 chains draft-mtp over the 3 MTP layers of "
        "step.gguf and drafts at most 3 tokens, without a word: k = 4 would run as k = 3 under another key; keep "
        "search.num_speculative_tokens at or below 3.\n"
    )
