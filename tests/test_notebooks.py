"""The example notebooks (docs/notebooks) run top to bottom on CPU, offline, and are stored without outputs.

Each notebook checks its own results with asserts (losses fall, resumed runs continue at the right step, sharded
populations equal the single-device one), so executing it is the test. Each runs in a fresh kernel in its own
temporary directory, where its tokenizers, workdirs and checkpoints go.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "docs" / "notebooks").glob("*.ipynb"))
PLOTS = {"01_quick_start.ipynb": 0, "02_looking_inside.ipynb": 3, "03_many_models.ipynb": 1,
         "04_pretraining.ipynb": 1}


def test_the_four_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == sorted(PLOTS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    # The kernel is a fresh process: it must import this checkout's bertjax and see no accelerator.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the failing cell and traceback, on any error
    images = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
              if "image/png" in output.get("data", {})]
    assert len(images) >= PLOTS[path.name], f"{path.name} drew {len(images)} plots"
