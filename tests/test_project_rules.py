"""Project-wide rules checked mechanically: the layer contracts and a clean lint."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)


def installed_tool(name: str) -> str:
    """A console script of the test environment: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    return found or pytest.fail(f"{name} is not installed (pip install -e '.[test]')")


def test_every_test_file_a_ci_script_names_exists() -> None:
    """A script that names a deleted test file runs no tests and fails CI with no reason given."""
    for script in sorted((ROOT / "scripts").iterdir()):
        named = re.findall(r"tests/[\w/]+\.py", script.read_text())
        missing = [path for path in named if not (ROOT / path).is_file()]
        assert not missing, f"{script.name} names test files that do not exist: {missing}"


def test_the_newcomer_check_looks_for_what_the_readme_shows_the_first_command_print() -> None:
    """scripts/check-newcomer greps the first command's output for a recommendation and a paste:
    each of its patterns must match the output the README shows, or CI fails a working command."""
    script = (ROOT / "scripts" / "check-newcomer").read_text()
    patterns = re.findall(r'grep -q (?:-- )?"([^"]+)" "\$work/out.txt"', script)
    assert len(patterns) == 2, patterns
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("```", 4)[3]  # the block after the two commands: what a study prints
    for pattern in patterns:
        assert re.search(pattern.replace("{", r"\{"), shown, re.MULTILINE), f"{pattern!r} is not in the README's output"


def test_layer_contracts_hold() -> None:
    """analysis/, measurement/ and engines/ import no I/O library; layers import downwards only."""
    result = run(installed_tool("lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "broken" not in result.stdout.split("Contracts:")[-1].replace("0 broken", "")


def test_only_runtime_and_cli_ask_whether_the_server_is_the_emulator() -> None:
    """What a study counts of a start (its boot, clock, max_num_seqs) comes from the server runtime/
    started; cli/ checks the emulator's profile up front. server_config.py validates the study file's
    [server] keys."""
    package = ROOT / "src" / "specsweep"
    allowed = {package / "runtime", package / "cli"}
    asking = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(package.rglob("*.py"))
        if not any(folder in path.parents for folder in allowed) and path != package / "server_config.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"""\bmode [!=]= ["']emulator["']""", line)
    ]
    assert asking == []


def test_ruff_is_clean() -> None:
    result = run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout[-3000:]
    result = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout[-3000:]


def test_every_command_has_help() -> None:
    """Every registered command answers --help with its description and options."""
    from specsweep.cli import app

    commands = [c.name for c in app.registered_commands]
    assert {"study", "measure", "emulate", "workloads"} <= set(commands)
    result = run(sys.executable, "-m", "specsweep", "--help")
    assert result.returncode == 0
    for command in commands:
        assert command in result.stdout
        sub = run(sys.executable, "-m", "specsweep", command, "--help")
        assert sub.returncode == 0 and "--help" in sub.stdout and len(sub.stdout) > 300, command


def test_deptry_finds_every_import_declared_and_every_dependency_used() -> None:
    """deptry reads src/specsweep's imports against pyproject.toml (configured under [tool.deptry])."""
    result = run(installed_tool("deptry"), "src")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _module_level_imports(path: Path) -> set[str]:
    """Top-level package names imported when ``path`` is imported (not inside functions)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_what_every_command_imports_is_a_core_dependency() -> None:
    """A module-level import of a third-party package must be satisfied by ``pip install specsweep``.

    deptry counts extras as declared; this rule is stricter: an extra's package may only be
    imported lazily, inside the function that needs it (with a one-line error naming the extra).
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in project["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    offenders = []
    for path in sorted((ROOT / "src" / "specsweep").rglob("*.py")):
        for name in _module_level_imports(path) - set(sys.stdlib_module_names) - {"specsweep", "__future__"}:
            owners = {d.lower().replace("_", "-") for d in distributions.get(name, [name])}
            if not owners & core:
                offenders.append(f"{path.relative_to(ROOT)} imports {name} ({', '.join(sorted(owners))})")
    assert not offenders, "not core dependencies of pyproject.toml:\n" + "\n".join(offenders)


# The repository's top level, as docs/architecture.md names it: anything else tracked there
# is a stray output, such as a report written to the root and committed with a change.
LAYOUT = {
    ".ci", ".gitignore", "README.md", "pyproject.toml",
    "bench", "docs", "notebooks", "scripts", "src", "studies", "tests", "workloads",
}  # fmt: skip


def test_the_top_level_tracks_the_layout_and_nothing_else() -> None:
    listed = run("git", "ls-files")
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    top = {path.split("/", 1)[0] for path in listed.stdout.splitlines()}
    assert top - LAYOUT == set(), "tracked at the top level but not part of the layout"
    assert LAYOUT - top == set(), "part of the layout but not tracked"
