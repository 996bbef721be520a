"""dataflow gives Ray Data 2.60's answers to the programs of ``ray_answers.py``: the same values,
Python and numpy types, dtypes and shapes of rows, batches and torch tensors, on both execution
modes. Ray's answers were pinned by running the same cases on Ray (``ray_answers_2_60.json``)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import dataflow

_spec = importlib.util.spec_from_file_location("ray_answers", os.path.join(os.path.dirname(__file__), "ray_answers.py"))
assert _spec is not None and _spec.loader is not None
ray_answers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ray_answers)

with open(ray_answers.PINNED) as _f:
    PINNED = json.load(_f)["answers"]


def _same(name: str, ray: object, ours: object) -> bool:
    """Equal; where Ray leaves the order of rows open (all but sorts), equal as multisets."""
    if ray == ours:
        return True
    if "sort" in name or not (isinstance(ray, list) and isinstance(ours, list)):
        return False
    return sorted(json.dumps(r, sort_keys=True) for r in ray) == sorted(json.dumps(r, sort_keys=True) for r in ours)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")  # (torch says so on Ray too)
@pytest.mark.parametrize("group", sorted(ray_answers.GROUPS))
def test_answers_are_ray_datas(mode, group, tmp_path):
    if group == "torch":
        pytest.importorskip("torch")
    folders = iter(range(10**6))

    def tmp() -> str:
        folder = tmp_path / str(next(folders))
        folder.mkdir()
        return str(folder)

    thunks = ray_answers.GROUPS[group](dataflow, tmp)
    assert thunks, group
    differ = {}
    for name, thunk in thunks.items():
        key = f"{group}.{name}"
        ours = ray_answers.answer(thunk)
        if "value" not in ours or not _same(key, PINNED[key]["value"], ours["value"]):
            differ[key] = (PINNED[key], ours)
    assert not differ, "\n".join(f"{k}:\n  Ray:      {json.dumps(r)[:600]}\n  dataflow: {json.dumps(o)[:600]}"
                                 for k, (r, o) in differ.items())
