"""All-to-all operations (random_shuffle, sort, repartition, groupby, join) on every side.

Every side reads the same Parquet files, generated first into a temporary folder (``--tmp``,
removed at the end unless ``--keep-data``), and times **read + the operation + materializing the
result** (dataflow and Ray: ``.materialize()``; Daft: ``.collect()``; pyarrow and polars are
eager, so their result is in memory when the call returns). Engines are started before the
clock (``dataflow.init`` and its worker processes up, ``ray.init``); interpreter start and
imports are not timed. Cases
(``--cases``; ``N`` = 1 at the issue's sizes, 1/20 with ``--small``):

* ``shuffle``, ``sort``, ``repartition`` (group a): 200k N rows, 4 files, columns ``key`` int64
  (random in [0, 2^40)), ``f64`` float64, ``s`` 8-letter string; plain-encoded, or
  dictionary-encoded with ``--dictionary`` (pyarrow's and Spark's default, so the shape of most
  users' files).
  ``random_shuffle(seed=7)`` / ``sort("key")`` / ``repartition(8)``. One untimed run, then
  ``--runs`` timed runs (median). Target: dataflow faster than Daft on shuffle and sort.
* ``sort_big``, ``shuffle_big``, ``groupby`` (group b): 4M N rows, 32 files, ~1.4 GB in memory:
  ``key`` int64 (random in [0, 1M N): ~982k distinct keys at full size), ``v`` float64 (integers
  / 1024, so every sum is exact in any order), ``payload`` 330-letter string. ``sort("key")``,
  ``random_shuffle(seed=7)`` and ``groupby("key")`` with sum(v), count and mean(v). dataflow
  runs with ``init(object_store_memory=256 MiB)`` (``--store-mb``), so the data does not fit in
  its store. Target: dataflow <= 2x polars in memory (sort and groupby; the shuffle is reported).
* ``join`` (group c): 4M N rows (``key`` random in [0, 2M N), ``v``, ``s``; 32 files) inner join
  1M N rows (``key`` the even numbers below 2M N, each once, ``w``; 8 files) on ``key``:
  ~half the left rows match.

Between runs, each side drops the last result before the clock starts. pyarrow, polars and Daft
give its memory back then and there; dataflow unlinks a dropped result's block files on a thread
of its own, so its side waits for that to finish first (``benchcommon.settle_dataflow``): the
next run is not charged for freeing the last one's result, as no other side is. The clock stops
when ``materialize()`` returns, as for Ray: files a run frees as it ends (an exchange's spilled
map outputs) are unlinked after that, off the caller's thread, and before the next clock.

Groups b and c: one untimed warm-up of the same operation on the first file of the input
(workers up, imports done), then ``--big-runs`` timed runs (default 1).

Sides (one subprocess each, one after the other; ``--sides``):

    raw       pyarrow in memory: pq.read_table, then Table.take(permutation) / sort_by /
              group_by().aggregate / join; repartition = 8 slices of the combined table.
    polars    polars eager in memory: pl.read_parquet, then sample(fraction=1, shuffle=True) /
              sort(maintain_order=True) / group_by().agg / join (no repartition: not run).
    dataflow  this project (project venv).
    ray       Ray Data 2.60.0 (benchmarks/.venvs/ray), a cluster of its own
              (``ray.init(address="local")``); join with num_partitions=8.
    daft      Daft (benchmarks/.venvs/daft), native runner; shuffle is DataFrame.shuffle(seed) (a
              sort on random numbers); no repartition (the native runner makes repartition() and
              into_partitions() no-ops: not run).

For raw and polars ``op_median_s`` is the operation alone on the table already read.
``tree CPU`` is the user + system CPU seconds of the side's process and its live descendants
(psutil) over the timed run: less sensitive than wall time to other work on a shared machine.

Memory: a thread of the side's process samples every 50 ms during each timed run the RSS of
that process and every descendant (Ray's raylet, GCS and workers; dataflow's workers and
zygote), their ``RssAnon``, and the bytes of the dataflow session's /dev/shm folder and spill
folder (``benchcommon.TreeMemorySampler``). ``RSS+shm`` counts a block twice while a process
maps it, ``anon+shm`` once. Ray's object store is /dev/shm pages mapped by its processes, so it
is in their RSS.

Verification (after the clock): each side writes the result columns (keys, values, and an
8-byte fingerprint of each string) to the temporary folder and this script compares them with
polars' (pyarrow's for repartition): row counts; for sorts the key column position by position, whether whole rows follow
polars' stable order, and the multiset of rows; for groupby keys, counts and sums exactly and
means to 1e-12; for the join the sorted rows; for shuffle and repartition the multiset of rows,
and how many rows moved. A dataflow result that differs is a ``PROBLEM:`` line and exit code 1.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import benchcommon as bc

SIDES = ("raw", "polars", "dataflow", "ray", "daft")
GROUP = {"shuffle": "a", "sort": "a", "repartition": "a", "sort_big": "b", "shuffle_big": "b", "groupby": "b",
         "join": "c"}
ALL_CASES = tuple(GROUP)
SEED = 7
NBLOCKS = 8
RAY_JOIN_PARTITIONS = 8
PAYLOAD_BYTES = 330


# ------------------------------------------------------------------------------------------- data


def _letters(rng, n: int, width: int):
    """A pyarrow string array of ``n`` random lowercase strings of ``width`` letters."""
    import numpy as np
    import pyarrow as pa

    chars = rng.integers(97, 123, size=(n, width), dtype=np.uint8).reshape(-1)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])


def _write(folder: Path, files: int, rows: int, make, dictionary: bool = False) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    edges = np.linspace(0, rows, files + 1).astype(np.int64)
    for i in range(files):
        rng = np.random.default_rng([SEED, zlib.crc32(folder.name.encode()), i])
        table = make(rng, int(edges[i]), int(edges[i + 1] - edges[i]))
        pq.write_table(table, folder / f"part-{i:03d}.parquet", compression="snappy", use_dictionary=dictionary,
                       row_group_size=1 << 20)


def generate(root: Path, scale: float, groups: set[str], dictionary: bool = False) -> dict:
    """Write the inputs of the requested case groups under ``root``; return their paths and sizes.
    ``dictionary``: group a's files dictionary-encoded, as pyarrow and Spark write by default."""
    import numpy as np
    import pyarrow as pa

    out: dict = {}
    if "a" in groups:
        n = int(200_000 * scale)
        _write(root / "a", 4, n, lambda rng, start, k: pa.table({
            "key": rng.integers(0, 1 << 40, k, dtype=np.int64), "f64": rng.standard_normal(k),
            "s": _letters(rng, k, 8)}), dictionary)
        out["a"] = {"path": str(root / "a"), "rows": n}
    if "b" in groups:
        n, keys = int(4_000_000 * scale), int(1_000_000 * scale)
        _write(root / "b", 32 if scale >= 1 else 8, n, lambda rng, start, k: pa.table({
            "key": rng.integers(0, keys, k, dtype=np.int64),
            "v": rng.integers(-(1 << 20), 1 << 20, k).astype(np.float64) / 1024,
            "payload": _letters(rng, k, PAYLOAD_BYTES)}))
        out["b"] = {"path": str(root / "b"), "rows": n, "keys": keys}
    if "c" in groups:
        nl, nr = int(4_000_000 * scale), int(1_000_000 * scale)
        _write(root / "c_left", 32 if scale >= 1 else 8, nl, lambda rng, start, k: pa.table({
            "key": rng.integers(0, 2 * nr, k, dtype=np.int64),
            "v": rng.integers(-(1 << 20), 1 << 20, k).astype(np.float64) / 1024,
            "s": _letters(rng, k, 8)}))
        perm = np.random.default_rng(SEED).permutation(nr).astype(np.int64) * 2
        _write(root / "c_right", 8, nr, lambda rng, start, k: pa.table({
            "key": perm[start:start + k],
            "w": rng.integers(-(1 << 20), 1 << 20, k).astype(np.float64) / 1024}))
        out["c"] = {"left": str(root / "c_left"), "right": str(root / "c_right"), "left_rows": nl, "right_rows": nr}
    for g in out.values():
        g["bytes_on_disk"] = sum(p.stat().st_size for key in ("path", "left", "right") if key in g
                                 for p in Path(g[key]).glob("*.parquet"))
    return out


def first_file(folder: str) -> str:
    return sorted(str(p) for p in Path(folder).glob("*.parquet"))[0]


# ------------------------------------------------------------------------- result columns (workers)


def fingerprint(column):
    """The first 8 bytes of each string of a pyarrow (chunked) string column as uint64."""
    import numpy as np
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = []
    for chunk in chunks:
        ch = chunk.cast(pa.large_string()) if chunk.type != pa.large_string() else chunk
        if len(ch) == 0:
            continue
        bufs = ch.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64)[ch.offset: ch.offset + len(ch)]
        data = np.frombuffer(bufs[2], dtype=np.uint8)
        out.append(np.ascontiguousarray(data[offsets[:, None] + np.arange(8)]).view("<u8").ravel())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def columns_of(case: str, tables, names: dict | None = None) -> dict:
    """The columns the orchestrator verifies, from an iterable of pyarrow tables / batches."""
    import numpy as np

    names = names or {}
    parts: dict[str, list] = {}
    nblocks = 0
    for t in tables:
        nblocks += 1
        if t.num_rows == 0:
            continue
        if case == "groupby":
            cols = {"key": t.column("key"), "sum": t.column(names.get("sum", "sum(v)")),
                    "count": t.column(names.get("count", "count()")), "mean": t.column(names.get("mean", "mean(v)"))}
            arrays = {k: np.asarray(v.to_numpy()) for k, v in cols.items()}
        elif case == "join":
            arrays = {k: np.asarray(t.column(k).to_numpy()) for k in ("key", "v", "w")}
        elif case in ("sort_big", "shuffle_big"):
            arrays = {"key": np.asarray(t.column("key").to_numpy()), "v": np.asarray(t.column("v").to_numpy()),
                      "fp": fingerprint(t.column("payload"))}
        else:
            arrays = {"key": np.asarray(t.column("key").to_numpy()), "f64": np.asarray(t.column("f64").to_numpy()),
                      "fp": fingerprint(t.column("s"))}
        for k, v in arrays.items():
            parts.setdefault(k, []).append(v)
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["nblocks"] = np.array([nblocks])
    return out


# --------------------------------------------------------------------------------- worker harness


class Box:
    """What a side's job returns: the materialized result, the time of the operation alone
    (in-memory sides) and anything else to report."""

    def __init__(self, value, op_time: float | None = None, extra: dict | None = None):
        self.value, self.op_time, self.extra = value, op_time, extra or {}


def drive(a: dict, side: str, ops: dict, extract, version: str, settle=None) -> dict:
    """Time each case of ``a["cases"]``: ``ops[case](small)`` runs the job (small: on the warm-up
    input) and returns a :class:`Box`; ``extract(case, value)`` -> pyarrow tables / batches;
    ``settle()``, before each clock starts, waits until the memory of results dropped before it
    is given back (a side that frees in the background)."""
    import numpy as np
    import pyarrow as pa

    out: dict = {"version": version, "pyarrow": pa.__version__, "numpy": np.__version__, "cases": {}}
    for case in a["cases"]:
        fn = ops.get(case)
        if fn is None:
            out["cases"][case] = {"status": f"not run: no {case} on {side}"}
            continue
        big = GROUP[case] != "a"
        warm = fn(True) if big else fn(False)  # untimed: workers up, imports done
        del warm
        times, op_times, cpu_times, peaks, samples_first = [], [], [], [], []
        result = None
        for _ in range(a["big_runs"] if big else a["runs"]):
            result = None
            gc.collect()
            if settle is not None:
                settle()
            with bc.TreeMemorySampler(0.05) as sampler:
                c0, t0 = bc.tree_cpu_s(), time.perf_counter()
                result = fn(False)
                times.append(time.perf_counter() - t0)
                c1 = bc.tree_cpu_s()
            if c0 is not None and c1 is not None:
                cpu_times.append(c1 - c0)
            peaks.append(sampler.peaks())
            if result.op_time is not None:
                op_times.append(result.op_time)
            if sampler.samples:
                samples_first.append(sampler.samples[0][1] + sampler.samples[0][3])
        res: dict = {"times": times, "cpu_times": cpu_times, "mem": peaks, "start_rss_shm_bytes": samples_first,
                     **result.extra}
        if op_times:
            res["op_times"] = op_times
        cols = columns_of(case, extract(case, result.value), a.get("names"))
        res["rows"] = len(cols["key"]) if "key" in cols else 0
        res["blocks"] = int(cols["nblocks"][0])
        np.savez(Path(a["results"]) / f"{case}-{side}.npz", **cols)
        del result, cols
        gc.collect()
        out["cases"][case] = res
    return out


def _paths(a: dict, case: str, small: bool) -> tuple[str, str | None]:
    d = a["data"][GROUP[case]]
    if GROUP[case] == "c":
        return (first_file(d["left"]), first_file(d["right"])) if small else (d["left"], d["right"])
    return (first_file(d["path"]) if small else d["path"]), None


def ray_api_plan(read_parquet, aggs: tuple, case: str, left: str, right: str | None, **join_kw):
    """The case as a Ray Data plan (dataflow and Ray Data share the API); ``aggs`` = the
    engine's (Sum, Count, Mean); ``join_kw`` = extra ``join`` arguments."""
    agg_sum, agg_count, agg_mean = aggs
    ds = read_parquet(left)
    if case in ("shuffle", "shuffle_big"):
        return ds.random_shuffle(seed=SEED)
    if case in ("sort", "sort_big"):
        return ds.sort("key")
    if case == "repartition":
        return ds.repartition(NBLOCKS)
    if case == "groupby":
        return ds.groupby("key").aggregate(agg_sum("v"), agg_count(), agg_mean("v"))
    return ds.join(read_parquet(right), "inner", on=("key",), **join_kw)


def _glob(path: str) -> str:
    """A folder as the glob of its Parquet files (polars, Daft); a file as itself."""
    return path if path.endswith(".parquet") else path + "/*.parquet"


# ---------------------------------------------------------------------------------------- raw


def run_raw(a: dict) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def job(case):
        def fn(small):
            left, right = _paths(a, case, small)
            t = pq.read_table(left)
            r = pq.read_table(right) if right else None
            t0 = time.perf_counter()
            if case in ("shuffle", "shuffle_big"):
                res = t.take(np.random.default_rng(SEED).permutation(t.num_rows))
            elif case in ("sort", "sort_big"):
                res = t.sort_by("key")
            elif case == "repartition":
                t = t.combine_chunks()
                edges = np.linspace(0, t.num_rows, NBLOCKS + 1).astype(np.int64)
                res = [t.slice(edges[k], edges[k + 1] - edges[k]) for k in range(NBLOCKS)]
            elif case == "groupby":
                res = t.group_by("key").aggregate([("v", "sum"), ("v", "count"), ("v", "mean")])
            else:
                res = t.join(r, "key", join_type="inner")
            return Box(res, time.perf_counter() - t0)
        return fn

    def extract(case, value):
        return value if isinstance(value, list) else [value]

    a["names"] = {"sum": "v_sum", "count": "v_count", "mean": "v_mean"}
    return drive(a, "raw", {c: job(c) for c in ALL_CASES}, extract, f"pyarrow {pa.__version__}")


# ------------------------------------------------------------------------------------- polars


def run_polars(a: dict) -> dict:
    import polars as pl

    def job(case):
        def fn(small):
            left, right = _paths(a, case, small)
            t = pl.read_parquet(_glob(left))
            r = pl.read_parquet(_glob(right)) if right else None
            t0 = time.perf_counter()
            if case in ("shuffle", "shuffle_big"):
                res = t.sample(fraction=1.0, shuffle=True, seed=SEED)
            elif case in ("sort", "sort_big"):
                res = t.sort("key", maintain_order=True)
            elif case == "groupby":
                res = t.group_by("key").agg(pl.col("v").sum().alias("sum"), pl.len().alias("count"),
                                            pl.col("v").mean().alias("mean"))
            else:
                res = t.join(r, on="key", how="inner")
            return Box(res, time.perf_counter() - t0)
        return fn

    def extract(case, value):
        return [value.to_arrow()]

    a["names"] = {"sum": "sum", "count": "count", "mean": "mean"}
    ops = {c: job(c) for c in ALL_CASES if c != "repartition"}
    return drive(a, "polars", ops, extract, f"polars {pl.__version__}")


# ----------------------------------------------------------------------------------- dataflow


def run_dataflow(a: dict) -> dict:
    import dataflow
    from dataflow.aggregate import Count, Mean, Sum

    store = a.get("store_bytes") if any(GROUP[c] == "b" for c in a["cases"]) else None
    dataflow.init(num_cpus=a["num_cpus"], object_store_memory=store)
    bc.wait_for_dataflow_workers()

    def job(case):
        def fn(small):
            ds = ray_api_plan(dataflow.read_parquet, (Sum, Count, Mean), case, *_paths(a, case, small))
            res = ds.materialize()
            st = getattr(ds, "_last_stats", None)
            extra = {}
            if st is not None:
                extra = {"operators": [{"name": op.name, "tasks": op.tasks, "task_wall_s": round(op.task_wall_s, 3),
                                        "task_cpu_s": round(op.task_cpu_s, 3), "peak_held_bytes": op.peak_held_bytes,
                                        "waits": {k: round(v, 3) for k, v in op.waits.items()}}
                                       for op in st.operators]}
            return Box(res, extra=extra)
        return fn

    def extract(case, ds):
        return ds.iter_batches(batch_size=None, batch_format="pyarrow")

    try:
        return drive(a, "dataflow", {c: job(c) for c in ALL_CASES}, extract, f"dataflow from {dataflow.__file__}",
                     settle=bc.settle_dataflow)
    finally:
        dataflow.shutdown()


# ---------------------------------------------------------------------------------------- ray


def _exit_when_gone(names: tuple[str, ...]):
    """Exit this process if one of its child processes called ``names`` dies.

    A ``ray stop`` run elsewhere on the machine kills every Ray cluster on it, this one too;
    the driver then waits for its GCS forever. Watching the GCS and raylet turns that into an
    error at once instead of a hang until the side's timeout. Set the returned event before
    shutting Ray down.
    """
    import threading

    import psutil

    watched = [p for p in psutil.Process().children() if p.name() in names]
    done = threading.Event()

    def watch():
        while not done.wait(2):
            for p in watched:
                try:
                    alive = p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    alive = False
                if not alive:
                    print(f"{p.name()} (pid {p.pid}) died: Ray was stopped from outside; giving up",
                          file=sys.stderr, flush=True)
                    os._exit(3)

    threading.Thread(target=watch, daemon=True, name="bench-ray-watch").start()
    return done


def _init_ray_alone():
    """``ray.init`` that always starts a cluster of its own, in a temp folder of its own.

    Plain ``ray.init()`` joins a cluster another user started on this machine (it reads
    /tmp/ray/ray_current_cluster), which then disappears under it when that user stops it. A
    start that has not finished in 180 s exits the process instead of hanging.
    """
    import logging
    import threading

    import ray

    started = threading.Event()

    def give_up():
        if not started.wait(180):
            print("ray.init did not return in 180 s; giving up", file=sys.stderr, flush=True)
            os._exit(3)

    threading.Thread(target=give_up, daemon=True, name="bench-ray-init").start()
    temp_dir = tempfile.mkdtemp(prefix="ray-a2a-")
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             _temp_dir=temp_dir)
    started.set()
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    for attr in ("print_on_execution_start", "verbose_stats_logs"):
        if hasattr(ctx, attr):
            setattr(ctx, attr, False)
    return ray, temp_dir


def run_ray(a: dict) -> dict:
    ray, temp_dir = _init_ray_alone()
    watching = _exit_when_gone(("gcs_server", "raylet"))
    from ray.data.aggregate import Count, Mean, Sum

    def job(case):
        def fn(small):
            ds = ray_api_plan(ray.data.read_parquet, (Sum, Count, Mean), case, *_paths(a, case, small),
                              num_partitions=RAY_JOIN_PARTITIONS)
            return Box(ds.materialize())
        return fn

    def extract(case, ds):
        return ds.iter_batches(batch_size=None, batch_format="pyarrow")

    try:
        return drive(a, "ray", {c: job(c) for c in ALL_CASES}, extract, ray.__version__)
    finally:
        watching.set()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------- daft


def run_daft(a: dict) -> dict:
    import daft
    from daft import col

    def job(case):
        def fn(small):
            left, right = _paths(a, case, small)
            df = daft.read_parquet(_glob(left))
            if case in ("shuffle", "shuffle_big"):
                df = df.shuffle(seed=SEED)
            elif case in ("sort", "sort_big"):
                df = df.sort("key")
            elif case == "groupby":
                df = df.groupby("key").agg(col("v").sum().alias("sum"), col("v").count().alias("count"),
                                           col("v").mean().alias("mean"))
            else:
                df = df.join(daft.read_parquet(_glob(right)), on="key", how="inner")
            return Box(df.collect())
        return fn

    def extract(case, df):
        return (p.to_arrow() for p in df.iter_partitions())

    a["names"] = {"sum": "sum", "count": "count", "mean": "mean"}
    # the native runner makes repartition() and into_partitions() no-ops (it warns so)
    ops = {c: job(c) for c in ALL_CASES if c != "repartition"}
    return drive(a, "daft", ops, extract, daft.__version__)


IMPLS = {"raw": run_raw, "polars": run_polars, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


# ------------------------------------------------------------------------------- verification


def _load(results: Path, case: str, side: str) -> dict | None:
    import numpy as np

    p = results / f"{case}-{side}.npz"
    if not p.exists():
        return None
    with np.load(p) as z:
        return {k: z[k] for k in z.files}


def _rows_sorted(cols: dict, fields: tuple[str, ...]):
    import numpy as np

    order = np.lexsort(tuple(cols[f] for f in reversed(fields)))
    return {f: cols[f][order] for f in fields}


def _same(x: dict, y: dict, fields: tuple[str, ...]) -> bool:
    import numpy as np

    return all(len(x[f]) == len(y[f]) and np.array_equal(x[f], y[f]) for f in fields)


def verify(case: str, got: dict | None, ref: dict | None, input_keys=None) -> tuple[bool | None, str]:
    """(exact?, description) of one side's result against the reference side's."""
    import numpy as np

    if got is None:
        return None, "no result"
    if ref is None:
        return None, "no reference result (its side did not run)"
    n, nref = len(got["key"]), len(ref["key"])
    if n != nref:
        return False, f"{n:,} rows, reference {nref:,}"
    if case == "groupby":
        g, r = _rows_sorted(got, ("key", "count", "sum", "mean")), _rows_sorted(ref, ("key", "count", "sum", "mean"))
        if not _same(g, r, ("key", "count", "sum")):
            bad = int(np.sum((g["key"] != r["key"]) | (g["count"] != r["count"]) | (g["sum"] != r["sum"])))
            return False, f"{n:,} groups; {bad:,} differ in key, count or sum"
        rel = float(np.max(np.abs(g["mean"] - r["mean"]) / np.maximum(np.abs(r["mean"]), 1e-300))) if n else 0.0
        ok = rel <= 1e-12
        return ok, f"{n:,} groups; keys, counts, sums equal; mean max rel err {rel:.1e}"
    if case == "join":
        fields = ("key", "v", "w")
        ok = _same(_rows_sorted(got, fields), _rows_sorted(ref, fields), fields)
        return ok, f"{n:,} rows; sorted rows {'equal' if ok else 'DIFFER'}"
    value = "v" if GROUP[case] == "b" else "f64"
    fields = ("key", value, "fp")
    multiset = _same(_rows_sorted(got, fields), _rows_sorted(ref, fields), fields)
    text = f"{n:,} rows; rows {'same' if multiset else 'DIFFERENT'} as a multiset"
    if case in ("sort", "sort_big"):
        keys_ok = np.array_equal(got["key"], ref["key"])
        stable = _same(got, ref, fields)
        text += (f"; key order {'equal' if keys_ok else 'DIFFERS'}"
                 f"; whole rows {'in polars stable order' if stable else 'not in stable order (ties differ)'}")
        return multiset and keys_ok, text
    if input_keys is not None and len(input_keys) == n:
        moved = float(np.mean(got["key"] != input_keys))
        text += f"; {moved:.1%} of rows moved"
        if case == "repartition":
            blocks = int(got["nblocks"][0])
            text += f" (order kept: {moved == 0.0}), {blocks} blocks"
            return multiset and blocks == NBLOCKS, text
        return multiset and moved > 0.5, text
    return multiset, text


# ------------------------------------------------------------------------------- orchestrator


def _summarise(res: dict) -> None:
    if not res.get("times"):
        return
    res["median_s"] = bc.median(res["times"])
    if res.get("op_times"):
        res["op_median_s"] = bc.median(res["op_times"])
    if res.get("cpu_times"):
        res["cpu_median_s"] = bc.median(res["cpu_times"])
    mem = res.get("mem") or []
    for key in ("peak_rss_shm_bytes", "peak_anon_shm_bytes", "peak_shm_bytes", "peak_spill_bytes"):
        vals = [m[key] for m in mem if key in m]
        if vals:
            res[key.replace("_bytes", "_gb")] = max(vals) / 1e9
    if res.get("start_rss_shm_bytes"):
        res["start_rss_shm_gb"] = min(res["start_rss_shm_bytes"]) / 1e9


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.set_defaults(sides=",".join(SIDES), timeout=1200)
    ap.add_argument("--cases", default=",".join(ALL_CASES), help=f"subset of {','.join(ALL_CASES)}")
    ap.add_argument("--big-runs", type=int, default=1, help="timed runs of the 4M-row cases (groups b, c)")
    ap.add_argument("--store-mb", type=int, default=256, help="dataflow object_store_memory for group b (MiB)")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2, help="dataflow.init(num_cpus=...)")
    ap.add_argument("--tmp", type=Path, default=None, help="parent folder of the generated data (default: system temp)")
    ap.add_argument("--keep-data", action="store_true", help="do not delete the generated data")
    ap.add_argument("--dictionary", action="store_true",
                    help="write group a's files dictionary-encoded (pyarrow's default) instead of plain")
    args = ap.parse_args()
    scale = 1 / 20 if args.small else 1.0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if bad := [c for c in cases if c not in ALL_CASES]:
        raise SystemExit(f"unknown cases {bad}")
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if bad := [s for s in sides if s not in SIDES]:
        raise SystemExit(f"unknown sides {bad}")
    root = Path(tempfile.mkdtemp(prefix="bench-a2a-", dir=args.tmp))
    results_dir = root / "results"
    results_dir.mkdir()
    problems: list[str] = []
    try:
        t0 = time.perf_counter()
        print(f"[all_to_all] generating data in {root} ...", file=sys.stderr, flush=True)
        data = generate(root, scale, {GROUP[c] for c in cases}, args.dictionary)
        gen_s = time.perf_counter() - t0
        for g in data.values():
            for key in ("path", "left", "right"):
                if key in g:
                    bc.warm_page_cache(Path(g[key]))
        # one worker process per side for group a (its cases share the data), one per big case
        batches = ([[c for c in cases if GROUP[c] == "a"]] if any(GROUP[c] == "a" for c in cases) else [])
        batches += [[c] for c in cases if GROUP[c] != "a"]
        out: dict[str, dict[str, dict]] = {c: {} for c in cases}
        for batch in batches:
            for side in sides:
                print(f"[all_to_all] {','.join(batch)} {side} ...", file=sys.stderr, flush=True)
                wargs = {"cases": batch, "data": data, "runs": args.runs, "big_runs": args.big_runs,
                         "results": str(results_dir), "store_bytes": args.store_mb << 20,
                         "num_cpus": args.num_cpus}
                load_before = os.getloadavg()[0]
                res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
                res["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                for case in batch:
                    if res.get("status") == "ok":
                        r = dict(res["cases"][case], side=side, version=res.get("version"),
                                 pyarrow=res.get("pyarrow"), numpy=res.get("numpy"), python=res.get("python"))
                        r["status"] = r.get("status", "ok")
                        if r["status"].startswith("not run"):
                            r["not_run"] = r["status"]
                    else:
                        r = {k: v for k, v in res.items() if k != "cases"}
                    r["loadavg_1m"] = res["loadavg_1m"]
                    _summarise(r)
                    out[case][side] = r
        # verification against polars (the reference), then ratios
        import pyarrow.parquet as pq

        input_keys = {g: pq.read_table(data[g]["path"], columns=["key"]).column("key").to_numpy()
                      for g in ("a", "b") if g in data}
        notes = []
        for case in cases:
            ref_side = "polars" if case != "repartition" else "raw"
            ref = _load(results_dir, case, ref_side)
            lines = []
            for side, r in out[case].items():
                if r.get("status") != "ok":
                    continue
                ok, text = verify(case, _load(results_dir, case, side), ref, input_keys.get(GROUP[case]))
                r["verified"], r["verify"] = ok, text
                lines.append(f"  {side}: {'exact' if ok else ('?' if ok is None else 'WRONG')}: {text}")
                if side == "dataflow" and ok is False:
                    problems.append(f"PROBLEM: dataflow {case}: {text}")
            dfv = out[case].get("dataflow", {}).get("median_s")
            for r in out[case].values():
                if dfv and r.get("median_s"):
                    r["df_ratio"] = dfv / r["median_s"]
            notes.append(f"verify {case} (against {ref_side}):")
            notes += lines
        for case in cases:
            df = out[case].get("dataflow")
            if df is None:
                continue
            if df.get("status") != "ok":
                problems.append(f"PROBLEM: dataflow {case}: {bc.status_text(df)}")
            if df.get("operators"):
                notes.append(f"dataflow {case} operators: " + "; ".join(
                    f"{op['name']} {op['tasks']} tasks, task wall {op['task_wall_s']} s" for op in df["operators"]))
        target_fast = {"text": "dataflow faster than Daft", "kind": "ratio", "baseline": "daft", "max": 1.0,
                       "metric": "median_s"}
        target_polars = {"text": "dataflow <= 2x polars in memory", "kind": "ratio", "baseline": "polars",
                         "max": 2.0, "metric": "median_s"}
        targets = {c: t for c, t in (("shuffle", target_fast), ("sort", target_fast), ("sort_big", target_polars),
                                     ("groupby", target_polars)) if c in cases}
        notes += problems
        bc.report_cases(
            "all_to_all", out, baseline="polars", targets=targets,
            columns=[("dataflow / side", "df_ratio", "n"), ("op only (in memory)", "op_median_s", "s"),
                     ("tree CPU", "cpu_median_s", "s"),
                     ("rows", "rows", "int"), ("peak RSS+shm", "peak_rss_shm_gb", "GB"),
                     ("peak anon+shm", "peak_anon_shm_gb", "GB"), ("peak /dev/shm", "peak_shm_gb", "GB"),
                     ("peak spill", "peak_spill_gb", "GB")],
            extra={"scale": scale, "data": data, "generate_s": gen_s, "runs": args.runs,
                   "big_runs": args.big_runs, "store_mb": args.store_mb, "num_cpus": args.num_cpus},
            json_out=args.json_out, notes=notes)
    finally:
        if not args.keep_data:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"[all_to_all] data kept in {root}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
