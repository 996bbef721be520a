"""Progress while pipelines run: rich bars on a pseudo-terminal, log lines otherwise, the log
file, and ``stats(format="dict")``."""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dataflow
from dataflow import progress

ROOT = Path(__file__).resolve().parents[2]

SQUARES = textwrap.dedent(
    """
    import time, dataflow

    def slow(batch):
        time.sleep(0.1)
        return batch

    ds = dataflow.range(4000, override_num_blocks=8).map_batches(slow)
    ds.set_name("squares")
    print("rows", ds.count(), flush=True)
    """
)
ENDINGS = SQUARES + textwrap.dedent(
    """
    def boom(batch):
        time.sleep(0.6)
        raise ValueError("boom")

    try:
        dataflow.range(10, override_num_blocks=1).map_batches(boom).take_all()
    except ValueError:
        print("caught", flush=True)
    ds = dataflow.range(40_000, override_num_blocks=80).map_batches(slow, batch_size=5000)
    for i, _ in enumerate(ds.iter_batches(batch_size=100)):
        time.sleep(0.1)
        if i == 8:
            break
    time.sleep(0.6)  # the progress thread notices the cancellation (at exit it would say "still running")
    print("done", flush=True)
    """
)
"""The scripts run in the in-process mode: the same progress, no worker processes to start."""


def _run_on_a_terminal(script: str, env: dict[str, str], timeout: float = 90.0) -> tuple[int, str]:
    """Run ``script`` with a pseudo-terminal as its stdin, stdout and stderr: (exit code, output)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, close_fds=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "DATAFLOW_EXECUTION_MODE": "local", **env},
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal (EIO)
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out.decode(errors="replace")


def test_rich_bars_on_a_terminal(tmp_path):
    code, out = _run_on_a_terminal(ENDINGS, {"DATAFLOW_PROGRESS": "rich", "DATAFLOW_LOG_DIR": str(tmp_path)})
    assert code == 0, out
    assert "rows 4000" in out and "caught" in out and "done" in out
    assert "squares #" in out and "ReadRange->MapBatches(slow)" in out and "rows/s" in out and "━" in out
    assert "\x1b[2K" in out  # redrawn in place
    # every execution leaves one summary line however it ended, and the cursor comes back
    assert "finished in" in out and "failed after" in out and "MapBatches(boom)): boom" in out
    assert "was stopped by its consumer after" in out
    assert out.rstrip().endswith("\x1b[2K") or "\x1b[?25h" in out
    log = (tmp_path / "latest.log").read_text()
    assert "squares #" in log and "started: ReadRange->MapBatches(slow)" in log and "finished in" in log


def test_nothing_is_drawn_when_progress_is_off(tmp_path):
    code, out = _run_on_a_terminal(SQUARES, {"DATAFLOW_PROGRESS": "off", "DATAFLOW_LOG_DIR": str(tmp_path)})
    assert code == 0, out
    assert "━" not in out and "finished in" not in out and "rows 4000" in out
    assert "finished in" in (tmp_path / "latest.log").read_text()  # the log file still has it


def test_log_lines_when_not_a_terminal(tmp_path):
    """Redirected output (CI, nohup) gets plain lines, no escape codes, nothing for short jobs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATAFLOW_LOG_DIR": str(tmp_path), "DATAFLOW_EXECUTION_MODE": "local"}
    env.pop("DATAFLOW_PROGRESS", None)
    proc = subprocess.run([sys.executable, "-c", SQUARES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr
    summaries = [line for line in proc.stderr.splitlines() if "squares #" in line]
    assert len(summaries) == 1 and "finished in" in summaries[0]  # no bar, one line (10 s between lines)


LOG_INTERVAL_S = 0.1
"""Short enough that a job of a few tenths of a second logs lines, on 2 CPUs or on 6."""


@pytest.fixture
def log_progress():
    ctx = dataflow.DataContext.get_current()
    saved = (ctx.progress_mode, ctx.progress_log_interval_s, ctx.enable_operator_progress_bars)
    ctx.progress_mode, ctx.progress_log_interval_s = "log", LOG_INTERVAL_S
    yield ctx
    ctx.progress_mode, ctx.progress_log_interval_s, ctx.enable_operator_progress_bars = saved


def _sleepy(batch):
    time.sleep(0.1)
    return batch


def test_log_mode_lines_per_operator(mode, log_progress, caplog):
    with caplog.at_level(logging.INFO, logger="dataflow"):
        start = time.monotonic()
        ds = dataflow.range(1200, override_num_blocks=12).map_batches(_sleepy, batch_size=100).limit(1000)
        assert ds.count() == 1000
        elapsed = time.monotonic() - start
        _wait_until_ended()
    lines = [r.getMessage() for r in caplog.records if r.name == "dataflow.progress"]
    ops = [line for line in lines if "MapBatches(_sleepy):" in line]
    assert ops and all("rows" in line and "tasks done" in line for line in ops)
    assert any("Limit[1000]" in line for line in lines)
    heads = [line for line in lines if re.match(r"dataset #\d+: \d+%", line)]
    assert heads and len(heads) <= elapsed / LOG_INTERVAL_S + 2  # once per interval, no more
    ended = [r.getMessage() for r in caplog.records if r.name == "dataflow.execution"]
    assert any("started: " in line for line in ended) and any("finished in" in line and "1,000 rows" in line for line in ended)


def test_a_new_interval_applies_while_an_earlier_execution_is_still_followed(mode, log_progress, caplog):
    log_progress.progress_log_interval_s = 30.0
    earlier = dataflow.range(10_000, override_num_blocks=20).iter_batches(batch_size=10)
    next(earlier)  # started, and followed until it ends
    log_progress.progress_log_interval_s = LOG_INTERVAL_S
    with caplog.at_level(logging.INFO, logger="dataflow.progress"):
        assert dataflow.range(1200, override_num_blocks=12).map_batches(_sleepy, batch_size=100).count() == 1200
    earlier.close()
    _wait_until_ended()
    assert any("MapBatches(_sleepy):" in r.getMessage() for r in caplog.records if r.name == "dataflow.progress")


def test_only_the_execution_line_without_operator_lines(mode, log_progress, caplog):
    log_progress.enable_operator_progress_bars = False
    with caplog.at_level(logging.INFO, logger="dataflow.progress"):
        assert dataflow.range(1500, override_num_blocks=15).map_batches(_sleepy, batch_size=100).count() == 1500
        _wait_until_ended()
    lines = [r.getMessage() for r in caplog.records if r.name == "dataflow.progress"]
    assert lines and not any("MapBatches(_sleepy):" in line for line in lines)


def test_print_on_execution_start_false_leaves_out_the_start_line(mode, caplog):
    """Ray's ``print_on_execution_start``: False leaves out the line naming the operators when
    an execution starts; the line at its end stays."""
    ctx = dataflow.DataContext.get_current()
    try:
        for value in (True, False):
            ctx.print_on_execution_start = value
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="dataflow.execution"):
                assert dataflow.range(100).map_batches(lambda b: b).count() == 100
                _wait_until_ended()
            lines = [r.getMessage() for r in caplog.records if r.name == "dataflow.execution"]
            assert any("started: ReadRange" in line for line in lines) == value
            assert any("finished in" in line for line in lines)
    finally:
        ctx.print_on_execution_start = True
    other = ctx.copy()  # Ray's setting is kept: a UDF's error already is an instance of its own type here
    other.raise_original_map_exception = True
    assert other.raise_original_map_exception is True


@pytest.mark.parametrize("verbose", [False, True])
def test_execution_options_verbose_progress_decides_the_operator_lines(mode, log_progress, caplog, verbose):
    """Ray's ``execution_options.verbose_progress`` over the context's setting, either way."""
    log_progress.enable_operator_progress_bars = not verbose
    with dataflow.options(verbose_progress=verbose), caplog.at_level(logging.INFO, logger="dataflow.progress"):
        assert dataflow.range(1500, override_num_blocks=15).map_batches(_sleepy, batch_size=100).count() == 1500
        _wait_until_ended()
    lines = [r.getMessage() for r in caplog.records if r.name == "dataflow.progress"]
    assert lines and any("MapBatches(_sleepy):" in line for line in lines) == verbose


def test_a_failure_and_a_stopped_iterator_are_summarized(mode, caplog):
    def boom(batch):
        raise ValueError("no")

    with caplog.at_level(logging.INFO, logger="dataflow.execution"):
        with pytest.raises(ValueError, match="no"):
            dataflow.range(10).map_batches(boom).take_all()
        # 20 tasks of 0.1 s each: the run cannot have produced everything by the first batch
        sleepy = dataflow.range(10_000, override_num_blocks=20).map_batches(_sleepy)
        for _ in sleepy.iter_batches(batch_size=10):
            break
        _wait_until_ended()
    text = caplog.text
    assert "failed after" in text and "): no" in text
    assert "was stopped by its consumer" in text


def test_every_consuming_call_returns_after_its_summary(mode, tmp_path, caplog):
    """The summary is drawn in the caller's thread before the call returns (a notebook cell
    must end with it), not whenever the progress thread next wakes."""
    def ended() -> int:
        return sum("finished in" in r.getMessage() for r in caplog.records if r.name == "dataflow.execution")

    ds = dataflow.range(400, override_num_blocks=4).map_batches(lambda b: b)
    calls = [
        ds.count,
        ds.take_all,
        lambda: ds.materialize().count(),
        lambda: list(ds.iter_batches(batch_size=50)),
        ds.size_bytes,
        lambda: ds.write_parquet(str(tmp_path / "out")),
    ]
    with caplog.at_level(logging.INFO, logger="dataflow.execution"):
        for i, call in enumerate(calls * 3):
            before = ended()
            call()
            assert ended() == before + 1, f"call {i % len(calls)} returned before its summary"
            assert not progress.manager().tracked()


def test_stats_as_a_dict(mode):
    ds = dataflow.range(1000, override_num_blocks=4).map_batches(lambda b: b)
    assert ds.stats(format="dict") == {}
    ds.set_name("numbers")
    assert ds.count() == 1000
    stats = ds.stats(format="dict")
    assert json.loads(json.dumps(stats)) == stats
    assert stats["dataset"] == "numbers" and stats["wall_s"] > 0
    assert stats["operators"][-1]["rows_out"] == 1000 and stats["operators"][-1]["tasks"] >= 1
    assert set(stats["operators"][0]) >= {"name", "tasks", "rows_out", "bytes_out", "waits", "retried", "failed"}
    with pytest.raises(ValueError, match="'text' or 'dict'"):
        ds.stats(format="json")


def test_a_running_execution_shows_its_progress(streaming):
    """The snapshot API the bars read, while the plan runs: plain data, rows growing."""
    handle = dataflow.range(2000, override_num_blocks=10).map_batches(_sleepy, batch_size=100)._execute()
    seen = []
    for ref in handle.iter_refs():
        seen.append(handle.progress())
        handle.release(ref)
    assert [p.state for p in seen].count("running") >= 1
    assert seen[-1].operators[-1].rows_out >= seen[0].operators[-1].rows_out
    _wait_until_ended()
    final = handle.progress()
    assert final.state == "finished" and final.rows_out == 2000 and final.fraction() == 1.0


def _wait_until_ended(timeout: float = 10.0) -> None:
    """The progress thread noticed every execution's end (it looks a few times a second)."""
    deadline = time.monotonic() + timeout
    while progress.manager().tracked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not progress.manager().tracked()


def test_a_notebook_shows_progress_in_place_and_ends_with_the_summary(tmp_path):
    """Run cells in a real Jupyter kernel (when nbclient and ipykernel are installed): each
    execution's output is updated in place and ends as its summary line, in its own cell."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cells = [
        "import os, time, dataflow\ndataflow.init(execution_mode='local')\n"
        "def slow(b):\n    time.sleep(0.1)\n    return b",
        "print(dataflow.range(1000, override_num_blocks=10).map_batches(slow).count())",
        "print(dataflow.range(600, override_num_blocks=6).map_batches(slow).count())",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "DATAFLOW_LOG_DIR": str(tmp_path)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    shown = [[o.get("data", {}).get("text/plain", "") for o in cell.outputs if o["output_type"] == "display_data"]
             for cell in nb.cells]
    assert shown[1] == [shown[1][0]] and shown[1][0].startswith("dataset #1 finished in")
    assert shown[2] == [shown[2][0]] and shown[2][0].startswith("dataset #2 finished in")
