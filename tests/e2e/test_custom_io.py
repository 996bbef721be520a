"""The README's "Custom sources and sinks" example, run exactly as written, on both modes."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import dataflow

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The first Python block of the README section "Custom sources and sinks"."""
    text = README.read_text()
    section = text.split("## Custom sources and sinks", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README section has no python example"
    return match.group(1)


def test_readme_example_runs_and_prints_what_it_says(mode, monkeypatch):
    executed = []
    original = dataflow.Dataset._execute

    def recording(self, *args, **kwargs):
        executed.append(kwargs.get("output"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(dataflow.Dataset, "_execute", recording)
    out = io.StringIO()
    namespace: dict[str, object] = {"__name__": "readme_example"}
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example(), "README.md (Custom sources and sinks)", "exec"), namespace)
    assert out.getvalue().split() == ["10000", str(sum(i * i for i in range(5000)))]
    assert len(executed) == 1  # the write; count() came from count_rows()


def test_example_source_reads_in_several_tasks(mode):
    namespace: dict[str, object] = {"__name__": "readme_example"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(readme_example(), "README.md (Custom sources and sinks)", "exec"), namespace)
    source = namespace["SquaresSource"](5000)  # type: ignore[operator]
    assert len(source.get_read_tasks(5)) == 5  # type: ignore[attr-defined]
    rows = dataflow.read_datasource(source, override_num_blocks=5).take_all()
    assert [r["n"] for r in sorted(rows, key=lambda r: r["n"])] == list(range(5000))
    assert all(r["square"] == r["n"] ** 2 for r in rows)


def test_a_connector_written_for_ray_2_60_runs_with_its_imports_changed(mode):
    """Ray's docs' shapes: exec_stats in BlockMetadata, schema= in ReadTask, pandas blocks,
    on_write_start(schema), a typed Datasink[T], a WriteResult in on_write_complete, and
    on_write_failed when the commit raises."""
    import pandas as pd
    import pyarrow as pa

    from dataflow.block import BlockAccessor, BlockMetadata
    from dataflow.datasource import Datasink, Datasource, ReadTask, WriteResult

    class _FramesDatasource(Datasource):
        def get_read_tasks(self, parallelism, per_task_row_limit=None):
            schema = pa.schema([("x", pa.int64())])
            meta = BlockMetadata(num_rows=5, size_bytes=40, input_files=None, exec_stats=None)
            return [ReadTask(lambda i=i: [pd.DataFrame({"x": [i] * 5})], meta, schema=schema,
                             per_task_row_limit=per_task_row_limit) for i in range(3)]

        def estimate_inmemory_data_size(self):
            return 120

    events: list = []

    class _RowsDatasink(Datasink[dict]):
        def on_write_start(self, schema):
            events.append(("start", schema))

        def write(self, blocks, ctx):
            return {"rows": sum(BlockAccessor.for_block(b).to_pandas().shape[0] for b in blocks)}

        def on_write_complete(self, write_result: WriteResult[dict]):
            events.append(("complete", write_result.num_rows, sum(r["rows"] for r in write_result.write_returns)))

        def on_write_failed(self, error):
            events.append(("failed", type(error).__name__))

    source = _FramesDatasource()
    assert source.get_name() == "Frames" and source.supports_distributed_reads  # Ray strips the "_"
    ds = dataflow.read_datasource(source)
    assert sorted(r["x"] for r in ds.take_all()) == [0] * 5 + [1] * 5 + [2] * 5
    dataflow.from_items([{"x": i} for i in range(7)]).write_datasink(_RowsDatasink())
    assert events == [("start", pa.schema([("x", pa.int64())])), ("complete", 7, 7)]
    assert _RowsDatasink().get_name() == "Rows" and _RowsDatasink().supports_distributed_writes

    class _FailingCommit(_RowsDatasink):
        def on_write_complete(self, write_result):
            raise RuntimeError("commit failed")

    events.clear()
    with pytest.raises(RuntimeError, match="commit failed"):
        dataflow.range(3).map(lambda r: {"x": r["id"]}).write_datasink(_FailingCommit())
    assert events == [("start", None), ("failed", "RuntimeError")]  # the schema needs a run: None
