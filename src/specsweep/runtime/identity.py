"""What a running server says about itself: engine, version, served model, a few facts.

- vLLM: ``/version`` ({"version"}) and ``/v1/models``.
- The emulator: vLLM's ``/version`` plus {"emulator": {"profile", "time_scale", "startup_s",
  "max_num_seqs", "captured_widths"}}: its modelled boot, the most sequences it batches and the
  verified widths it captured graphs for, which no real engine says over HTTP.
- llama.cpp: ``/props`` (``build_info``, ``model_path``, ``total_slots``, the context size) and
  ``/v1/models``; it has no ``/version``.
- SGLang: ``/server_info`` (``version``; SGLang 0.5.23 ``entrypoints/http_server.py``, where
  the older ``/get_server_info`` still answers but logs a deprecation warning each call), else
  ``/get_server_info`` for builds before the rename; and ``/v1/models``. Its resolved arguments
  say whether adaptive mode runs (``engines/sglang.py`` ``adaptive_state``); read also when the
  engine is not known yet (``watch`` before /metrics named it).

The command line a server was started with cannot be read over HTTP, but for SGLang's
``launch_command`` (kept with its secrets masked): elsewhere it stays unknown here.
Nothing raises: what cannot be read is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from dataclasses import dataclass, field
from typing import Any, get_args

import httpx

from specsweep.engines.sglang import AdaptiveState, adaptive_state
from specsweep.runtime.modelled_time import ServerClock, clock_from_version
from specsweep.secrets import mask_argv


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerIdentity:
    """A running server's self-description (None where it says nothing)."""

    engine: str | None
    engine_version: str | None
    model: str | None
    facts: dict[str, Any] = field(default_factory=dict)
    time_scale: float = 1.0  # the emulator's: its rates are this many times the modelled hardware's
    boot_s: float | None = None  # its start's boot on its own clock, where it says (the emulator's modelled startup)
    max_num_seqs: int | None = None  # the most sequences it batches, where it says (the emulator)
    captured_widths: tuple[int, ...] = ()  # verified widths with a captured graph, where it says (the emulator)
    adaptive: AdaptiveState | None = None  # SGLang: its adaptive mode, as its /server_info says
    launch_args: tuple[str, ...] | None = None  # SGLang: the command it was started with, secrets masked

    @property
    def clock(self) -> ServerClock:
        return ServerClock(self.time_scale)

    @classmethod
    def from_stored(cls, stored: dict[str, Any] | None) -> ServerIdentity | None:
        """An identity as ``dataclasses.asdict`` stored it (None: nothing stored)."""
        if not stored:
            return None
        return cls(
            engine=stored.get("engine"),
            engine_version=stored.get("engine_version"),
            model=stored.get("model"),
            facts=dict(stored.get("facts") or {}),
            time_scale=float(stored.get("time_scale") or 1.0),
            boot_s=_number(stored.get("boot_s")),
            max_num_seqs=_count(stored.get("max_num_seqs")),
            captured_widths=_widths(stored.get("captured_widths")),
            adaptive=stored.get("adaptive") if stored.get("adaptive") in get_args(AdaptiveState) else None,
            launch_args=_words(stored.get("launch_args")),
        )


def model_name(engine: str | None, served: str | None) -> str | None:
    """The model as a rig compares it: llama.cpp serves a file path, of which the file name counts."""
    if served is None:
        return None
    if engine == "llama.cpp" or served.endswith(".gguf"):
        return served.rstrip("/").rsplit("/", 1)[-1]
    return served


async def _get_json(http: httpx.AsyncClient, path: str) -> Any:
    try:
        response = await http.get(path, timeout=10.0)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def read_identity(http: httpx.AsyncClient, engine: str | None) -> ServerIdentity:
    """The identity of the server behind ``http`` (``engine`` as detected from /metrics, or None)."""
    models = await _get_json(http, "/v1/models")
    served = None
    with contextlib.suppress(TypeError, KeyError, IndexError):
        served = str(models["data"][0]["id"])
    facts: dict[str, Any] = {}
    version = None
    clock = ServerClock()
    boot_s: float | None = None
    max_num_seqs: int | None = None
    captured_widths: tuple[int, ...] = ()
    if engine in (None, "vllm", "emulator"):
        answer = await _get_json(http, "/version")
        if isinstance(answer, dict) and "version" in answer:
            version = str(answer["version"])
            emulated = answer.get("emulator")
            if isinstance(emulated, dict):
                engine = "emulator"
                facts["profile"] = emulated.get("profile")
                clock = clock_from_version(answer)
                boot_s = _number(emulated.get("startup_s"))
                max_num_seqs = _count(emulated.get("max_num_seqs"))
                captured_widths = _widths(emulated.get("captured_widths"))
            else:
                engine = engine or "vllm"
    if engine in (None, "llama.cpp"):
        props = await _get_json(http, "/props")
        if isinstance(props, dict) and "build_info" in props:
            engine = "llama.cpp"
            version = str(props["build_info"])
            served = served or props.get("model_path")
            settings = props.get("default_generation_settings") or {}
            if "n_ctx" in settings:
                facts["n_ctx"] = int(settings["n_ctx"])
            if "total_slots" in props:
                facts["total_slots"] = int(props["total_slots"])
    adaptive, launch_args = None, None
    if engine in (None, "sglang"):
        info = await _get_json(http, "/server_info")
        if engine == "sglang" and (not isinstance(info, dict) or "version" not in info):
            info = await _get_json(http, "/get_server_info")
        if isinstance(info, dict) and "version" in info:
            engine, version = "sglang", str(info["version"])
            adaptive = adaptive_state(info)
            launch_args = _command_words(info.get("launch_command"))
    return ServerIdentity(
        engine=engine,
        engine_version=version,
        model=model_name(engine, served),
        facts=facts,
        time_scale=clock.time_scale,
        boot_s=boot_s,
        max_num_seqs=max_num_seqs,
        captured_widths=captured_widths,
        adaptive=adaptive,
        launch_args=launch_args,
    )


def _command_words(command: Any) -> tuple[str, ...] | None:
    """A command line a server gave as one string, as words with every secret masked (None: none
    given, or quotes that do not balance)."""
    if not isinstance(command, str) or not command.strip():
        return None
    try:
        return mask_argv(shlex.split(command))
    except ValueError:
        return None


def _words(value: Any) -> tuple[str, ...] | None:
    """Stored words (None: none stored, or not a list of strings)."""
    if not isinstance(value, list | tuple) or not all(isinstance(word, str) for word in value):
        return None
    return tuple(value)


def _number(value: Any) -> float | None:
    """A non-negative number a server gave (None: it gave none, or not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _count(value: Any) -> int | None:
    """A positive whole number a server gave (None: it gave none, or not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _widths(value: Any) -> tuple[int, ...]:
    """The verified widths a server gave, ascending and once each (empty: it gave none, or a list
    with anything but positive whole numbers in it: a partial list would pad steps wrongly)."""
    if not isinstance(value, list | tuple):
        return ()
    counts = [_count(width) for width in value]
    return () if None in counts else tuple(sorted({c for c in counts if c is not None}))


def read_server_identity(url: str, engine: str | None = None) -> ServerIdentity:
    """Synchronous entry point for the layers above."""

    async def run() -> ServerIdentity:
        async with httpx.AsyncClient(base_url=url.rstrip("/")) as http:
            return await read_identity(http, engine)

    return asyncio.run(run())
