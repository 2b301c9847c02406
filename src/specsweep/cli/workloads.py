"""``specsweep workloads``: what workloads are available, a check of your own file, and an import
of prompts in the formats you already have (ShareGPT, OpenAI chat JSON Lines, plain text)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from specsweep.cli.context_from import shares_text
from specsweep.context_prompts import own_tokens
from specsweep.context_shares import length_summary, prompt_lengths, shares_from_lengths
from specsweep.errors import ConfigError
from specsweep.names import check_name, file_part
from specsweep.runtime.store import write_atomic
from specsweep.workload import Workload, bundled_workload_names, load_workload, workload_jsonl

# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = (
    "specsweep workloads",
    "specsweep workloads import studies/openings.jsonl --out /tmp",
)


def workloads(
    path: list[str] = typer.Argument(
        None, metavar="[FILE]... | import FILE", help="Workload files to check; none: list the bundled ones."
    ),
    out: Path = typer.Option(None, help="With import: the folder to write NAME.jsonl in (default: here)."),
    name: str = typer.Option(None, help="With import: the workload's name (default: the file's)."),
) -> None:
    """List the bundled workloads, check your own workload files, or import one.

    specsweep's format: one JSON object per line, {"prompt": "..."} or {"messages": [...]}, with
    optional "id" and "subcategory". Files in other formats are read as they are: ShareGPT
    ("conversations" with human/gpt turns; a JSON array or JSON Lines), OpenAI chat JSON Lines
    ("messages", answers after the last user turn left out) and plain text (.txt: one prompt per
    paragraph). "specsweep workloads import FILE" writes such a file in specsweep's format. Pass
    the name or the path to --workload of other commands (docs/workloads.md).
    """
    console = Console()
    if path and path[0] == "import":
        if len(path) != 2:
            raise ConfigError("workloads import takes one file: specsweep workloads import FILE [--out DIR].")
        workload = load_workload(path[1])
        stem = check_name(name, what="--name") if name is not None else file_part(workload.name)
        target = (out or Path(".")) / f"{stem}.jsonl"
        if target.resolve() == Path(path[1]).resolve():
            raise ConfigError(f"{target} is the file being imported; pass --out DIR or --name NAME.")
        write_atomic(target, workload_jsonl(workload))
        _print_table(console, [workload], title=None)
        for note in workload.notes:
            console.print(f"note: {note}")
        console.print(
            f"wrote {target} ({len(workload.prompts)} prompts, read as {workload.format}); use --workload {target}"
        )
        _print_lengths(console, workload, target)
        return
    if out is not None or name is not None:
        raise ConfigError("--out and --name go with import: specsweep workloads import FILE [--out DIR].")
    names = path or bundled_workload_names()
    loaded = [load_workload(n) for n in names]
    _print_table(console, loaded, title="workloads" if not path else None)
    for workload in loaded:
        for note in workload.notes:
            console.print(f"note: {workload.name}: {note}")


def _print_table(console: Console, loaded, *, title: str | None) -> None:
    table = Table(title=title)
    for column in ("workload", "prompts", "subcategories", "format", "source"):
        table.add_column(column)
    for workload in loaded:
        subcategories = ", ".join(f"{tag or '-'} {count}" for tag, count in sorted(workload.subcategories().items()))
        table.add_row(workload.name, str(len(workload.prompts)), subcategories, workload.format, workload.source)
    console.print(table)


def _print_lengths(console: Console, workload: Workload, target: Path) -> None:
    """The imported prompts' lengths in one line; where they are long enough to make context levels
    beside the bundled workloads' prompts, the study that measures at their mix."""
    lengths = prompt_lengths(workload)
    summary = length_summary(lengths)
    if summary is None:
        return
    p50, p90, longest = summary
    console.print(f"prompt lengths: p50 {p50:,.0f}, p90 {p90:,.0f}, max {longest:,.0f} tokens", highlight=False)
    bundled = [own_tokens(load_workload(name)) for name in bundled_workload_names()]
    shares = shares_from_lengths(lengths, sum(bundled) / len(bundled))
    if shares.levels:
        console.print(
            f"measure at this mix ({shares_text(shares)}): specsweep study --context-from {target}",
            highlight=False,
        )
