"""``specsweep workloads``: what workloads are available, and a check of your own file."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from specsweep.workload import bundled_workload_names, load_workload


def workloads(
    path: list[str] = typer.Argument(None, help="Workload files to check (JSONL); none: list the bundled ones."),
) -> None:
    """List the bundled workloads, or check your own JSONL workload files.

    Format: one JSON object per line, {"prompt": "..."} or {"messages": [...]}, with optional
    "id" and "subcategory". Pass the name or the path to --workload of other commands.
    """
    names = path or bundled_workload_names()
    table = Table(title="workloads" if not path else None)
    for column in ("workload", "prompts", "subcategories", "source"):
        table.add_column(column)
    for name in names:
        workload = load_workload(name)
        subcategories = ", ".join(f"{tag or '-'} {count}" for tag, count in sorted(workload.subcategories().items()))
        table.add_row(workload.name, str(len(workload.prompts)), subcategories, workload.source)
    Console().print(table)
