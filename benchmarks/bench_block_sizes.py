"""Pool utilisation and peak memory by block size (1, 16, 64, 128, 256 MiB blocks).

For each block size S (``--sizes`` in MiB) the job is

    ds = (dataflow.range(n * 64, override_num_blocks=n)
          .map_batches(make_payload, batch_size=None)            # a float64 (64, S/512) column: S bytes
          .map_batches(work, batch_size=None, concurrency=num_cpus, fn_kwargs={"passes": p}))
    for batch in ds.iter_batches(batch_size=None): ...          # fast: nothing; slow: sleep

``work`` is CPU-bound numpy over the payload (``y = x*x``, then ``p`` times ``y += 1; sqrt(y)`` in
place; its output is another S-byte block). ``p`` is calibrated per size by the ``raw`` side so
one block costs about ``--task-s`` (0.3) CPU-seconds: every size does the same work per block,
only the bytes moved differ. ``concurrency=num_cpus`` (no tighter than the pool) keeps ``work``
from fusing into the payload tasks, so S-byte blocks go producer -> /dev/shm -> ``work`` ->
/dev/shm -> driver. ``n`` = min(8 x num_cpus, 4 GiB / S), at least num_cpus.

Engine options for the run (``dataflow.options``): ``min_task_input_bytes=1`` (the range read
tasks describe 512 bytes each; bundled, one task would make all the payloads) and
``target_max_block_size=max(128 MiB, 2 S)`` (256 MiB blocks would otherwise be split in two).
``object_store_memory`` is left at the default (30 % of RAM) unless ``--object-store-gib``.

Measured, one fresh process per (size, consumer):

* ``wall``: first pull to last block; ``util``: the ``work`` operator's task wall seconds /
  (wall x num_cpus), from ``ds._last_handle.stats()``; ``util all``: the same over every
  operator; ``in flight``: mean ``work`` tasks running (task wall / wall); ``eff``: the raw
  side's serial CPU-seconds for the same blocks / (wall x num_cpus) (how close to the ideal
  2-core run).
* memory, sampled every ``--interval`` (0.05) s by a thread in the driver: the RSS of the
  driver and every descendant, their ``RssAnon``, and the bytes of the session's /dev/shm folder
  (and of its spill folder). ``RSS+shm`` counts a mapped block twice (in the mapping
  process's RSS and in /dev/shm); ``anon+shm`` counts it once. ``idle`` is the same sum after a
  warm-up job, before the run.
* a slow consumer (sleeps ``--sleep-s``, 0.6 s, per block; the 2 workers make one every ~0.15 s)
  must keep memory bounded: ``shm blocks`` is the peak of /dev/shm in blocks of S.

    raw: one process, the same make_payload + work per block in a plain loop (no engine): the
         calibration and the serial CPU-seconds per block.
"""

from __future__ import annotations

import os
import sys
import time

import benchcommon as bc

MiB = 1 << 20
GiB = 1 << 30
ROWS = 64  # rows per block; the payload row is S / 64 bytes


def make_payload(batch, width: int):
    import numpy as np

    i0 = int(batch["id"][0])
    x = np.arange(ROWS * width, dtype=np.float64).reshape(ROWS, width)
    x *= 1.0 / (ROWS * width)
    x += i0
    return {"x": x}


def work(batch, passes: int):
    import numpy as np

    x = batch["x"]
    y = np.multiply(x, x)
    for _ in range(passes):
        y += 1.0
        np.sqrt(y, out=y)
    return {"x": y}


def _width(size_mib: int) -> int:
    return size_mib * MiB // (8 * ROWS)


def run_raw(a: dict) -> dict:
    """Calibrate ``passes`` so one block's work takes ~task_s; time payload + work per block."""
    import numpy as np

    width = _width(a["size_mib"])
    ids = {"id": np.arange(ROWS, dtype=np.int64)}

    def t_work(p: int) -> float:
        b = make_payload(ids, width)
        t0 = time.process_time()
        work(b, p)
        return time.process_time() - t0

    t_work(1)  # page in the allocator
    passes = 1
    for _ in range(4):  # rescale until one block's work is within 10 % of task_s
        t = min(t_work(passes) for _ in range(2))
        if abs(t - a["task_s"]) < 0.1 * a["task_s"] or (passes == 1 and t > a["task_s"]):
            break
        passes = max(1, round(passes * a["task_s"] / max(t, 1e-6)))
    blocks_s, payload_s = [], []
    for k in range(3):
        t0 = time.process_time()
        b = make_payload({"id": np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)}, width)
        t1b = time.process_time()
        work(b, passes)
        blocks_s.append(time.process_time() - t0)
        payload_s.append(t1b - t0)
    return {"passes": passes, "block_cpu_s": bc.median(blocks_s), "payload_cpu_s": bc.median(payload_s),
            "work_cpu_s": bc.median(blocks_s) - bc.median(payload_s)}


def run_dataflow(a: dict) -> dict:
    import dataflow

    size = a["size_mib"] * MiB
    n, cpus = a["blocks"], a["num_cpus"]
    init = {"num_cpus": cpus}
    if a.get("object_store_bytes"):
        init["object_store_memory"] = a["object_store_bytes"]
    dataflow.init(**init)
    dataflow.range(1000, override_num_blocks=cpus).map_batches(lambda b: b).count()  # workers up
    time.sleep(0.3)
    sampler = bc.TreeMemorySampler(a["interval"])
    idle = sampler.sample()
    with dataflow.options(min_task_input_bytes=1, target_max_block_size=max(128 * MiB, 2 * size)):
        ds = (dataflow.range(n * ROWS, override_num_blocks=n)
              .map_batches(make_payload, batch_size=None, fn_kwargs={"width": _width(a["size_mib"])})
              .map_batches(work, batch_size=None, concurrency=cpus, fn_kwargs={"passes": a["passes"]}))
        got, nbytes, first = 0, 0, None
        with sampler:
            t0 = time.perf_counter()
            for batch in ds.iter_batches(batch_size=None):
                if first is None:
                    first = time.perf_counter() - t0
                got += 1
                nbytes += batch["x"].nbytes
                if a["sleep_s"]:
                    time.sleep(a["sleep_s"])
            wall = time.perf_counter() - t0
        st = ds._last_handle.stats()
    ops = [{"name": op.name, "tasks": op.tasks, "task_wall_s": op.task_wall_s, "task_cpu_s": op.task_cpu_s,
            "peak_held_bytes": op.peak_held_bytes, "bytes_out": op.bytes_out,
            "waits": {str(k): v for k, v in dict(op.waits).items()}} for op in st.operators]
    dataflow.shutdown()
    work_ops = [o for o in ops if "work" in o["name"]]
    w = work_ops[-1] if work_ops else max(ops, key=lambda o: o["task_wall_s"])
    out = {"wall_s": wall, "stats_wall_s": st.wall_s, "first_block_s": first, "blocks_out": got,
           "mean_block_bytes": nbytes / got if got else 0, "operators": ops, "work_op": w["name"],
           "work_tasks": w["tasks"], "util": w["task_wall_s"] / (wall * cpus),
           "util_all": sum(o["task_wall_s"] for o in ops) / (wall * cpus),
           "cpu_util_all": sum(o["task_cpu_s"] for o in ops) / (wall * cpus),
           "in_flight": w["task_wall_s"] / wall,
           "idle_rss_shm_bytes": idle[1] + idle[3], "idle_anon_shm_bytes": idle[2] + idle[3]}
    out.update(sampler.peaks())
    out["series"] = [(round(s[0], 2), s[1], s[2], s[3], s[4]) for s in sampler.samples[:: max(1, len(sampler.samples) // 400)]]
    return out


IMPLS = {"raw": run_raw, "dataflow": run_dataflow}


def _gib(x) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0], default_runs=1)
    ap.set_defaults(timeout=300.0)
    ap.add_argument("--sizes", default="1,16,64,128,256", help="block sizes in MiB")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--blocks", type=int, default=None, help="blocks per size (default min(8 x cpus, 4 GiB / S))")
    ap.add_argument("--max-gib", type=float, default=4.0, help="cap on the data per size")
    ap.add_argument("--task-s", type=float, default=0.3, help="CPU-seconds of work per block")
    ap.add_argument("--sleep-s", type=float, default=0.6, help="slow consumer: sleep per block")
    ap.add_argument("--interval", type=float, default=0.05, help="memory sampling period (s)")
    ap.add_argument("--object-store-gib", type=float, default=None, help="dataflow.init(object_store_memory=...)")
    ap.add_argument("--no-slow", action="store_true", help="skip the slow-consumer runs")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    cpus = args.num_cpus
    rows, results, problems = [], {}, []
    for s in sizes:
        n = args.blocks or max(cpus, min(8 * cpus, int(args.max_gib * GiB // (s * MiB))))
        print(f"[block_sizes] {s} MiB: raw calibration ...", file=sys.stderr, flush=True)
        raw = peers.run_side(__file__, "raw", {"size_mib": s, "task_s": args.task_s}, timeout=args.timeout)
        entry = {"size_mib": s, "blocks": n, "raw": raw}
        results[str(s)] = entry
        if raw.get("status") != "ok":
            problems.append(f"{s} MiB raw: {bc.status_text(raw)}")
            continue
        wargs = {"size_mib": s, "blocks": n, "num_cpus": cpus, "passes": raw["passes"], "interval": args.interval,
                 "object_store_bytes": int(args.object_store_gib * GiB) if args.object_store_gib else None}
        for consumer, sleep_s in (("fast", 0.0), ("slow", args.sleep_s)):
            if consumer == "slow" and args.no_slow:
                continue
            print(f"[block_sizes] {s} MiB x {n}: dataflow, {consumer} consumer ...", file=sys.stderr, flush=True)
            res = peers.run_side(__file__, "dataflow", dict(wargs, sleep_s=sleep_s), timeout=args.timeout)
            if res.get("status") == "ok":
                res["eff"] = n * raw["block_cpu_s"] / (res["wall_s"] * cpus)
                res["peak_shm_blocks"] = res.get("peak_shm_bytes", 0) / (s * MiB)
                if res["blocks_out"] != n or abs(res["mean_block_bytes"] - s * MiB) > 0.01 * s * MiB:
                    problems.append(f"{s} MiB {consumer}: got {res['blocks_out']} blocks of "
                                    f"{res['mean_block_bytes'] / MiB:.1f} MiB, expected {n} of {s}")
                if res["work_tasks"] < n:
                    problems.append(f"{s} MiB {consumer}: {res['work_tasks']} work tasks for {n} blocks")
            else:
                problems.append(f"{s} MiB {consumer}: {bc.status_text(res)} (after {res.get('process_wall_s', 0):.0f} s)")
            entry[consumer] = res
        f, sl = entry.get("fast", {}), entry.get("slow", {})
        ok = f.get("status") == "ok"
        rows.append([
            f"{s} MiB", str(n), str(f.get("work_tasks", "-")), str(raw["passes"]), f"{raw['block_cpu_s']:.3f}",
            f"{f['wall_s']:.2f}" if ok else bc.status_text(f)[:40],
            f"{n * raw['block_cpu_s'] / cpus:.2f}",
            f"{100 * f['util']:.0f}" if ok else "-", f"{100 * f['util_all']:.0f}" if ok else "-",
            f"{100 * f['eff']:.0f}" if ok else "-", f"{f['in_flight']:.2f}" if ok else "-",
            _gib(f.get("idle_anon_shm_bytes")),
            _gib(f.get("peak_rss_shm_bytes")), _gib(f.get("peak_anon_shm_bytes")),
            (f"{_gib(sl.get('peak_rss_shm_bytes'))} / {_gib(sl.get('peak_anon_shm_bytes'))}"
             if sl.get("status") == "ok" else bc.status_text(sl)[:40] if sl else "-"),
            f"{sl['peak_shm_blocks']:.1f}" if sl.get("status") == "ok" else "-",
            _gib(sl.get("peak_spill_bytes")) if sl.get("status") == "ok" else "-",
        ])
    print()
    print(f"== block_sizes: {cpus} CPUs, ~{args.task_s} CPU-s of work per block, slow consumer "
          f"sleeps {args.sleep_s} s per block ==")
    bc.print_table(["block", "blocks", "tasks", "passes", "raw s/block", "wall s", "ideal s", "util %",
                    "util all %", "eff %", "in flight", "idle GiB", "peak RSS+shm GiB", "peak anon+shm GiB",
                    "slow: RSS+shm / anon+shm GiB", "slow: shm blocks", "slow: spill GiB"], rows)
    print("util = work op's task wall / (wall x CPUs); util all = every op's; eff = raw serial "
          "CPU-s / (wall x CPUs); ideal = raw serial CPU-s / CPUs; GiB = 2^30 bytes")
    for p in problems:
        print(f"PROBLEM: {p}")
    obj = {"workload": "block_sizes", "machine": bc.machine_info(), "num_cpus": cpus, "task_s": args.task_s,
           "sleep_s": args.sleep_s, "object_store_gib": args.object_store_gib, "results": results,
           "problems": problems, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    import json

    if args.json_out:  # with the memory time series
        args.json_out.write_text(json.dumps(obj, default=str) + "\n")
    for entry in results.values():
        for consumer in ("fast", "slow"):
            entry.get(consumer, {}).pop("series", None)
    print(json.dumps(obj, default=str))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
