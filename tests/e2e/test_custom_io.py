"""The README's "Custom sources and sinks" example, run exactly as written, on both modes."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

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
