"""``specsweep rig``: write a study's rig file (its step-cost model) again, and show what it holds."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from specsweep.cli.rig_printers import print_rig
from specsweep.rigs.file import RIG_FILE, write_rig
from specsweep.rigs.stored import build_rig
from specsweep.tuning.stored import load_stored_study

# Command lines that --help shows as examples (tests/test_cli_help.py parses each).
EXAMPLES = ("specsweep rig studies/emulator-technical",)


def rig(
    study_folder: Path = typer.Argument(..., metavar="FOLDER", help="The study's folder (studies/NAME)."),
    out: Path = typer.Option(None, "--out", help="Folder to write rig.json in (default: FOLDER)."),
    output: Path = typer.Option(None, "--output", "-o", hidden=True, help="Old spelling: the rig file's path."),
    storage: str = typer.Option(None, help="Optuna storage URL, when the study is not in the folder's study.db."),
    study_name: str = typer.Option(None, help="Study name in --storage (default: the folder's name)."),
) -> None:
    """Write the rig file of a stored study: step time against k and concurrency per drafter,
    with the request shape and the engine, version, model and flags it was measured on.

    specsweep measure --rig FILE and specsweep study --rig FILE reuse it (docs/rigs.md).
    """
    study = load_stored_study(study_folder, storage=storage, name=study_name)
    built = build_rig(study, study_folder)
    path = output or (out or study_folder) / RIG_FILE
    write_rig(path, built)
    console = Console(soft_wrap=True)
    print_rig(console, built)
    console.print(f"wrote {path}")
