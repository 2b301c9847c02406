"""The search space: optuna parameters <-> spec configs, and which configs are the same server.

Parameters: ``num_speculative_tokens`` (0 means speculation off), ``draft_sample_method``, and
``open.<field>`` for every other spec-config field the study opens up. Fields in
``search.fixed`` are added to every config. Two parameter sets that give the same effective
server (speculation off with either draft method; both draft methods at temperature 0, where
they are identical, or for a drafter that looks tokens up instead of sampling them) share one
key (types.Configuration), so the second costs no start. Each engine validates the fields it takes (llama.cpp has
fields of its own beside vLLM's).
"""

from __future__ import annotations

import functools
import itertools
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from specsweep.config import SearchSpace, ServerConfig
from specsweep.engines.registry import EngineInfo, server_args_without_spec
from specsweep.engines.vllm import (
    SHORTHAND_FLAGS,
    drafts_from_a_distribution,
    shorthand_flags_in,
    validate_speculative_config,
)
from specsweep.engines.vllm import looks_up as vllm_looks_up  # the default engine's rule
from specsweep.errors import ConfigError
from specsweep.runtime.gguf import gguf_metadata
from specsweep.runtime.trial_server import template_argv
from specsweep.types import Configuration, SpeculativeConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """The effective search space of one study run."""

    k_values: tuple[int, ...]  # includes 0 when speculation off is a candidate
    draft_sample_methods: tuple[str, ...]
    open: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any]
    methods_collapsed: bool  # draft_sample_method dropped: identical at temperature 0, or not an engine option
    validate: Callable[[dict[str, Any]], SpeculativeConfig] = validate_speculative_config  # the engine's rules
    samples_drafts: Callable[[SpeculativeConfig], bool] = drafts_from_a_distribution
    never_drafts: Callable[[SpeculativeConfig], str | None] = lambda spec: None  # the engine's rule
    looks_up: Callable[[SpeculativeConfig], bool] = vllm_looks_up  # the engine's: drafts looked up in the text

    def grid(self) -> dict[str, list[Any]]:
        """Every parameter with every value: optuna GridSampler's search space."""
        grid: dict[str, list[Any]] = {
            "num_speculative_tokens": list(self.k_values),
            "draft_sample_method": list(self.draft_sample_methods),
        }
        for name, choices in self.open.items():
            grid[f"open.{name}"] = list(choices)
        return grid

    def size(self) -> int:
        return len(self.configurations())

    def configurations(self) -> list[Configuration]:
        """The effective configurations of the grid, each once (with the first parameter set that
        names it), by draft length then draft method."""
        found: dict[str, Configuration] = {}
        names = list(self.grid())
        for values in itertools.product(*self.grid().values()):
            configuration = self.configuration(dict(zip(names, values, strict=True)))
            found.setdefault(configuration.key, configuration)
        return list(found.values())

    def configuration(self, params: dict[str, Any]) -> Configuration:
        """The configuration a parameter set names (ConfigError: no spec config the engine takes)."""
        return Configuration(spec=self.config_from_params(params), params=dict(params))

    def config_from_params(self, params: dict[str, Any]) -> SpeculativeConfig | None:
        """The validated spec config for a parameter set (None: speculation off)."""
        k = int(params["num_speculative_tokens"])
        if k == 0:
            return None
        raw: dict[str, Any] = {**self.fixed, "num_speculative_tokens": k}
        if not self.methods_collapsed:
            raw["draft_sample_method"] = params["draft_sample_method"]
        for name in self.open:
            raw[name] = params[f"open.{name}"]
        spec = self.validate(raw)
        if spec.draft_sample_method != "greedy" and not self.samples_drafts(spec):
            spec = replace(spec, draft_sample_method="greedy")  # a lookup drafter: the same server
        return spec

    def notes(self) -> list[str]:
        """One line per drafter of the space that does not read the draft sampling the space opens
        (its greedy and probabilistic configurations are one server, measured once), and one per
        drafter that can never draft at some of its draft lengths."""
        return self._idle_notes() + self._sampling_notes()

    def _idle_notes(self) -> list[str]:
        idle: dict[str, list[int]] = {}  # the engine's reason -> the draft lengths it holds for
        drafting = 0
        for spec in (c.spec for c in self.configurations()):
            if spec is None:
                continue
            reason = self.never_drafts(spec)
            if reason is None:
                drafting += 1
            else:
                idle.setdefault(reason, []).append(spec.num_speculative_tokens or 0)
        out = []
        for reason, ks in sorted(idle.items()):
            listed = ", ".join(str(k) for k in sorted(set(ks)))
            line = f"k = {listed}: {reason}, so those configurations run as speculation off, whatever the text"
            if not drafting:
                line += "; nothing in this space drafts, so the study would measure speculation off alone"
            out.append(line + ".")
        return out

    def _sampling_notes(self) -> list[str]:
        if self.methods_collapsed or len(self.draft_sample_methods) < 2:
            return []
        ignored = set()
        for spec in (c.spec for c in self.configurations()):
            if spec is not None and not self.samples_drafts(spec):
                ignored.add(spec.extra.get("spec_type") or spec.method or "the default method")
        return [
            f"draft_sample_method is not searched for {name}: it drafts without sampling (it looks tokens up, or "
            "takes the draft's top token), so greedy and probabilistic are one server, measured once."
            for name in sorted(ignored)
        ]

    def params_for(self, spec_fields: dict[str, Any] | None) -> dict[str, Any]:
        """Parameters that reproduce a spec config written as fields (None: speculation off)."""
        fields = dict(spec_fields or {})
        params: dict[str, Any] = {
            "num_speculative_tokens": int(fields.get("num_speculative_tokens", 0) or 0),
            "draft_sample_method": fields.get("draft_sample_method", self.draft_sample_methods[0]),
        }
        if self.methods_collapsed:
            params["draft_sample_method"] = self.draft_sample_methods[0]
        for name, choices in self.open.items():
            params[f"open.{name}"] = fields.get(name, choices[0])
        return params


def build_space(
    search: SearchSpace,
    *,
    temperature: float,
    engine_has_draft_sample_method: bool,
    validate: Callable[[dict[str, Any]], SpeculativeConfig] = validate_speculative_config,
    samples_drafts: Callable[[SpeculativeConfig], bool] = drafts_from_a_distribution,
    never_drafts: Callable[[SpeculativeConfig], str | None] = lambda spec: None,
    looks_up: Callable[[SpeculativeConfig], bool] = vllm_looks_up,
) -> Space:
    """The effective space for a study: drop what cannot make a difference."""
    low, high = search.num_speculative_tokens
    k_values = ((0,) if search.no_speculation else ()) + tuple(range(low, high + 1))
    methods = search.draft_sample_method
    collapsed = False
    if temperature == 0.0 or not engine_has_draft_sample_method:
        methods, collapsed = (methods[0],), True
    return Space(
        k_values=k_values,
        draft_sample_methods=tuple(methods),
        open=dict(search.open),
        fixed=dict(search.fixed),
        methods_collapsed=collapsed,
        validate=validate,
        samples_drafts=samples_drafts,
        never_drafts=never_drafts,
        looks_up=looks_up,
    )


def check_space(space: Space, source: str, baseline: dict[str, Any] | None = None) -> None:
    """ConfigError naming [search] if a configuration of the space is not a valid spec config.

    Run before any server starts, so a wrong ``search.fixed``, ``search.open`` or
    ``search.baseline`` stops the study at once instead of failing every trial.
    """
    try:
        space.size()
    except ConfigError as exc:
        raise ConfigError(
            f"{source}: search.fixed / search.open give an invalid spec config ({exc}); fix that value."
        ) from None
    if baseline is None:
        return
    try:
        if baseline.get("num_speculative_tokens"):
            space.validate({**space.fixed, **baseline})  # as written, before any collapse
        space.config_from_params(space.params_for(baseline))
    except ConfigError as exc:
        raise ConfigError(f"{source}: search.baseline is not a valid spec config ({exc}); fix that value.") from None


def check_start_command(start: str | tuple[str, ...] | None, engine: str, source: str) -> None:
    """ConfigError if the server's start command sets a spec-config key itself that specsweep sets
    in each trial (vLLM's --spec-method/--spec-model/--spec-tokens, refused with the same key in
    --speculative-config)."""
    if engine != "vllm" or start is None:
        return
    argv = shlex.split(start) if isinstance(start, str) else list(start)
    found = shorthand_flags_in(argv)
    if found:
        keys = ", ".join(SHORTHAND_FLAGS[flag] for flag in found)
        raise ConfigError(
            f"{source}: server.start has {', '.join(found)}, which vLLM refuses beside the same key in the "
            f"--speculative-config each trial passes; remove it and set {keys} in search.fixed instead."
        )


def check_spec_args(
    space: Space,
    engine: EngineInfo,
    source: str,
    *,
    help_flags: frozenset[str] | None = None,
    server: ServerConfig | None = None,
) -> None:
    """ConfigError naming [search] if the engine cannot render a configuration of the space as flags
    (on llama.cpp, for the build whose ``--help`` listed ``help_flags``), or ``server`` refuses to
    start with the table the space sets (:func:`check_table_start`), or would run a draft length
    shorter than asked (:func:`check_draft_caps`)."""
    if server is not None:
        check_table_start(space, engine, source, server)
        check_draft_caps(space, engine, server, source)  # llama.cpp: a model's MTP layers
    for configuration in space.configurations():
        try:
            engine.spec_args(configuration.spec, help_flags=help_flags)
        except ConfigError as exc:
            raise ConfigError(f"{source}: [search] {exc}") from None


def check_table_start(space: Space, engine: EngineInfo, source: str, server: ServerConfig) -> None:
    """ConfigError, before any start, where every trial would start with a per-batch-size table
    (``search.fixed``) that the study's server, from its start command, refuses to start with
    (SGLang's adaptive mode beside LoRA or HiSparse). Attach mode: the user starts it, unread."""
    argv = template_argv(server)
    if not argv or not space.fixed.get("num_speculative_tokens_per_batch_size"):
        return
    reason = engine.table_start_refusal(server_args_without_spec(engine.name, argv))
    if reason is not None:
        raise ConfigError(
            f"{source}: search.fixed sets num_speculative_tokens_per_batch_size, but {reason}: leave the table "
            "out of search.fixed, or those flags out of server.start."
        )


def check_draft_caps(space: Space, engine: EngineInfo, server: ServerConfig, source: str) -> None:
    """ConfigError naming [search] if the engine would run a configuration's draft length shorter,
    read from the header of a model file its spec config or start command names (llama.cpp's
    chained draft-mtp: its MTP layers). A file that cannot be read here is left to the server."""
    argv = template_argv(server) if server.mode == "process" else None
    read = functools.cache(gguf_metadata)
    for configuration in space.configurations():
        reason = engine.draft_cap_refusal(configuration.spec, argv, read)
        if reason is not None:
            raise ConfigError(f"{source}: [search] {reason}")
