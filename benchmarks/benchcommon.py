"""Shared helpers for the benchmark scripts (standard library only at import time).

Each ``bench_*.py`` script is both the orchestrator and the worker: run plainly it starts one
subprocess per *side* (``raw``, ``dataflow``, ``ray``, ``daft``) through :mod:`peers`, one after
the other, and prints a table plus one JSON line; run as ``bench_x.py --worker SIDE --worker-args
JSON`` (which is what :mod:`peers` does, with the right venv's python) it runs just that side and
prints one ``@@BENCH@@ {json}`` line. Workers must import nothing outside the stdlib at module
level so the same file runs in the Ray and Daft venvs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_DIR = HERE / "data"
FULL_DATA = DATA_DIR / "parquet4m"
SMALL_DATA = DATA_DIR / "parquet40k"
RESULT_TAG = "@@BENCH@@"
ALL_SIDES = ("raw", "dataflow", "ray", "daft")


# ----------------------------------------------------------------------------------------------
# worker side


def is_worker(argv: list[str] | None = None) -> bool:
    return "--worker" in (sys.argv if argv is None else argv)


def worker_main(impls: dict[str, Callable[[dict], dict]], argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--worker-args", default="{}")
    ns = ap.parse_args(argv)
    impl = impls.get(ns.worker)
    if impl is None:
        print(f"unknown side {ns.worker!r}; known: {sorted(impls)}", file=sys.stderr)
        return 2
    out = impl(json.loads(ns.worker_args))
    out.setdefault("python", sys.executable)
    sys.stdout.flush()
    print(RESULT_TAG, json.dumps(out), flush=True)
    return 0


def batch_len(batch) -> int:
    """Rows in a dict-of-columns (numpy) batch, a pyarrow batch/table or a pandas frame."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values()))) if batch else 0
    return len(batch)


def arrow_batch_to_numpy(batch) -> dict:
    """The raw conversion every reader side performs: each column of a pyarrow RecordBatch to numpy.

    fixed_size_list / list columns -> 2-D array via flatten + reshape; strings -> object arrays.
    """
    import pyarrow as pa

    out = {}
    n = batch.num_rows
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            flat = col.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(n, -1) if n else flat.reshape(0, 0)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def maybe_init_dataflow():
    """Import dataflow and start it if it has an ``init``, its worker processes up (mirrors
    ``ray.init``, which returns once its cluster is up: the timed runs then start alike)."""
    import dataflow

    init = getattr(dataflow, "init", None)
    if callable(init):
        init()
        wait_for_dataflow_workers()
    return dataflow


def wait_for_dataflow_workers(timeout: float = 60.0) -> None:
    """Block until dataflow's worker processes are up. ``dataflow.init()`` returns before they
    are (a first small job runs in the driver meanwhile), so a benchmark whose rule is "engines
    are started before the clock" waits for them, as ``ray.init()`` waits for its cluster."""
    from engine import session

    current = session.current_session()
    if current is not None and not current.executor.wait_for_workers(timeout):
        raise RuntimeError(f"dataflow's workers were not up after {timeout} s")


def settle_dataflow(timeout: float = 60.0) -> None:
    """Block until dataflow has freed the blocks of the results dropped so far: their frees have
    reached its executor and the files are unlinked (``StreamingExecutor.sync``). dataflow
    unlinks freed files on a thread of its own, which otherwise runs into whatever is timed next."""
    from engine import session

    current = session.current_session()
    if current is not None and not current.executor.sync(timeout):
        raise RuntimeError(f"dataflow had not freed dropped blocks after {timeout} s")


def maybe_shutdown(mod) -> None:
    fn = getattr(mod, "shutdown", None)
    if callable(fn):
        with contextlib.suppress(Exception):
            fn()


def init_ray():
    import logging

    import ray

    ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    for attr in ("print_on_execution_start", "verbose_stats_logs"):
        if hasattr(ctx, attr):
            setattr(ctx, attr, False)
    return ray


def timed_runs(fn: Callable[[], object], runs: int) -> tuple[list[float], object]:
    times, last = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return times, last


# ----------------------------------------------------------------------------------------------
# orchestrator side


def base_parser(description: str, default_runs: int = 3) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--small", action="store_true", help="use the 40k-row smoke-test dataset")
    ap.add_argument("--data", type=Path, help="dataset directory (default: 4M-row set)")
    ap.add_argument("--runs", type=int, default=default_runs, help="timed runs per side (median)")
    ap.add_argument("--sides", default=",".join(ALL_SIDES),
                    help=f"comma-separated subset of {','.join(ALL_SIDES)}")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the sides in turn this many times (fresh processes each round) and pool "
                         "their runs; evens out a shared machine whose speed drifts (scripts that "
                         "use run_timed_sides)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per side")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    return ap


def sides(args) -> list[str]:
    out = [s.strip() for s in args.sides.split(",") if s.strip()]
    bad = [s for s in out if s not in ALL_SIDES]
    if bad:
        raise SystemExit(f"unknown sides {bad}")
    return out


def dataset(args) -> Path:
    if args.data:
        return args.data
    path = SMALL_DATA if args.small else FULL_DATA
    sys.path.insert(0, str(HERE))
    import datagen

    datagen.ensure_tabular(small=args.small, out=path, quiet=True)
    return path


def warm_page_cache(path: Path) -> int:
    """Read every file once so every side starts from the same (warm) page cache."""
    total = 0
    for p in sorted(Path(path).glob("*.parquet")):
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def machine_info() -> dict:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
                break
    return {"nproc": os.cpu_count(), "mem_gib": round(mem / 2**30, 1), "cpu": model,
            "python": platform.python_version()}


def fmt_num(x, unit: str = "s") -> str:
    if x is None:
        return "-"
    if unit == "s":
        if x < 0.1:
            return f"{x * 1e3:.2f} ms"
        return f"{x:.3f} s" if x < 100 else f"{x:.1f} s"
    if unit == "int":
        return f"{int(x):,}"
    if unit == "GB":
        return f"{x:.3f} GB"
    return f"{x:.3g} {unit}".strip()


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def status_text(res: dict) -> str:
    st = res.get("status", "?")
    if st == "ok":
        return "ok"
    if st == "not installed":
        return "not installed"
    err = (res.get("error") or "").strip().splitlines()
    return f"{st}: {err[-1][:60] if err else ''}"


def report(workload: str, results: dict[str, dict], metric: str = "median_s", baseline: str = "raw",
           target: dict | None = None, extra: dict | None = None, unit: str = "s",
           json_out: Path | None = None, columns: list[tuple[str, str, str]] | None = None,
           notes: list[str] | None = None) -> dict:
    """Print the human table and the final JSON line; return the JSON object.

    ``metric`` is the key in each side's result compared across sides (lower is better);
    ratios are side/baseline and side/dataflow from this one invocation.
    """
    verdict = print_side_table(workload, results, metric, baseline, unit, columns, target, fmt=fmt_num)
    for note in notes or []:
        print(note)
    obj = {"workload": workload, "metric": metric, "baseline": baseline, "target": target,
           "target_met": verdict, "results": results}
    return _emit_json(obj, extra, json_out)


def evaluate_target(results: dict[str, dict], target: dict):
    """target = {'text':..., 'kind': 'ratio'|'abs', 'metric':..., 'max':..., 'baseline':...}."""
    df = results.get("dataflow", {})
    v = df.get(target.get("metric", "median_s"))
    if v is None:
        return "n/a (dataflow did not run)"
    if target["kind"] == "ratio":
        b = results.get(target.get("baseline", "raw"), {}).get(target.get("metric", "median_s"))
        if not b:
            return "n/a (no baseline)"
        ok = v / b <= target["max"]
        return f"{'MET' if ok else 'MISSED'} ({v / b:.2f}x)"
    ok = v <= target["max"]
    return f"{'MET' if ok else 'MISSED'} ({v:.3f})"


def no_torch(side: str) -> dict:
    """A peer's result when its venv has no torch (installing it would pull a CUDA build)."""
    return {"not_run": f"not run: no torch in {side}'s venv (not installed on purpose: multi-GB CUDA build)"}


def run_timed_sides(workload: str, script: str, args: Any, wargs: dict, rate_key: str, rate_unit: float) -> dict:
    """Run every requested side of ``script``; add each side's median and rows per second.

    With ``args.rounds`` > 1 the sides take turns (raw, dataflow, ..., raw, dataflow, ...), each
    round in fresh processes; a side's times are pooled over the rounds and its other numbers
    are the median over rounds. ``rate_key`` names the throughput field, ``rate_unit`` divides
    rows/s (1e3: krows/s).
    """
    import peers

    rounds: dict[str, list[dict]] = {side: [] for side in sides(args)}
    for k in range(max(1, getattr(args, "rounds", 1))):
        for side in rounds:
            print(f"[{workload}] {side} (round {k + 1}) ...", file=sys.stderr, flush=True)
            rounds[side].append(peers.run_side(script, side, wargs, timeout=args.timeout))
    results = {}
    for side, runs in rounds.items():
        res = _pool_rounds(runs)
        if res.get("not_run"):
            res["status"] = res["not_run"]
        if res.get("times"):
            res["median_s"] = median(res["times"])
            res[rate_key] = res["rows"] / rate_unit / res["median_s"]
        results[side] = res
    return results


def _pool_rounds(runs: list[dict]) -> dict:
    """One side's results from several rounds: times pooled, other numbers the median."""
    res = dict(runs[-1])
    if all(r.get("times") for r in runs):
        res["first_times"] = [r["times"][0] for r in runs]  # the first timed run of each fresh process
    if len(runs) == 1:
        return res
    res["rounds"] = len(runs)
    if all(r.get("times") for r in runs):
        res["times"] = [t for r in runs for t in r["times"]]
    for key, value in runs[-1].items():
        values = [r.get(key) for r in runs]
        if key != "times" and isinstance(value, float) and all(isinstance(v, float) for v in values):
            res[key] = median(values)
    return res


# ----------------------------------------------------------------------------------------------
# process-tree CPU and memory (psutil, imported lazily: the peer venvs may lack it)


def tree_cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of ``pid`` (default: this process, all its threads) and its live
    descendants; None without psutil. Descendants that already exited are not counted."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def dataflow_session_dirs(pid: int | None = None) -> list[str]:
    """The dataflow session folders (/dev/shm block folder, spill folder) ``pid`` holds open.

    A session keeps a locked file descriptor on each of its folders, so this finds this
    process's own session without picking up another one running on the same machine.
    """
    found = set()
    fd_dir = f"/proc/{pid or os.getpid()}/fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fd_dir, fd))
                parts = target.split("/")
                for k, part in enumerate(parts):
                    if part.startswith("dataflow-"):
                        found.add("/".join(parts[: k + 1]))
                        break
    return sorted(found)


def dir_bytes(path: str) -> int:
    """Bytes allocated by the files directly in ``path`` (st_blocks, so sparse files count what they hold)."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def _proc_status_kb(pid: int, keys: tuple[str, ...]) -> dict[str, int]:
    out = dict.fromkeys(keys, 0)
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in out:
                out[name] = int(rest.split()[0]) * 1024
    return out


class TreeMemorySampler:
    """Samples this process tree's memory every ``interval`` s in a thread (Linux, psutil).

    Per sample: ``rss`` (sum of RSS of this process and every descendant), ``anon`` (sum of their
    ``RssAnon``: private heap, no file or shared-memory pages), ``shm`` (bytes of the session's
    block files in /dev/shm), ``spill`` (bytes of its spill folder). ``rss + shm`` counts a block
    twice while a process has it mapped (its pages are in that process's RSS as shared memory
    and in /dev/shm); ``anon + shm`` counts every block once (and a forked worker's
    copy-on-write pages once per worker). Use as a context manager; ``peaks()`` after.
    """

    def __init__(self, interval: float = 0.05) -> None:
        import threading

        self.interval = interval
        self.samples: list[tuple[float, int, int, int, int, int]] = []  # t, rss, anon, shm, spill, nprocs
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-mem-sampler", daemon=True)
        self._t0 = time.perf_counter()

    def __enter__(self) -> TreeMemorySampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def sample(self) -> tuple[float, int, int, int, int, int]:
        import psutil

        me = psutil.Process()
        procs = [me]
        with contextlib.suppress(psutil.Error):
            procs += me.children(recursive=True)
        rss = anon = n = 0
        for p in procs:
            st = _proc_status_kb(p.pid, ("VmRSS", "RssAnon"))
            if st["VmRSS"]:
                rss += st["VmRSS"]
                anon += st["RssAnon"]
                n += 1
        shm = spill = 0
        for d in dataflow_session_dirs():
            if d.startswith("/dev/shm/"):
                shm += dir_bytes(d)
            else:
                spill += dir_bytes(d)
        return (time.perf_counter() - self._t0, rss, anon, shm, spill, n)

    def _run(self) -> None:
        while not self._halt.is_set():
            t = time.perf_counter()
            with contextlib.suppress(Exception):
                self.samples.append(self.sample())
            self._halt.wait(max(0.0, self.interval - (time.perf_counter() - t)))

    def peaks(self) -> dict:
        s = self.samples
        if not s:
            return {}
        return {"samples": len(s),
                "peak_rss_shm_bytes": max(x[1] + x[3] for x in s),
                "peak_anon_shm_bytes": max(x[2] + x[3] for x in s),
                "peak_rss_bytes": max(x[1] for x in s),
                "peak_shm_bytes": max(x[3] for x in s),
                "peak_spill_bytes": max(x[4] for x in s),
                "max_procs": max(x[5] for x in s)}


# ----------------------------------------------------------------------------------------------
# several cases of one workload in one report


def fmt_plain(x, unit: str = "n") -> str:
    """``fmt_num``, plus unit ``"n"``: a plain number (thousands separated, no exponent)."""
    if unit != "n" or x is None:
        return fmt_num(x, unit)
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def print_side_table(title: str, results: dict[str, dict], metric: str = "median_s", baseline: str = "raw",
                     unit: str = "s", columns: list[tuple[str, str, str]] | None = None,
                     target: dict | None = None, fmt: Callable[[Any, str], str] | None = None) -> str | None:
    """One case's table (sides as rows, ratios to ``baseline`` and dataflow); returns the verdict.
    ``fmt`` formats a value with its unit (default ``fmt_plain``)."""
    fmt = fmt or fmt_plain
    base = results.get(baseline, {}).get(metric)
    dfv = results.get("dataflow", {}).get(metric)
    columns = columns or []
    headers = ["side", metric, f"x {baseline}", "x dataflow", *[c[0] for c in columns], "status"]
    rows = []
    for side, res in results.items():
        v = res.get(metric)
        r_base = v / base if (v is not None and base) else None
        r_df = v / dfv if (v is not None and dfv) else None
        res["ratio_vs_" + baseline] = r_base
        res["ratio_vs_dataflow"] = r_df
        rows.append([side, fmt(v, unit),
                     f"{r_base:.2f}x" if r_base is not None else "-",
                     f"{r_df:.2f}x" if r_df is not None else "-",
                     *[fmt(res.get(key), u) for _, key, u in columns],
                     status_text(res)])
    print()
    print(f"== {title} ==")
    print_table(headers, rows)
    verdict = None
    if target:
        verdict = evaluate_target(results, target)
        print(f"target: {target['text']} -> {verdict}")
    return verdict


def report_cases(workload: str, cases: dict[str, dict[str, dict]], metric: str = "median_s",
                 baseline: str = "raw", unit: str = "s", columns: list[tuple[str, str, str]] | None = None,
                 targets: dict[str, dict] | None = None, extra: dict | None = None,
                 json_out: Path | None = None, notes: list[str] | None = None) -> dict:
    """A table per case (``cases[case][side]`` = that side's result), then one JSON line."""
    verdicts = {}
    for case, results in cases.items():
        verdicts[case] = print_side_table(f"{workload}: {case}", results, metric, baseline, unit, columns,
                                          (targets or {}).get(case))
    for note in notes or []:
        print(note)
    obj = {"workload": workload, "metric": metric, "baseline": baseline, "targets": targets,
           "target_met": verdicts, "cases": cases}
    return _emit_json(obj, extra, json_out)


def _emit_json(obj: dict, extra: dict | None, json_out: Path | None) -> dict:
    """Add the machine and the time (and ``extra``) to ``obj``; print it as the last line of
    stdout and write it to ``json_out``; return it."""
    obj["machine"] = machine_info()
    obj["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if extra:
        obj.update(extra)
    line = json.dumps(obj, default=str)
    if json_out:
        Path(json_out).write_text(line + "\n")
    print(line)
    return obj
