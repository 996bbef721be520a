"""The notebooks run top to bottom (their code cells, in order, in one namespace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, capsys):
    namespace: dict = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), "commit notebooks without outputs"
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    if path.name.startswith("02_journey"):
        printed = capsys.readouterr().out
        assert "Optimized Plan" in printed and "Operator 0" in printed
