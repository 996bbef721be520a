"""Live progress of running executions: bars on a terminal, text updated in place in Jupyter,
log lines otherwise.

Every execution a Dataset starts is tracked here (``track``). One thread of the driver reads
each execution's snapshot (``ExecutionHandle.progress()``: counters the executor keeps anyway,
read without locks) two to four times a second and draws them; nothing is counted per row and the
executor's loop never waits for it. When an execution ends (it finished, failed, or was cancelled:
its iterator was closed, or dropped and collected) its lines go and one summary line stays.

How it is shown (``DataContext.progress_mode``, or ``DATAFLOW_PROGRESS``):

* "auto" (the default): "rich" when standard error is a terminal, text updated in place in a
  Jupyter notebook, "log" otherwise (CI, a file, nohup);
* "rich": a bar per execution and a line per operator, redrawn in place (``rich.live``);
* "log": every ``progress_log_interval_s`` (10 s) a line per execution and per operator on the
  ``dataflow.progress`` logger (on standard error unless the program configured logging, see
  ``dataflow.logs``);
* "off" (``enable_progress_bars = False``): nothing drawn.

Whatever the mode, each execution's start (its operators) and end (rows, bytes, time or error)
go to the ``dataflow.execution`` logger, hence the session's log file. Executions shorter than
``SHOW_AFTER_S`` are never drawn and leave no summary on the console.

An operator's line: rows and bytes out and per second, tasks done, running and queued, actors,
bytes of its blocks held, and why it waits (no free worker, output budget full...). The bar is an
estimate: each operator's tasks done out of those it knows of, times the least done of its inputs
while more may still come from them.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import logging
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dataflow import logs
from dataflow.context import PROGRESS_MODES, DataContext
from engine.stats import ExecutionProgress, OpProgress, format_bytes

execution_log = logging.getLogger("dataflow.execution")
progress_log = logging.getLogger(logs.PROGRESS_LOGGER)

REFRESH_S = 0.25
"""How often bars are redrawn (4 Hz)."""
SHOW_AFTER_S = 0.5
"""Executions shorter than this are not drawn (a ``take(5)`` leaves nothing on the console)."""
RATE_WINDOW_S = 3.0
"""Rates on bars are over the last few seconds (in log mode: over the interval between lines)."""
RECENT = 20
"""Finished executions kept for the metrics endpoint."""
SETTLE_WAIT_S = 1.0
"""How long a consuming call waits for the thread to finish drawing before it leaves the summary
to the thread (a bound: the call must not hang on the progress display)."""
BAR_WIDTH = 24
CONSOLE = {"console": True}
"""``extra`` of a log record the console fallback prints (``dataflow.logs.ConsoleFallback``)."""

Rate = tuple[float, float]
"""Rows and bytes per second."""


# what is shown (pure) --------------------------------------------------------------------------
class Rates:
    """Rows and bytes per second of each operator over about the last ``window_s`` seconds."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, tuple[int, ...], tuple[int, ...]]] = deque()

    def add(self, now: float, progress: ExecutionProgress) -> None:
        rows = tuple(op.rows_out for op in progress.operators)
        size = tuple(op.bytes_out for op in progress.operators)
        self._samples.append((now, rows, size))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def per_op(self) -> list[Rate]:
        """One (rows/s, bytes/s) per operator; [] until two samples are apart in time."""
        if len(self._samples) < 2:
            return []
        (t0, rows0, size0), (t1, rows1, size1) = self._samples[0], self._samples[-1]
        span = t1 - t0
        if span <= 0 or len(rows0) != len(rows1):
            return []
        return [((r1 - r0) / span, (b1 - b0) / span) for r0, r1, b0, b1 in zip(rows0, rows1, size0, size1, strict=True)]


@dataclass(frozen=True)
class View:
    """One running execution as drawn: its label, its snapshot and its operators' rates."""

    label: str
    progress: ExecutionProgress
    rates: tuple[Rate, ...] = ()
    operators: bool = True
    """A line per operator under the execution's own (``enable_operator_progress_bars``)."""

    def rate(self, index: int) -> Rate | None:
        return self.rates[index] if index < len(self.rates) else None


def operator_text(op: OpProgress, rate: Rate | None) -> str:
    """``1,200 rows, 9.4 KiB; 400 rows/s, 3.1 KiB/s; 3 tasks done, 2 running, 4 queued; ...``"""
    parts = [f"{op.rows_out:,} rows, {format_bytes(op.bytes_out)}"]
    if rate is not None and not op.completed:
        parts.append(f"{rate[0]:,.0f} rows/s, {format_bytes(rate[1])}/s")
    if op.runs_tasks:
        tasks = f"{op.tasks_done:,} tasks done"
        if not op.completed:
            tasks += f", {op.tasks_running} running, {op.tasks_queued} queued"
        parts.append(tasks)
    if op.actors:
        parts.append(f"{op.actors} actor{'s' if op.actors != 1 else ''}")
    if op.held_bytes:
        parts.append(f"{format_bytes(op.held_bytes)} held")
    if op.tasks_retried:
        parts.append(f"{op.tasks_retried} retried")
    if op.completed:
        parts.append("done")
    elif op.waiting:
        parts.append(f"waiting: {op.waiting}")
    return "; ".join(parts)


def headline_text(view: View) -> str:
    """``45%; 12,000 rows out; 3,000 rows/s; 4.1 s``"""
    p = view.progress
    parts = [f"{p.fraction():.0%}", f"{p.rows_out:,} rows out"]
    out_rate = view.rate(len(p.operators) - 1)
    if out_rate is not None:
        parts.append(f"{out_rate[0]:,.0f} rows/s")
    parts.append(f"{p.elapsed_s:.1f} s")
    return "; ".join(parts)


_ENDINGS = {
    "finished": "finished in",
    "failed": "failed after",
    "cancelled": "was stopped by its consumer after",
    "running": "was still running at exit after",
}


def summary_text(label: str, p: ExecutionProgress) -> str:
    """The one line an ended execution leaves: how it ended, time, rows, bytes, tasks, error."""
    tasks = sum(op.tasks_done for op in p.operators)
    line = (
        f"{label} {_ENDINGS.get(p.state, p.state)} {p.elapsed_s:.2f} s: {p.rows_out:,} rows "
        f"({format_bytes(p.bytes_out)}) out, {tasks:,} tasks"
    )
    retried = sum(op.tasks_retried for op in p.operators)
    if retried:
        line += f", {retried} run again after worker deaths"
    if p.error:
        line += f"; {p.error}"
    return line


def frame_lines(view: View, op_prefix: str = "  ") -> list[str]:
    """The execution's line and, unless turned off, one per operator (``op_prefix`` first)."""
    lines = [f"{view.label}: {headline_text(view)}"]
    if view.operators:
        for i, op in enumerate(view.progress.operators):
            lines.append(f"{op_prefix}{op.name}: {operator_text(op, view.rate(i))}")
    return lines


def resolve_mode(mode: str, *, terminal: bool, notebook: bool, rich_available: bool) -> str | None:
    """The renderer for ``mode``: "rich", "notebook", "log", or None (nothing drawn)."""
    if mode not in PROGRESS_MODES:
        msg = f"progress_mode must be one of {PROGRESS_MODES}, got {mode!r}"
        raise ValueError(msg)
    if mode == "off":
        return None
    if mode == "log":
        return "log"
    if notebook:
        return "notebook"
    if (mode == "rich" or terminal) and rich_available:
        return "rich"
    return "log"


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def _in_notebook() -> bool:
    """A Jupyter kernel runs this process (IPython's ZMQ shell, or Colab's)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()  # type: ignore[attr-defined]
    except Exception:
        return False
    kind = type(shell)
    return kind.__name__ == "ZMQInteractiveShell" or "google.colab" in kind.__module__


# how it is drawn ------------------------------------------------------------------------------
class Renderer(Protocol):
    refresh_s: float
    rate_window_s: float

    def add(self, execution_id: int) -> None:
        """An execution starts (called in the thread that started it)."""

    def update(self, views: list[View]) -> None:
        """Draw the running executions (the progress thread)."""

    def finished(self, view: View, summary: str | None) -> None:
        """An execution ended: take its lines away, leave ``summary`` if given."""

    def close(self) -> None:
        """Nothing runs anymore: stop drawing."""


class LogRenderer:
    """Every ``interval_s``, one log line per running execution and one per operator."""

    def __init__(self, interval_s: float) -> None:
        self._logged: dict[int, float] = {}
        """Execution id -> its elapsed time when its lines were last logged."""
        self.set_interval(interval_s)

    def set_interval(self, interval_s: float) -> None:
        """Log every ``interval_s`` from now on (the setting of the execution that started last)."""
        self.interval_s = interval_s
        self.rate_window_s = interval_s
        self.refresh_s = min(0.5, interval_s)  # the thread must look at least as often as it logs

    def add(self, execution_id: int) -> None:
        self._logged[execution_id] = 0.0

    def update(self, views: list[View]) -> None:
        for view in views:
            p = view.progress
            if p.elapsed_s - self._logged.get(p.execution_id, 0.0) >= self.interval_s:
                self._logged[p.execution_id] = p.elapsed_s
                for line in frame_lines(view, op_prefix=f"{view.label} "):
                    progress_log.info("%s", line, extra=CONSOLE)

    def finished(self, view: View, summary: str | None) -> None:
        self._logged.pop(view.progress.execution_id, None)  # the summary is the manager's log line

    def close(self) -> None:
        self._logged.clear()


class RichRenderer:
    """A bar per execution and a line per operator, redrawn in place on standard error."""

    refresh_s = REFRESH_S
    rate_window_s = RATE_WINDOW_S

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self._live: Any = None

    def add(self, execution_id: int) -> None:
        pass

    def update(self, views: list[View]) -> None:
        shown = [view for view in views if view.progress.elapsed_s >= SHOW_AFTER_S]
        if not shown and self._live is None:
            return
        from rich.console import Group

        renderable = Group(*(rich_view(view) for view in shown))
        if self._live is None:
            from rich.live import Live

            self._live = Live(renderable, console=self.console, auto_refresh=False, transient=True)
            self._live.start(refresh=True)
        else:
            self._live.update(renderable, refresh=True)

    def finished(self, view: View, summary: str | None) -> None:
        if summary is not None:
            from rich.text import Text

            style = "green" if view.progress.state == "finished" else "yellow"
            self.console.print(Text(summary, style=style), soft_wrap=True)  # above the bars while drawn

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def rich_view(view: View) -> Any:
    """An execution's bar and its operators' lines, as a rich table."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, overflow="ellipsis", max_width=48)
    grid.add_column(width=BAR_WIDTH)
    grid.add_column()
    p = view.progress
    bar = ProgressBar(total=1.0, completed=p.fraction(), width=BAR_WIDTH)
    grid.add_row(Text(view.label, style="bold"), bar, Text(headline_text(view)))
    if view.operators:
        for i, (op, share) in enumerate(zip(p.operators, p.fractions(), strict=True)):
            style = "green" if op.completed else ("yellow" if op.waiting else "")
            op_bar = ProgressBar(total=1.0, completed=share, width=BAR_WIDTH)
            grid.add_row(Text(f"  {op.name}"), op_bar, Text(operator_text(op, view.rate(i)), style=style))
    return grid


class TextFrame:
    """Text a notebook shows as it is (preformatted in HTML)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html  # only in notebooks

        return f"<pre>{html.escape(self.text)}</pre>" if self.text else ""


class NotebookRenderer:
    """Each execution's lines in an output of the cell that started it, updated in place
    (IPython display handles; no widgets needed), replaced by its summary at the end."""

    refresh_s = 0.5
    rate_window_s = RATE_WINDOW_S

    def __init__(self, display: Callable[..., Any] | None = None) -> None:
        if display is None:
            from IPython.display import display as ipython_display

            display = ipython_display
        self._display = display
        self._handles: dict[int, Any] = {}

    def add(self, execution_id: int) -> None:
        # in the cell's own thread: a display made from another thread may land in another cell
        self._handles[execution_id] = self._display(TextFrame(""), display_id=True)

    def update(self, views: list[View]) -> None:
        for view in views:
            handle = self._handles.get(view.progress.execution_id)
            if handle is not None and view.progress.elapsed_s >= SHOW_AFTER_S:
                handle.update(TextFrame("\n".join(frame_lines(view))))

    def finished(self, view: View, summary: str | None) -> None:
        handle = self._handles.pop(view.progress.execution_id, None)
        if handle is not None:
            handle.update(TextFrame(summary or ""))

    def close(self) -> None:
        self._handles.clear()


def make_renderer(kind: str, ctx: DataContext) -> Renderer:
    if kind == "rich":
        return RichRenderer()
    if kind == "notebook":
        return NotebookRenderer()
    return LogRenderer(ctx.progress_log_interval_s)


# what is tracked ------------------------------------------------------------------------------
@dataclass
class _Tracked:
    handle: Any
    """The execution's handle, held until it ends (the executor holds the execution as long)."""
    label: str
    name: str | None
    operators: bool
    draw: bool
    rates: Rates


class ProgressManager:
    """The executions of this process and the one thread that draws them (started with the
    first, ended with the last)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._tracked: dict[int, _Tracked] = {}
        self._thread: threading.Thread | None = None
        self._renderer: Renderer | None = None
        self._failed_ticks = 0
        self.recent: deque[tuple[str | None, ExecutionProgress]] = deque(maxlen=RECENT)
        """Name and last snapshot of the executions that ended most recently."""
        self.outcomes: Counter[str] = Counter()
        """How many executions ended, by how they ended."""

    def track(self, handle: Any, name: str | None = None, ctx: DataContext | None = None) -> None:
        """Follow the execution behind ``handle`` (a Dataset's name, if any, labels it)."""
        ctx = ctx or DataContext.get_current()
        first = handle.progress()
        label = f"{name or 'dataset'} #{first.execution_id}"
        if ctx.print_on_execution_start:
            execution_log.info("%s started: %s", label, " -> ".join(op.name for op in first.operators))
        kind = resolve_mode(
            ctx.progress_mode,
            terminal=_stderr_is_terminal(),
            notebook=_in_notebook(),
            rich_available=_rich_available(),
        )
        with self._lock:
            if kind is not None and self._renderer is None:
                self._renderer = self._make_renderer(kind, ctx)
                self._wake.set()  # the thread may be asleep for the half second it waits without one
            renderer = self._renderer if kind is not None else None
            if isinstance(renderer, LogRenderer) and renderer.interval_s != ctx.progress_log_interval_s:
                renderer.set_interval(ctx.progress_log_interval_s)  # made for an earlier execution
                self._wake.set()  # the thread may be asleep for the old period: look again now
            window = renderer.rate_window_s if renderer is not None else RATE_WINDOW_S
            verbose = ctx.execution_options.verbose_progress  # Ray's per-execution say, over the context's
            per_operator = ctx.enable_operator_progress_bars if verbose is None else bool(verbose)
            tracked = _Tracked(handle, label, name, per_operator, renderer is not None, Rates(window))
            tracked.rates.add(time.monotonic(), first)
            self._tracked[first.execution_id] = tracked
            if renderer is not None:
                renderer.add(first.execution_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dataflow-progress", daemon=True)
                self._thread.start()
        handle.when_ended(self._wake.set)  # its summary comes at once, not at the next tick

    def _make_renderer(self, kind: str, ctx: DataContext) -> Renderer:
        try:
            return make_renderer(kind, ctx)
        except Exception as err:  # rich or IPython missing or broken: log lines still work
            progress_log.debug("progress: the %s view failed to start (%r); using log lines", kind, err)
            return LogRenderer(ctx.progress_log_interval_s)

    def snapshots(self) -> list[tuple[str | None, ExecutionProgress]]:
        """Name and snapshot of the executions that ended recently, then of the running ones."""
        with self._lock:
            running = [(t.name, t.handle) for t in self._tracked.values()]
            out = list(self.recent)
        out += [(name, handle.progress()) for name, handle in running]
        return out

    def settle(self, handle: Any) -> None:
        """Summarize ``handle``'s execution now if it has ended, from the caller's thread: a
        consuming call (``count()``, ``take_all()``...) returns after its summary is drawn, so a
        notebook cell ends with it rather than with the last bar the thread drew."""
        if not self._lock.acquire(timeout=SETTLE_WAIT_S):  # drawing now: the thread summarizes it
            return
        try:
            for execution_id, tracked in list(self._tracked.items()):
                if tracked.handle is not handle:
                    continue
                p = handle.progress()
                if not p.running:
                    tracked.rates.add(time.monotonic(), p)
                    self._finish(execution_id, tracked, View(tracked.label, p, tuple(tracked.rates.per_op()), tracked.operators))
            if not self._tracked:
                # the view goes here too, not on the thread: rich's live display swaps
                # sys.stdout as it stops, which must not race the caller's next print()
                self._close_renderer()
        finally:
            self._lock.release()

    def tracked(self) -> int:
        """Executions followed now (one that just ended counts until the thread notices)."""
        return len(self._tracked)

    # the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._tracked:
                    self._close_renderer()
                    self._thread = None
                    return
                try:
                    self._tick(time.monotonic())
                    self._failed_ticks = 0
                except Exception:  # a bug here must not end the job; say it once
                    self._failed_ticks += 1
                    if self._failed_ticks == 1:
                        progress_log.exception("progress: drawing failed (this is a bug in dataflow)")
                period = self._renderer.refresh_s if self._renderer is not None else 0.5
            self._wake.wait(period)
            self._wake.clear()

    def _tick(self, now: float) -> None:
        views = []
        for execution_id, tracked in list(self._tracked.items()):
            p = tracked.handle.progress()
            tracked.rates.add(now, p)
            view = View(tracked.label, p, tuple(tracked.rates.per_op()), tracked.operators)
            if not p.running:
                self._finish(execution_id, tracked, view)
            elif tracked.draw:
                views.append(view)
        if self._renderer is not None:
            self._renderer.update(views)

    def _finish(self, execution_id: int, tracked: _Tracked, view: View) -> None:
        p = view.progress
        self.outcomes[p.state] += 1
        self.recent.append((tracked.name, p))
        summary = summary_text(tracked.label, p)
        shown = tracked.draw and p.elapsed_s >= SHOW_AFTER_S
        console = shown and isinstance(self._renderer, LogRenderer)
        execution_log.info("%s", summary, extra={"console": console})
        if tracked.draw and self._renderer is not None:
            self._renderer.finished(view, summary if shown else None)
        del self._tracked[execution_id]  # last: tracked() counts it until its summary is out

    def _close_renderer(self) -> None:
        if self._renderer is not None:
            renderer, self._renderer = self._renderer, None
            try:
                renderer.close()
            except Exception:
                progress_log.debug("progress: closing the view failed", exc_info=True)

    def close(self) -> None:
        """End every view (at exit): executions still running are summarized as such."""
        with self._lock:
            for execution_id, tracked in list(self._tracked.items()):
                p = tracked.handle.progress()
                self._finish(execution_id, tracked, View(tracked.label, p, (), tracked.operators))
            self._close_renderer()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)


_manager = ProgressManager()
_exit_hook = False


def track(handle: Any, name: str | None = None) -> None:
    """Show the progress of the execution behind ``handle`` and log its start and end
    (``Dataset`` calls this for every execution it starts)."""
    global _exit_hook
    if not _exit_hook:
        _exit_hook = True
        logs.setup()
        _serve_metrics_from_env()
        atexit.register(lambda: _manager.close())
    try:
        _manager.track(handle, name)
    except Exception:  # the job runs on without its progress
        progress_log.warning("progress: cannot follow an execution (this is a bug in dataflow)", exc_info=True)


def settle(handle: Any) -> None:
    """Draw the summary of ``handle``'s execution if it has ended (see ``ProgressManager.settle``)."""
    try:
        _manager.settle(handle)
    except Exception:  # the thread summarizes it at its next tick instead
        progress_log.debug("progress: cannot summarize an execution now", exc_info=True)


@functools.cache
def _rich_available() -> bool:
    """Whether rich can be imported (looked up once: a lookup walks sys.path)."""
    return importlib.util.find_spec("rich") is not None


def _serve_metrics_from_env() -> None:
    from dataflow import metrics

    try:
        metrics.serve_from_env()
    except (OSError, ImportError, ValueError) as err:  # a port in use, no prometheus_client, not a number
        progress_log.warning("DATAFLOW_METRICS_PORT is set but the metrics endpoint cannot start: %s", err)


def manager() -> ProgressManager:
    """This process's tracker (the metrics endpoint reads its snapshots)."""
    return _manager


def _forget_after_fork() -> None:
    """A forked child draws nothing of its parent's executions (its thread is not there)."""
    global _manager
    _manager = ProgressManager()


os.register_at_fork(after_in_child=_forget_after_fork)
