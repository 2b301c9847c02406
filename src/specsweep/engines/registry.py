"""The engines specsweep knows, by name, and how to tell them apart from their metrics."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from specsweep.engines import llamacpp, llamacpp_caps, sglang, vllm, vllm_graphs, vllm_tables
from specsweep.errors import ConfigError
from specsweep.secrets import mask_argv
from specsweep.templates import SHELLS
from specsweep.types import (
    REAL_ENGINE_NOISE,
    USUAL_RUN_NOISE,
    BootFacts,
    CounterNames,
    NoisePriors,
    SpeculativeConfig,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What the measuring side needs to know about one engine."""

    name: str
    metric_prefix: str
    counters: CounterNames
    render_spec_args: Callable[..., list[str]]
    parse_boot_facts: Callable[[str], BootFacts] = vllm.parse_boot_facts
    has_draft_sample_method: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    # What replaces it in the requests of a workload whose prompts share a prefix (a context level).
    shared_prefix_body: dict[str, Any] = field(default_factory=dict)
    # The spec-config fields the engine takes (vLLM's, or vLLM's and the engine's own), for a version.
    validate_spec: Callable[..., SpeculativeConfig] = vllm.validate_speculative_config
    # Whether a config's drafter samples its drafts (so draft_sample_method changes anything).
    drafts_from_a_distribution: Callable[[SpeculativeConfig], bool] = vllm.drafts_from_a_distribution
    # Whether a config's drafter looks its drafts up in the text (its step time is then no line in k).
    looks_up: Callable[[SpeculativeConfig], bool] = vllm.looks_up
    # Why a config can never draft, whatever the text (None: it can).
    never_drafts: Callable[[SpeculativeConfig], str | None] = lambda spec: None
    # Set where the flags depend on the build: the flag names its ``--help`` text lists.
    parse_help: Callable[[str], frozenset[str]] | None = None
    # What ``watch`` reads besides the counters (None: the engine does not publish it).
    running_gauge: str | None = None  # requests in the running batch
    waiting_gauge: str | None = None  # requests queued for a slot
    finished_requests: str | None = None  # a counter of finished requests
    accept_length_gauge: str | None = None  # mean tokens per verification step, where no counters exist
    per_batch_size_tables: bool = False  # takes num_speculative_tokens_per_batch_size
    # what its starts usually vary by, and its configurations' steps from the physics
    noise: NoisePriors = REAL_ENGINE_NOISE
    # Why the engine cannot run a per-batch-size choice with a spec config, on a server started with
    # these flags (spec flags aside; None: not known) at this version (None: it can).
    table_refusal: Callable[[SpeculativeConfig, Sequence[str] | None, str | None], str | None] = (
        lambda spec, server_args, version: None
    )
    # Why a server started with these flags (spec flags aside) refuses to start with a table at all.
    table_start_refusal: Callable[[Sequence[str]], str | None] = lambda server_args: None
    # The file a server reads a config's per-batch-size table from (SGLang's adaptive config),
    # written before its start (None: the flags carry the table, or there is none).
    table_file: Callable[[SpeculativeConfig | None], str | None] = lambda spec: None
    # Comment lines a paste of a spec config carries for such a server (what its table changes).
    paste_notes: Callable[[SpeculativeConfig, Sequence[str] | None, str | None], tuple[str, ...]] = (
        lambda spec, server_args, version: ()
    )
    # Why a server that started does not run the configuration asked, from its log (None: it does).
    boot_refusal: Callable[[str, SpeculativeConfig | None], str | None] = lambda log, spec: None
    # Why a server would not run a configuration's draft length, from the header of a model file the
    # spec config or the start command names (spec, start argv, path -> header or None; None: it would).
    draft_cap_refusal: Callable[
        [SpeculativeConfig | None, Sequence[str] | None, Callable[[str], Mapping[str, Any] | None]], str | None
    ] = lambda spec, argv, read: None
    # The flags that bound a request's prompt and completion tokens (the server's max model length).
    context_flags: tuple[str, ...] = vllm.CONTEXT_FLAGS
    # The line to say when a server's version is not one whose vocabulary specsweep knows.
    vocabulary_note: Callable[[str | None], str | None] = lambda version: None
    # The widths a server that captured graphs has them for, from (version, argv without the spec
    # config, spec config): None where the engine's rule is not known.
    graph_widths: Callable[[str | None, Sequence[str], SpeculativeConfig | None], tuple[int, ...] | None] = (
        lambda version, argv, spec: None
    )

    def table_refusal_on(
        self, server_args: Sequence[str] | None, version: str | None
    ) -> Callable[[SpeculativeConfig], str | None]:
        """:attr:`table_refusal` for one server (its flags and version), as the paste plan takes it."""
        return lambda spec: self.table_refusal(spec, server_args, version)

    def runs_as_measured(self, spec: SpeculativeConfig) -> bool:
        """Whether this engine drafts as ``spec`` (measured on any engine) did: greedy drafting is
        the draft's top token everywhere; a sampled draft only where the engine samples that drafter
        (SGLang never does; llama.cpp for draft-simple and draft-mtp). A method the engine has no
        name for is left to its render, which refuses it."""
        if spec.draft_sample_method == "greedy" or not spec.num_speculative_tokens:
            return True
        try:
            return self.has_draft_sample_method and self.drafts_from_a_distribution(spec)
        except ConfigError:
            return True

    def spec_args(
        self, spec: SpeculativeConfig | None, *, help_flags: frozenset[str] | None = None, table_path: str | None = None
    ) -> list[str]:
        """The engine's flags for ``spec``; ``help_flags``: what the server binary's --help lists, if read;
        ``table_path``: where ``table_file``'s text was written (None: the engine's usual place)."""
        if self.parse_help is not None:
            return self.render_spec_args(spec, flags=help_flags)
        if table_path is not None:
            return self.render_spec_args(spec, adaptive_config_path=table_path)
        return self.render_spec_args(spec)


_VLLM = EngineInfo(
    name="vllm",
    metric_prefix="vllm:",
    counters=vllm.COUNTERS,
    render_spec_args=vllm.render_spec_args,
    vocabulary_note=lambda version: vllm.vocabulary_for(version).note,
    running_gauge=vllm.NUM_REQUESTS_RUNNING,
    waiting_gauge=vllm.NUM_REQUESTS_WAITING,
    finished_requests=vllm.REQUEST_SUCCESS + "_total",
    per_batch_size_tables=True,
    graph_widths=vllm_graphs.captured_widths,
    table_refusal=vllm_tables.table_refusal,
    paste_notes=vllm_tables.paste_notes,
)

ENGINES = {
    "vllm": _VLLM,
    # The emulator speaks vLLM.
    # Its truth is the physics with small effects: its configurations miss it by under 1%.
    "emulator": replace(_VLLM, name="emulator", noise=NoisePriors(USUAL_RUN_NOISE)),
    "llama.cpp": EngineInfo(
        name="llama.cpp",
        metric_prefix=llamacpp.METRIC_PREFIX,
        counters=llamacpp.COUNTERS,
        render_spec_args=llamacpp.render_spec_args,
        extra_body=llamacpp.EXTRA_BODY,
        shared_prefix_body=llamacpp.SHARED_PREFIX_BODY,
        validate_spec=llamacpp.validate_spec_config,
        drafts_from_a_distribution=llamacpp.drafts_from_a_distribution,
        never_drafts=llamacpp.never_drafts,
        looks_up=llamacpp.looks_up,
        parse_help=llamacpp.parse_help_flags,
        table_refusal=lambda spec, server_args, version: llamacpp.table_refusal(spec),
        vocabulary_note=llamacpp.vocabulary_note,
        boot_refusal=llamacpp_caps.boot_refusal,
        draft_cap_refusal=llamacpp_caps.mtp_cap_refusal,
        context_flags=llamacpp.CONTEXT_FLAGS,
        running_gauge=llamacpp.REQUESTS_PROCESSING,
        waiting_gauge=llamacpp.REQUESTS_DEFERRED,
    ),
    "sglang": EngineInfo(
        name="sglang",
        metric_prefix=sglang.METRIC_PREFIX,
        counters=sglang.COUNTERS,
        render_spec_args=sglang.render_spec_args,
        has_draft_sample_method=False,
        extra_body=sglang.EXTRA_BODY,
        validate_spec=sglang.validate_spec_config,
        table_refusal=sglang.table_refusal,
        table_start_refusal=sglang.adaptive_start_refusal,
        table_file=sglang.adaptive_config_file,
        vocabulary_note=sglang.vocabulary_note,
        running_gauge=sglang.NUM_RUNNING_REQS,
        waiting_gauge=sglang.NUM_QUEUE_REQS,
        accept_length_gauge=sglang.ACCEPT_LENGTH_GAUGE,
        context_flags=sglang.CONTEXT_FLAGS,
    ),
}


def engine_info(name: str) -> EngineInfo:
    """The engine called ``name``; ConfigError listing the known ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; choose one of: " + ", ".join(ENGINES) + ".") from None


def known_engine(name: str) -> EngineInfo | None:
    """The engine called ``name``, or None where this version does not know it (a stored study's)."""
    return ENGINES.get(name)


# The engine a snippet format pastes to.
FORMAT_ENGINES = {"sglang": "sglang", "llama.cpp": "llama.cpp"}


def engine_of_format(fmt: str) -> EngineInfo:
    """The engine whose syntax a snippet format speaks (vLLM's forms: vLLM)."""
    return ENGINES[FORMAT_ENGINES.get(fmt, "vllm")]


def measured_speaks_for(measured: str, paste: EngineInfo) -> bool:
    """Whether the flags and version of a server of engine ``measured`` say what ``paste``'s server
    does (the same engine; the emulator speaks for vLLM)."""
    return measured == paste.name or (measured == "emulator" and paste.name == "vllm")


def engine_from_metric_names(names: set[str]) -> EngineInfo | None:
    """The engine whose metric prefix appears among ``names``, if any."""
    for info in ENGINES.values():
        if info.name == "emulator":
            continue
        if any(name.startswith(info.metric_prefix) for name in names):
            return info
    return None


# Flags (each with one value) that set the spec config, per engine: a rig's flags leave them out.
SPEC_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--speculative-config", "-sc", *vllm.SHORTHAND_FLAGS),
    "emulator": ("--speculative-config", "-sc"),
    "llama.cpp": llamacpp.SPEC_FLAGS,
    "sglang": ("--speculative-",),  # a prefix: every --speculative-* flag
}  # fmt: skip
# Flags that say where a server listens, or (the emulator) how fast it runs its model: not the rig.
PLACE_FLAGS: dict[str, tuple[str, ...]] = {
    "emulator": ("--host", "--port", "--time-scale", "--seed", "--startup-seconds", "--start-index"),
}
DEFAULT_PLACE_FLAGS = ("--host", "--port")


def server_args_without_spec(engine: str, argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A server's argv as a rig compares it: the program's base name, no spec-config flags, no
    --host or --port (``--flag value`` and ``--flag=value`` alike), secrets masked (``--api-key ***``:
    which key a server wants does not change its speed). The emulator's ``python -m specsweep
    emulate`` reads as ``specsweep emulate``; a shell string (``sh -c SCRIPT``) as the words of its
    script, so trials that differ only in their port or spec config have the same flags."""
    args = list(mask_argv(argv))
    if len(args) == 3 and PurePosixPath(args[0]).name in SHELLS and args[1] == "-c":
        with contextlib.suppress(ValueError):  # unbalanced quotes: compared as the script it is
            args = shlex.split(args[2])
    if "emulate" in args and any(a == "specsweep" or a.endswith("/specsweep") for a in args[: args.index("emulate")]):
        args = ["specsweep", *args[args.index("emulate") :]]
    elif args:
        args[0] = args[0].rstrip("/").rsplit("/", 1)[-1]
    spec = SPEC_FLAGS.get(engine, ())
    place = PLACE_FLAGS.get(engine, DEFAULT_PLACE_FLAGS)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        dropped = name in place or name in spec or any(p.endswith("-") and name.startswith(p) for p in spec)
        if dropped:
            skip = "=" not in arg
            continue
        out.append(arg)
    return tuple(out)


def max_num_seqs_flag(argv: Sequence[str]) -> int | None:
    """The value of ``--max-num-seqs N`` (or ``--max-num-seqs=N``) in a command line, if it is a number."""
    found = flag_number(argv, ("--max-num-seqs",))
    return found[0] if found else None


def max_model_len_flag(engine: EngineInfo, argv: Sequence[str]) -> tuple[int, str] | None:
    """The server's max model length from its command line, and the flag that set it: None where
    no flag sets it to a number above 0 (the engine then takes the model's own)."""
    found = flag_number(argv, engine.context_flags)
    return found if found and found[0] > 0 else None


def flag_number(argv: Sequence[str], flags: Sequence[str]) -> tuple[int, str] | None:
    """The whole-number value of the first of ``flags`` (``--flag N`` or ``--flag=N``) in a command line."""
    for index, arg in enumerate(argv):
        name, _, attached = arg.partition("=")
        if name not in flags:
            continue
        value = attached if "=" in arg else (argv[index + 1] if index + 1 < len(argv) else "")
        if value.isdigit():
            return int(value), name
    return None
