"""Progress as text, from plain snapshots: operator lines, estimates, rates, modes, renderers."""

from __future__ import annotations

import io
import logging

import pytest

from dataflow import logs, progress
from dataflow.context import DataContext
from dataflow.progress import (
    LogRenderer,
    NotebookRenderer,
    Rates,
    RichRenderer,
    View,
    frame_lines,
    headline_text,
    operator_text,
    resolve_mode,
    summary_text,
)
from engine.stats import ExecutionProgress, OpProgress


def op(index: int = 0, name: str = "ReadRange", upstream: tuple[int, ...] = (), **changes) -> OpProgress:
    fields = dict(
        index=index, name=name, upstream=upstream, runs_tasks=True, rows_out=0, bytes_out=0, tasks_done=0,
        tasks_running=0, tasks_queued=0, actors=0, held_bytes=0, waiting=None, inputs_done=True, completed=False,
    )
    fields.update(changes)
    return OpProgress(**fields)


def execution(*ops: OpProgress, state: str = "running", elapsed: float = 2.0, error: str | None = None) -> ExecutionProgress:
    return ExecutionProgress(7, elapsed, state, tuple(ops), error)


def test_an_operator_line_says_what_it_did_runs_holds_and_waits_for():
    line = operator_text(
        op(rows_out=12_000, bytes_out=3 << 20, tasks_done=3, tasks_running=2, tasks_queued=5, actors=2,
           held_bytes=1 << 20, waiting="no free worker", tasks_retried=1),
        (4000.0, 1 << 20),
    )
    assert line == (
        "12,000 rows, 3.0 MiB; 4,000 rows/s, 1.0 MiB/s; 3 tasks done, 2 running, 5 queued; 2 actors; "
        "1.0 MiB held; 1 retried; waiting: no free worker"
    )
    done = operator_text(op(rows_out=10, bytes_out=80, tasks_done=1, completed=True), (5.0, 40.0))
    assert done == "10 rows, 80 B; 1 tasks done; done"
    limit = operator_text(op(name="Limit[5]", runs_tasks=False, rows_out=5, bytes_out=40), None)
    assert limit == "5 rows, 40 B"


def test_the_estimate_scales_an_operator_by_the_share_of_its_inputs_arrived():
    read = op(0, tasks_done=5, tasks_queued=5)  # all its input listed: half done
    mapped = op(1, "Map(f)", (0,), tasks_done=4, tasks_running=1, inputs_done=False)  # caught up with what came
    p = execution(read, mapped)
    assert p.fractions() == pytest.approx([0.5, 0.4])
    assert p.fraction() == pytest.approx(0.4)
    assert execution(read, mapped, state="finished").fraction() == 1.0
    nothing_yet = op(1, "Map(f)", (0,), inputs_done=False)
    assert execution(op(0, completed=True), nothing_yet).fractions() == [1.0, 0.0]
    union = op(2, "Union", (0, 1), runs_tasks=False, inputs_done=False)
    assert execution(op(0, completed=True), op(1, "Read2", tasks_done=1, tasks_queued=3), union).fraction() == 0.25


def test_headline_summary_and_frame():
    p = execution(op(0, rows_out=500, tasks_done=1, tasks_queued=1), op(1, "Map(f)", (0,), rows_out=400, bytes_out=3200,
                  tasks_done=1, inputs_done=False))
    view = View("train #7", p, ((100.0, 800.0), (90.0, 720.0)))
    assert headline_text(view) == "50%; 400 rows out; 90 rows/s; 2.0 s"  # Map caught up with a half-done read
    assert frame_lines(view) == [
        "train #7: 50%; 400 rows out; 90 rows/s; 2.0 s",
        "  ReadRange: 500 rows, 0 B; 100 rows/s, 800 B/s; 1 tasks done, 0 running, 1 queued",
        "  Map(f): 400 rows, 3.1 KiB; 90 rows/s, 720 B/s; 1 tasks done, 0 running, 0 queued",
    ]
    assert frame_lines(View("train #7", p, (), operators=False)) == ["train #7: 50%; 400 rows out; 2.0 s"]
    finished = execution(op(0, tasks_done=2, tasks_retried=1), op(1, "Map(f)", (0,), rows_out=400, bytes_out=3200,
                         tasks_done=2), state="finished", elapsed=3.25)
    assert summary_text("train #7", finished) == (
        "train #7 finished in 3.25 s: 400 rows (3.1 KiB) out, 4 tasks, 1 run again after worker deaths"
    )
    failed = execution(op(0), state="failed", error="UserCodeError: boom")
    assert summary_text("dataset #7", failed) == "dataset #7 failed after 2.00 s: 0 rows (0 B) out, 0 tasks; UserCodeError: boom"
    assert "stopped by its consumer" in summary_text("d", execution(op(0), state="cancelled"))


def test_rates_are_over_the_last_window():
    rates = Rates(window_s=2.0)
    assert rates.per_op() == []
    for t, rows in [(0.0, 0), (1.0, 100), (2.0, 300), (3.0, 600), (4.0, 1000)]:
        rates.add(t, execution(op(rows_out=rows, bytes_out=rows * 8)))
    assert rates.per_op() == [(350.0, 2800.0)]  # from t=2 to t=4


@pytest.mark.parametrize(
    ("mode", "terminal", "notebook", "has_rich", "expected"),
    [
        ("auto", True, False, True, "rich"),
        ("auto", False, False, True, "log"),
        ("auto", True, False, False, "log"),
        ("auto", False, True, True, "notebook"),
        ("rich", False, False, True, "rich"),
        ("rich", False, True, True, "notebook"),
        ("log", True, False, True, "log"),
        ("off", True, True, True, None),
    ],
)
def test_the_mode_picks_the_view(mode, terminal, notebook, has_rich, expected):
    assert resolve_mode(mode, terminal=terminal, notebook=notebook, rich_available=has_rich) == expected


def test_progress_settings():
    ctx = DataContext()
    assert ctx.progress_mode == "auto" and ctx.enable_progress_bars  # Ray's default: on
    ctx.enable_progress_bars = False
    assert ctx.progress_mode == "off"
    ctx.progress_mode = "log"
    ctx.enable_progress_bars = True
    assert ctx.progress_mode == "log"  # True keeps a chosen mode
    with pytest.raises(ValueError, match="must be one of"):
        ctx.progress_mode = "bars"
    with pytest.raises(ValueError, match="must be one of"):
        resolve_mode("bars", terminal=True, notebook=False, rich_available=True)


def test_an_unknown_progress_mode_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("DATAFLOW_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="DATAFLOW_PROGRESS"):
        DataContext()
    monkeypatch.setenv("DATAFLOW_PROGRESS", "off")
    assert DataContext().enable_progress_bars is False


def test_log_lines_come_once_per_interval(caplog):
    renderer = LogRenderer(interval_s=10.0)
    renderer.add(7)
    with caplog.at_level(logging.INFO, logger="dataflow.progress"):
        for elapsed in (1.0, 5.0, 10.5, 12.0, 19.0, 20.6):
            renderer.update([View("d #7", execution(op(rows_out=5, tasks_queued=1), elapsed=elapsed))])
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "d #7: 0%; 5 rows out; 10.5 s", "d #7 ReadRange: 5 rows, 0 B; 0 tasks done, 0 running, 1 queued",
        "d #7: 0%; 5 rows out; 20.6 s", "d #7 ReadRange: 5 rows, 0 B; 0 tasks done, 0 running, 1 queued",
    ]
    assert all(getattr(r, "console", False) for r in caplog.records)


class FakeDisplay:
    def __init__(self) -> None:
        self.shown: list[str] = []

    def __call__(self, frame, display_id: bool = False):
        assert display_id
        self.shown.append(frame.text)
        index = len(self.shown) - 1
        display = self

        class Handle:
            def update(self, new) -> None:
                display.shown[index] = new.text

        return Handle()


def test_the_notebook_view_updates_one_output_per_execution_in_place():
    display = FakeDisplay()
    renderer = NotebookRenderer(display)
    renderer.add(7)
    assert display.shown == [""]
    renderer.update([View("d #7", execution(op(rows_out=5), elapsed=0.1))])
    assert display.shown == [""]  # too young to show
    renderer.update([View("d #7", execution(op(rows_out=5, tasks_queued=1), elapsed=1.0))])
    assert display.shown[0].startswith("d #7: 0%; 5 rows out") and "ReadRange" in display.shown[0]
    renderer.finished(View("d #7", execution(op(), state="finished")), "d #7 finished in 1.00 s")
    assert display.shown == ["d #7 finished in 1.00 s"]
    assert "&lt;" in progress.TextFrame("Map(<lambda>)")._repr_html_()


def test_the_rich_view_draws_bars_and_leaves_the_summary():
    from rich.console import Console

    out = io.StringIO()
    renderer = RichRenderer(Console(file=out, force_terminal=True, width=150, color_system=None))
    p = execution(op(rows_out=500, tasks_done=1, tasks_queued=1, waiting="output budget full"), elapsed=1.0)
    renderer.update([View("d #7", p)])
    renderer.update([View("d #7", p)])
    renderer.finished(View("d #7", execution(op(), state="finished")), "d #7 finished in 1.00 s")
    renderer.update([])
    renderer.close()
    text = out.getvalue()
    assert "d #7" in text and "50%" in text and "waiting: output budget full" in text and "━" in text
    assert "d #7 finished in 1.00 s" in text


def test_the_console_fallback_prints_only_warnings_and_progress_when_logging_is_not_configured(monkeypatch, capsys):
    handler = logs.ConsoleFallback()

    def record(level: int, console: bool) -> logging.LogRecord:
        rec = logging.LogRecord("dataflow.execution", level, __file__, 1, "line %d", (level,), None)
        if console:
            rec.console = True
        return rec

    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    for level, console in [(logging.INFO, False), (logging.INFO, True), (logging.WARNING, False)]:
        handler.emit(record(level, console))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].endswith("line 20") and err[1] == "line 30"
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    handler.emit(record(logging.WARNING, False))
    assert capsys.readouterr().err == ""  # the program's handlers show it
