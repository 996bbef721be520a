"""Run one side of a benchmark workload in the right interpreter and return its result as JSON.

Sides and their interpreters:

* ``raw``, ``dataflow``, ``polars``: the interpreter running this module (the project venv), with
  the repo root on ``PYTHONPATH`` so ``import dataflow`` finds the working tree.
* ``ray``:  ``benchmarks/.venvs/ray/bin/python``  (``pip install "ray[data]==2.60.0" ...``)
* ``daft``: ``benchmarks/.venvs/daft/bin/python`` (``pip install daft``)

``bash benchmarks/setup_peers.sh`` creates both peer venvs.

A peer whose venv does not exist is reported as ``{"status": "not installed"}``, never raised.
Worker failures come back as ``{"status": "error", "error": <stderr tail>}``; a worker past its
timeout as ``{"status": "timeout"}``. With ``sample_pss=True`` the proportional set size of the
worker's whole process tree (the worker and all its descendants, e.g. Ray's raylet, GCS and
workers) is sampled every ``interval`` seconds via psutil and returned under ``"pss"``.

CLI: ``python benchmarks/peers.py WORKLOAD SIDE [--args JSON]``, e.g.
``python benchmarks/peers.py read_parquet ray --args '{"data": "benchmarks/data/parquet40k", "runs": 1}'``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENVS = HERE / ".venvs"
RESULT_TAG = "@@BENCH@@"
PROJECT_SIDES = ("raw", "dataflow", "baseline", "polars")
"""Sides that run in the project venv (polars is one of the project's dependencies)."""

WORKLOADS = {
    "read_parquet": HERE / "bench_read_parquet.py",
    "map_filter": HERE / "bench_map_filter.py",
    "many_blocks": HERE / "bench_many_blocks.py",
    "startup": HERE / "bench_startup.py",
    "memory": HERE / "bench_memory.py",
    "all_to_all": HERE / "bench_all_to_all.py",
}

# Quiet, offline-friendly settings for the peers (no usage reporting, no dashboards).
PEER_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_DEDUP_LOGS": "0",
    "DAFT_ANALYTICS_ENABLED": "0",
    "DAFT_PROGRESS_BAR": "0",
    "DO_NOT_TRACK": "1",
    "SCARF_NO_ANALYTICS": "true",
}


def python_for(side: str) -> str | None:
    """Interpreter for ``side``, or None when that peer's venv is not installed."""
    if side in PROJECT_SIDES:
        return sys.executable
    py = VENVS / side / "bin" / "python"
    return str(py) if py.exists() else None


def side_env(side: str, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(PEER_ENV)
    if side in PROJECT_SIDES:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    else:
        # The peer venvs must not pick up the project's packages or the project venv.
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    if extra:
        env.update(extra)
    return env


def session_shm_bytes() -> int:
    """Bytes held by dataflow block files in /dev/shm.

    A block a worker wrote and nobody has mapped yet is in no process's PSS, yet it is memory;
    adding every block file (mapped ones too, so this counts them twice) makes the figure an
    upper bound rather than a flattering one. Zero for the other sides.
    """
    import glob

    total = 0
    for path in glob.glob("/dev/shm/dataflow-*/*.arrow"):
        try:
            total += os.stat(path).st_blocks * 512
        except OSError:
            pass
    return total


def tree_pss(pid: int) -> tuple[int, int]:
    """(PSS of ``pid`` and all its descendants + dataflow's /dev/shm blocks, number of processes)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total, n = 0, 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
            n += 1
        except psutil.Error:
            pass
    return total + session_shm_bytes(), n


class PssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int, int]] = []  # (unix time, pss bytes, nprocs)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            t = time.time()
            pss, n = tree_pss(self.pid)
            if n:
                self.samples.append((t, pss, n))
            self._halt.wait(max(0.0, self.interval - (time.time() - t)))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def run_side(script: str | Path, side: str, worker_args: dict | None = None, timeout: float = 1800,
             sample_pss: bool = False, interval: float = 0.25, env: dict | None = None) -> dict:
    """Run ``script --worker SIDE --worker-args JSON`` in ``side``'s interpreter; return its JSON."""
    py = python_for(side)
    if py is None:
        return {"side": side, "status": "not installed",
                "note": f"no venv at {VENVS / side}; see benchmarks/README.md"}
    cmd = [py, str(script), "--worker", side, "--worker-args", json.dumps(worker_args or {})]
    with tempfile.TemporaryDirectory(prefix=f"bench-{side}-") as tmp:
        out_p, err_p = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_p, "wb") as out_f, open(err_p, "wb") as err_f:
            t_spawn = time.time()
            proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, stdin=subprocess.DEVNULL,
                                    env=side_env(side, env), cwd=str(REPO), start_new_session=True)
            sampler = None
            if sample_pss:
                sampler = PssSampler(proc.pid, interval)
                sampler.start()
            status = "ok"
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = "timeout"
                _kill_tree(proc.pid)
                rc = proc.wait()
            wall = time.time() - t_spawn
            if sampler:
                sampler.stop()
        stdout = out_p.read_text("utf-8", "replace")
        result = None
        for line in stdout.splitlines():
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
        res: dict = {"side": side}
        if result is not None and rc == 0:
            res.update(result)
            res["status"] = "ok"
        else:
            res["status"] = status if status != "ok" else "error"
            res["returncode"] = rc
            res["error"] = _tail(err_p) or stdout[-2000:]
        res["process_wall_s"] = wall
        res["t_spawn"] = t_spawn
        if sampler:
            res["pss_samples"] = [(round(t - t_spawn, 3), b, n) for t, b, n in sampler.samples]
        return res


def _kill_tree(pid: int) -> None:
    """Kill the worker and everything it started (it runs in its own session)."""
    import signal

    procs = []
    with contextlib.suppress(Exception):
        import psutil

        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def run_workload(workload: str, side: str, worker_args: dict | None = None, **kw) -> dict:
    """Run ``side`` of the named workload (see ``WORKLOADS``)."""
    if workload not in WORKLOADS:
        raise KeyError(f"unknown workload {workload!r}; known: {sorted(WORKLOADS)}")
    return run_side(WORKLOADS[workload], side, worker_args, **kw)


def installed_peers() -> dict[str, bool]:
    return {p: python_for(p) is not None for p in ("ray", "daft")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one side of a workload; print its JSON result.")
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("side", help="raw | dataflow | ray | daft")
    ap.add_argument("--args", default="{}", help="worker arguments as a JSON object")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--pss", action="store_true", help="sample PSS of the process tree")
    ns = ap.parse_args(argv)
    res = run_workload(ns.workload, ns.side, json.loads(ns.args), timeout=ns.timeout,
                       sample_pss=ns.pss)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
