"""Study-file keys and defaults come from the records alone (config.py, toml_records.py): what an
omitted key means, which keys a table lists, and that every key a file may hold is read.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from specsweep.config import KNOWN_KEYS, EmulatorServer, ServerConfig, StudyConfig, parse_study_config
from specsweep.errors import ConfigError
from specsweep.toml_records import NAMES_TABLE, NOT_IN_FILE, RecordTable, record_default, record_keys

REFERENCE = Path(__file__).parents[1] / "docs" / "study-config.md"


def test_a_file_that_only_names_the_study_gets_the_defaults_of_the_records() -> None:
    assert parse_study_config({"study": {"name": "s"}}, source="s.toml") == StudyConfig(name="s", source="s.toml")
    config = parse_study_config({"study": {"name": "s"}, "server": {"emulator": {"seed": 4}}}, source="s.toml")
    assert config.server == ServerConfig(emulator=EmulatorServer(seed=4))


@pytest.mark.parametrize(
    ("server", "mode", "port"),
    [
        ({}, "emulator", 0),
        ({"engine": "vllm", "start": ["vllm", "serve"]}, "process", 0),
        ({"engine": "sglang", "mode": "commands", "start": "up s", "stop": "down s"}, "commands", 8000),
        ({"engine": "llama.cpp", "mode": "attach"}, "attach", 8000),
        ({"engine": "vllm", "mode": "attach", "port": 9000}, "attach", 9000),
        ({"engine": "vllm", "mode": "process", "start": ["v"], "port": 8001}, "process", 8001),
    ],
)  # fmt: skip
def test_mode_follows_the_engine_and_port_follows_the_mode(server: dict, mode: str, port: int) -> None:
    config = parse_study_config({"study": {"name": "s"}, "server": server})
    assert (config.server.mode, config.server.port) == (mode, port)


def _documented_keys() -> dict[str, list[str]]:
    """The keys the reference page lists, by table, in the page's order."""
    keys: dict[str, list[str]] = {}
    for path in re.findall(r"^\| `([a-z_]+\.[a-z0-9_.]+)` \|", REFERENCE.read_text(), flags=re.M):
        table, key = path.rsplit(".", 1)
        keys.setdefault(table, []).append(key)
    return keys


@pytest.mark.parametrize("table", ["study", "server", "server.emulator", "search", "measure", "objective"])
def test_an_unknown_key_lists_the_tables_keys_as_documented(table: str) -> None:
    data: dict = {"study": {"name": "s"}}
    where = data
    for part in table.split("."):
        where = where.setdefault(part, {})
    where["colour"] = "red"
    with pytest.raises(ConfigError) as caught:
        parse_study_config(data, source="s.toml")
    message = str(caught.value)
    assert f"unknown key {table}.colour" in message
    if table != "server.emulator":  # a nested table's message points to the reference page instead
        listed = message.split(f"valid keys in [{table}]: ")[1].removesuffix(".").split(", ")
        assert listed == _documented_keys()[table]


def _record_for(table: str) -> type:
    record: type = StudyConfig
    for part in table.split(".")[0 if table != "study" else 1 :]:
        record = next(f.default_factory for f in fields(record) if f.name == part)  # type: ignore[assignment]
    return record


def test_the_reference_page_states_the_defaults_the_records_hold() -> None:
    """Each row that writes its default as a literal, "(default 900)", agrees with the record.

    A default of None is described in words (``server.model``: the first model the server lists).
    """
    checked = 0
    for path, row in re.findall(r"^\| `([a-z_]+\.[a-z0-9_.]+)` \|(.*)$", REFERENCE.read_text(), flags=re.M):
        written = re.search(r"\(default (`[^`]+`|[-\d.]+|true|false)[,)]", row)
        table, key = path.rsplit(".", 1)
        if written is None or (default := record_default(_record_for(table), key)) is None:
            continue
        text = written.group(1).strip("`")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text  # a bare word: a string
        assert value == default, (path, value, default)
        checked += 1
    assert checked >= 15


WRONG = [{"x": {"y": 1}}, "?", -1]  # a table, a word, a negative number: each key refuses one


@pytest.mark.parametrize("path", [f"{table}.{key}" for table, keys in KNOWN_KEYS.items() for key in keys])
def test_every_key_a_file_may_hold_is_read(path: str) -> None:
    """A key the parser never read would be accepted and silently dropped; each refuses a wrong value."""
    *tables, key = path.split(".")
    messages = []
    for wrong in WRONG:
        data: dict = {"study": {"name": "s"}}
        where = data
        for part in tables:
            where = where.setdefault(part, {})
        where[key] = wrong
        try:
            parse_study_config(data, source="s.toml")
        except ConfigError as exc:
            messages.append(str(exc))
    assert any(path in message for message in messages), (path, messages)


# -- reading a table against its record ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inner:
    depth: int = 2
    tags: tuple[str, ...] = ("a", "b")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Outer:
    title: str
    ratio: float = 0.5
    inner: _Inner = field(default_factory=_Inner)
    weights: dict[str, float] = field(default_factory=dict, metadata=NAMES_TABLE)
    origin: str = field(default="", metadata=NOT_IN_FILE)
    flag: bool = False


def test_record_keys_come_from_fields_with_nested_tables_after() -> None:
    assert record_keys(_Outer, "outer") == {
        "outer": ("title", "ratio", "flag"),
        "inner": ("depth", "tags"),
        "weights": (),
    }
    assert list(record_keys(_Outer, "outer", "outer.")) == ["outer", "outer.inner", "outer.weights"]


def test_a_default_reads_as_a_toml_file_would_write_it() -> None:
    assert record_default(_Inner, "tags") == ["a", "b"]  # a tuple field, a TOML array
    assert record_default(_Outer, "weights") == {} and record_default(_Outer, "ratio") == 0.5


@pytest.mark.parametrize(
    ("key", "kind", "value", "result"),
    [
        ("ratio", float, 2, 2.0),  # a whole number is a number
        ("ratio", float, True, "f.toml: outer.ratio must be a number (got True)."),
        ("title", str, 3, "f.toml: outer.title must be a string (got 3)."),
        ("flag", bool, 1, "f.toml: outer.flag must be true or false (got 1)."),
        ("flag", bool, False, False),
    ],
)
def test_a_value_is_checked_against_its_kind(key: str, kind: type, value: object, result: object) -> None:
    table = RecordTable(values={key: value}, path="outer", record=_Outer, source="f.toml")
    if isinstance(result, str):  # the error, word for word
        with pytest.raises(ConfigError, match=f"^{re.escape(result)}$"):
            table.get(key, kind)
    else:
        assert table.get(key, kind) == result and type(table.get(key, kind)) is type(result)


def test_an_absent_key_gets_the_records_default_or_the_one_given() -> None:
    table = RecordTable(values={}, path="outer", record=_Outer, source="f.toml")
    assert table.get("ratio", float) == 0.5 and table.get("ratio", float, default=0.9) == 0.9
    assert table.raw("weights") == {} and table.nested("inner", _Inner).get("depth", int) == 2
    with pytest.raises(ConfigError, match=re.escape("f.toml: outer.inner.depth must be a whole number")):
        RecordTable(values={"inner": {"depth": "2"}}, path="outer", record=_Outer, source="f.toml").nested(
            "inner", _Inner
        ).get("depth", int)


@pytest.mark.parametrize(
    ("table", "key", "value", "said"),
    [
        ("study", "wall_time_s", 0, "study.wall_time_s must be > 0 seconds (leave it out for no time limit)."),
        ("study", "wall_time_s", -60, "study.wall_time_s must be > 0 seconds (leave it out for no time limit)."),
        ("server", "ready_path", "health", 'server.ready_path must be a URL path starting with "/"'),
        ("server", "ready_path", "", 'server.ready_path must be a URL path starting with "/"'),
        ("server", "ready_path", "/he alth", 'server.ready_path must be a URL path starting with "/"'),
    ],
)
def test_a_value_no_run_could_use_is_refused_in_one_line_naming_its_key(
    table: str, key: str, value: object, said: str
) -> None:
    data: dict = {"study": {"name": "s"}}
    data.setdefault(table, {})[key] = value
    with pytest.raises(ConfigError, match=f"^s\\.toml: {re.escape(said)}") as refused:
        parse_study_config(data, source="s.toml")
    assert "\n" not in str(refused.value)


def test_a_positive_wall_time_and_a_rooted_ready_path_are_kept() -> None:
    config = parse_study_config({"study": {"name": "s", "wall_time_s": 90}, "server": {"ready_path": "/v1/models"}})
    assert config.wall_time_s == 90.0 and config.server.ready_path == "/v1/models"


# -- context levels: by hand, with their shares, or from the user's own traffic -----------------


@pytest.mark.parametrize(
    ("measure", "said"),
    [
        ({"context": [8192], "context_shares": [0.3, 0.2]}, "measure.context_shares has 2 shares for 1 context levels"),
        ({"context_shares": [0.3]}, "measure.context_shares has 1 shares for 0 context levels"),
        ({"context": [8192, 16384], "context_shares": [0.5, -0.1]}, "measure.context_shares must be shares of 0 or"),
        ({"context": [8192, 16384], "context_shares": [0.7, 0.4]}, "measure.context_shares must be shares of 0 or"),
        ({"context": [8192], "context_shares": ["a"]}, "measure.context_shares must be a list of shares"),
        ({"context": [8192], "context_shares": [0.3], "context_weight": 0.3}, "measure.context_weight and"),
        ({"context_from": "mine.jsonl", "context": [8192]}, "measure.context_from gives the context levels"),
        ({"context_from": "mine.jsonl", "context_weight": 0.2}, "leave out measure.context_weight"),
        ({"context_from": "mine.jsonl", "context_shares": []}, "leave out measure.context_shares"),
        ({"context_from": 3}, "measure.context_from must be"),
    ],
)  # fmt: skip
def test_context_shares_and_context_from_are_refused_in_one_line(measure: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=f"^s\\.toml: .*{re.escape(said)}") as refused:
        parse_study_config({"study": {"name": "s"}, "measure": measure}, source="s.toml")
    assert "\n" not in str(refused.value)


def test_context_shares_and_context_from_are_kept_as_written() -> None:
    measure = {"context": [8192, 16384], "context_shares": [0.3, 0.7]}
    config = parse_study_config({"study": {"name": "s"}, "measure": measure})
    assert config.measure.context_shares == (0.3, 0.7) and config.measure.context_from is None
    config = parse_study_config({"study": {"name": "s"}, "measure": {"context_from": "traffic/results.json"}})
    assert config.measure.context_from == "traffic/results.json" and config.measure.context == ()
