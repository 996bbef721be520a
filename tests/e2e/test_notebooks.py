"""The notebooks run top to bottom in a real Jupyter kernel, as a reader would run them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name[:2] for p in NOTEBOOKS} >= {"01", "02", "03", "04", "05"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, "commit notebooks without outputs"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel(path, tmp_path, monkeypatch):
    # the kernel inherits this process's environment: the checkout on its path, logs in tmp_path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DATAFLOW_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("DATAFLOW_PROGRESS", "off")
    nb = nbformat.read(path, as_version=4)
    # a failing cell raises CellExecutionError naming the cell and carrying the kernel's traceback
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs if out["output_type"] == "stream"
    )
    if path.name.startswith("02_journey"):
        assert "Optimized Plan" in printed and "Operator 0" in printed
