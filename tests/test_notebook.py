"""notebooks/study-analysis.ipynb: committed clean, and runs top to bottom on a fresh emulator study."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

from specsweep.config import parse_study_config
from specsweep.report.study_report import snippet_for
from specsweep.tuning.stored import analyze_stored_study, load_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

from .builders import emulator_study

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "study-analysis.ipynb"
KERNEL = "specsweep-notebook-test"

# Four starts of a fast emulator (no startup wait, time scale 200), two levels so the
# notebook has a step-time line and a recommendation per concurrency: about 20 s.
STUDY = emulator_study(
    "notebook", seed=5151, k=(1, 3), workloads={"technical": 1.0}, concurrency=(1, 2), requests=3, max_tokens=100,
    objective={"concurrency": 1},
)  # fmt: skip


def test_notebook_is_committed_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_runs_against_a_fresh_emulator_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    config = parse_study_config(STUDY)
    paths = study_paths(config, tmp_path / "studies")
    StudyRunner(config, paths).run()
    analysis = analyze_stored_study(load_stored_study(paths.folder)).analysis

    # A kernel spec that starts this interpreter (the venv's), found ahead of any user's python3 spec.
    kernels = tmp_path / "jupyter"
    write_kernel_spec(kernels / "kernels" / KERNEL)
    assert json.loads((kernels / "kernels" / KERNEL / "kernel.json").read_text())["argv"][0] == sys.executable
    monkeypatch.setenv("JUPYTER_PATH", str(kernels))
    monkeypatch.setenv("SPECSWEEP_STUDY", str(paths.folder))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, kernel_name=KERNEL, timeout=120, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    for rec in analysis.recommendations:
        assert (
            f"{rec.workload} at concurrency {rec.concurrency}: recommended k={rec.choice.num_speculative_tokens} "
            in printed
        ), printed
    assert snippet_for(analysis, "technical", "vllm") in printed
    markdown = "".join(o.data.get("text/markdown", "") for o in outputs if o.output_type == "display_data")
    assert "| geometric |" in markdown and "extrapolated (past the searched range)" in markdown
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) == 4  # E(k), acceptance decay, step time, rate against k
    assert time.monotonic() - started < 90
