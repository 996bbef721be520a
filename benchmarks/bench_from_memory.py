"""Data already in the driver: ``from_arrow`` and ``from_pandas`` of tables up to ~1 GB, then a sum.

Cases (``--cases``, default both) at each size of ``--mb`` (default 16, 192, 960; ``--small``:
16): a table of two columns (``id`` int64, ``x`` float64) built before the clock (a pandas
DataFrame for ``from_pandas``), then, timed:

    dataflow: dataflow.from_arrow(t).sum("id")  /  dataflow.from_pandas(df).sum("id")
    ray:      ray.data.from_arrow(t).sum("id")  /  ray.data.from_pandas(df).sum("id")
    daft:     daft.from_arrow(t).sum("id").to_pydict()  /  daft.from_pandas(df)...
    raw:      the table written to one Arrow IPC file in /dev/shm and read back mapped, then
              ``pyarrow.compute.sum``: the floor of putting the data where worker processes
              can read it (``from_pandas`` first converts the frame, as every side must)

Every side's sum is checked against ``n * (n - 1) / 2``. Each side runs in its own process,
engine started first (dataflow's workers up, ``ray.init``); one untimed run per case and size,
then ``--runs`` timed ones (median); ``peak RSS+shm`` is the process tree's peak over the
timed runs (``benchcommon.TreeMemorySampler``). dataflow writes the blocks into shared memory
from the driver (``Backend.put``, as Ray's ``ray.put``): before that, every block went to a
worker inside its read task, and a table from about 96 MB up failed (the slices pickled whole).
"""

from __future__ import annotations

import os
import sys
import time

import benchcommon as bc

CASES = ("from_arrow", "from_pandas")
ROW_BYTES = 16


def _table(mb: int):
    import numpy as np
    import pyarrow as pa

    n = mb * 1_000_000 // ROW_BYTES
    return pa.table({"id": np.arange(n, dtype=np.int64), "x": np.arange(n, dtype=np.float64)})


def _inputs(case: str, mb: int):
    table = _table(mb)
    return (table, table.num_rows) if case == "from_arrow" else (table.to_pandas(), table.num_rows)


def _measure(job, a: dict) -> dict:
    """``job(case, data) -> sum`` for every case and size: {case: {mb: result}}."""
    out: dict = {}
    for case in a["cases"]:
        for mb in a["mb"]:
            try:
                data, n = _inputs(case, mb)
                job(case, data)  # untimed: imports, the first use of shared memory
                with bc.TreeMemorySampler() as mem:
                    times, total = bc.timed_runs(lambda data=data, case=case: job(case, data), a["runs"])
            except Exception as err:  # (a side without pandas, say): the other cases still run
                out.setdefault(case, {})[str(mb)] = {"status": "error", "error": f"{type(err).__name__}: {err}"}
                continue
            want = n * (n - 1) // 2
            status = "ok" if total == want else f"PROBLEM: sum {total}, expected {want}"
            out.setdefault(case, {})[str(mb)] = {"times": times, "status": status, **mem.peaks()}
            del data
    return out


def run_raw(a: dict) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    def job(case: str, data) -> int:
        table = data if case == "from_arrow" else pa.Table.from_pandas(data, preserve_index=False)
        path = f"/dev/shm/bench-from-memory-{os.getpid()}.arrow"
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            with pa.memory_map(path) as source:
                return pc.sum(pa.ipc.open_file(source).read_all().column("id")).as_py()
        finally:
            os.unlink(path)

    return {"cases": _measure(job, a)}


def run_dataflow(a: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    bc.wait_for_dataflow_workers()
    out = _measure(lambda case, data: getattr(dataflow, case)(data).sum("id"), a)
    bc.maybe_shutdown(dataflow)
    return {"cases": out}


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = _measure(lambda case, data: getattr(ray.data, case)(data).sum("id"), a)
    ray.shutdown()
    return {"cases": out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    def job(case: str, data) -> int:
        return daft.from_arrow(data).sum("id").to_pydict()["id"][0] if case == "from_arrow" else \
            daft.from_pandas(data).sum("id").to_pydict()["id"][0]

    return {"cases": _measure(job, a), "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    parser = bc.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--mb", default="16,192,960", help="table sizes in MB, comma-separated")
    args = parser.parse_args()
    mbs = [16] if args.small else [int(x) for x in args.mb.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    wargs = {"cases": cases, "mb": mbs, "runs": args.runs}
    per_side = {}
    for side in bc.sides(args):
        print(f"[from_memory] {side} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        per_side[side] = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        per_side[side]["process_s"] = time.perf_counter() - t0
    table: dict[str, dict[str, dict]] = {}
    for case in cases:
        for mb in mbs:
            results = {}
            for side, res in per_side.items():
                one = dict(res.get("cases", {}).get(case, {}).get(str(mb), {}))
                if not one:
                    one = {"status": res.get("status", "no result")}
                if one.get("times"):
                    one["median_s"] = bc.median(one["times"])
                    one["peak_gb"] = one.get("peak_rss_shm_bytes", 0) / 1e9
                results[side] = one
            table[f"{case} {mb} MB"] = results
    bc.report_cases("from_memory", table, columns=[("peak RSS+shm GB", "peak_gb", "")],
                    extra={"mb": mbs, "runs": args.runs}, json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
