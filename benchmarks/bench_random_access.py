"""Random access by key: ``to_random_access_dataset``, then lookups one at a time and in bulk.

The data, made in each side's process before any clock: N rows (default 1,000,000; 100,000 with
``--small``) of ``key`` (a seeded permutation of 0..N-1, so the input is not sorted), ``value``
(= key / 2) and ``payload`` (float64), given as 16 Arrow tables (Ray keeps them as 16 blocks;
dataflow groups inputs this small into fewer, 9 at 1M rows: ``input_blocks`` in its result, and
``sorted_blocks``, the blocks its lookups search). Three cases, each
timed per run (median of ``--runs``):

* ``build``:  ``from_arrow(table).to_random_access_dataset("key", num_workers=2)`` (the sort and
  the index), or, for ``raw``, a sort of the table by ``key`` and its key column as numpy;
* ``get``:    2,000 keys looked up one after another (``get_async(k)`` and waiting for it: Ray's
  ``ray.get``, dataflow's ``.result()``; ``raw``: ``np.searchsorted`` and one row as a dict);
* ``multiget``: 100,000 keys in one call, 1 % of them absent (``raw``: one ``searchsorted`` of all
  the keys and a ``take``).

    raw:      pyarrow + numpy in one process (the floor);
    dataflow: ``dataflow.from_arrow(...).to_random_access_dataset``;
    ray:      the same with ``ray.data`` (actors serve the lookups).

Every side's answers are checked (each found row's ``value`` is its key / 2; absent keys give
None): a wrong answer is a ``PROBLEM:`` line and exit code 1.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc

BLOCKS = 16
GETS = 2_000
MULTI = 100_000


def make_table(rows: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(11)
    keys = rng.permutation(rows).astype(np.int64)
    return pa.table({"key": keys, "value": keys / 2, "payload": rng.random(rows)})


def probe_keys(rows: int):
    """The keys each side looks up: ``GETS`` present ones, and ``MULTI`` with 1 % absent."""
    import numpy as np

    rng = np.random.default_rng(12)
    gets = rng.integers(0, rows, GETS).tolist()
    multi = rng.integers(0, rows, MULTI)
    multi[rng.random(MULTI) < 0.01] = -1 - rng.integers(0, 1000)  # absent: below every key
    return gets, multi.tolist()


def check(rows_found: list, keys: list) -> str | None:
    """None when every row answers its key, else what is wrong."""
    for key, row in zip(keys, rows_found, strict=True):
        if key < 0:
            if row is not None:
                return f"absent key {key} gave {row}"
        elif row is None or row["key"] != key or row["value"] != key / 2:
            return f"key {key} gave {row}"
    return None


def _cases(build, get, multiget, args: dict) -> dict:
    """Time the three cases over ``args["runs"]`` runs; check every answer."""
    gets, multi = probe_keys(args["rows"])
    out: dict = {"build": [], "get": [], "multiget": []}
    problems = []
    for _ in range(args["runs"]):
        t0 = time.perf_counter()
        index = build()
        out["build"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        found = [get(index, k) for k in gets]
        out["get"].append(time.perf_counter() - t0)
        problems.append(check(found, gets))
        t0 = time.perf_counter()
        many = multiget(index, multi)
        out["multiget"].append(time.perf_counter() - t0)
        problems.append(check(many, multi))
        del index
    return {"times": out, "problem": next((p for p in problems if p), None)}


def run_raw(args: dict) -> dict:
    import numpy as np

    table = make_table(args["rows"])

    def build():
        ordered = table.sort_by("key")
        return ordered, ordered.column("key").to_numpy()

    def lookup(index, keys: list) -> list:
        ordered, sorted_keys = index
        wanted = np.asarray(keys)
        at = np.minimum(np.searchsorted(sorted_keys, wanted), len(sorted_keys) - 1)
        hit = sorted_keys[at] == wanted
        rows = ordered.take(at[hit]).to_pylist()
        out: list = [None] * len(keys)
        for position, row in zip(np.flatnonzero(hit).tolist(), rows, strict=True):
            out[position] = row
        return out

    return _cases(build, lambda index, k: lookup(index, [k])[0], lookup, args)


def run_dataflow(args: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    bc.wait_for_dataflow_workers()
    table = make_table(args["rows"])
    source = dataflow.from_arrow([table.slice(i * len(table) // BLOCKS, len(table) // BLOCKS) for i in range(BLOCKS)])

    def build():
        return source.to_random_access_dataset("key", num_workers=2)

    result = _cases(build, lambda rad, k: rad.get_async(k).result(), lambda rad, keys: rad.multiget(keys), args)
    with build() as rad:  # what was measured: the source's blocks and the sorted ones searched
        result.update(input_blocks=source.num_blocks(), sorted_blocks=len(rad._blocks))
    bc.maybe_shutdown(dataflow)
    return result


def run_ray(args: dict) -> dict:
    ray = bc.init_ray()
    table = make_table(args["rows"])
    source = ray.data.from_arrow([table.slice(i * len(table) // BLOCKS, len(table) // BLOCKS) for i in range(BLOCKS)])

    def build():
        return source.to_random_access_dataset("key", num_workers=2)

    result = _cases(build, lambda rad, k: ray.get(rad.get_async(k)), lambda rad, keys: rad.multiget(keys), args)
    result["version"] = ray.__version__
    ray.shutdown()
    return result


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="default 1,000,000 (100,000 with --small)")
    args = ap.parse_args()
    rows = args.rows or (100_000 if args.small else 1_000_000)
    wargs = {"rows": rows, "runs": args.runs}
    cases: dict[str, dict] = {"build": {}, "get": {}, "multiget": {}}
    problems = []
    for side in bc.sides(args):
        if side == "daft":
            for case in cases:
                cases[case][side] = {"status": "not run (Daft has no random access by key)"}
            continue
        print(f"[random_access] {side} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("problem"):
            problems.append(f"PROBLEM: {side}: {res['problem']}")
        for case in cases:
            times = (res.get("times") or {}).get(case)
            entry = {k: v for k, v in res.items() if k != "times"}
            if times:
                entry["times"] = times
                entry["median_s"] = bc.median(times)
                per = {"get": GETS, "multiget": MULTI}.get(case)
                if per:
                    entry["us_per_key"] = entry["median_s"] / per * 1e6
            cases[case][side] = entry
    bc.report_cases("random_access", cases, metric="median_s",
                    columns=[("us/key", "us_per_key", "")],
                    targets={"get": {"text": "dataflow faster than Ray Data", "kind": "ratio", "max": 1.0,
                                     "baseline": "ray"},
                             "multiget": {"text": "dataflow faster than Ray Data", "kind": "ratio", "max": 1.0,
                                          "baseline": "ray"}},
                    extra={"rows": rows, "runs": args.runs, "gets": GETS, "multiget_keys": MULTI})
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
