"""``serialize_lineage`` / ``deserialize_lineage``: a plan saved in one process runs in another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow import Dataset

ROOT = Path(__file__).resolve().parents[2]


def test_a_read_plan_saved_here_runs_in_a_fresh_process(mode, tmp_path):
    for i in range(3):
        pq.write_table(pa.table({"x": list(range(i * 100, i * 100 + 100))}), tmp_path / f"{i}.parquet")
    offset = 7  # captured by value with the function
    ds = (dataflow.read_parquet(str(tmp_path)).map(lambda r: {"x": r["x"], "y": r["x"] + offset})
          .filter(expr="x % 3 == 0").sort("y", descending=True))
    ds.set_name("saved")
    assert ds.has_serializable_lineage()
    expected = ds.take_all()  # ran once here: what is saved is the plan, not the stats
    saved = tmp_path / "lineage.bin"
    saved.write_bytes(ds.serialize_lineage())
    code = (
        "import sys, dataflow; from dataflow import Dataset\n"
        f"ds = Dataset.deserialize_lineage(open({str(saved)!r}, 'rb').read())\n"
        "print(ds.name, [r['y'] for r in ds.take_all()])\n"
        "dataflow.shutdown()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"saved {[r['y'] for r in expected]}"
    assert [r["y"] for r in Dataset.deserialize_lineage(saved.read_bytes()).take_all()] == [r["y"] for r in expected]


def test_blocks_held_here_cannot_be_saved(mode):
    assert dataflow.range(10).map(lambda r: r).has_serializable_lineage()
    held = [dataflow.from_items([{"a": 1}]), dataflow.range(10).materialize(),
            dataflow.range(10).union(dataflow.from_items([{"id": 3}]))]
    for ds in held:
        assert not ds.has_serializable_lineage()
        with pytest.raises(ValueError, match="blocks held in this process"):
            ds.serialize_lineage()
    with pytest.raises(TypeError, match="not a Dataset"):
        Dataset.deserialize_lineage(__import__("pickle").dumps({"a": 1}))
