"""Fresh-process startup: ``python -c "import dataflow; print(dataflow.range(10).take(1))"``.

Each sample is a new interpreter. Per side:

    python (bare):  python -c "pass"
    pyarrow import: python -c "import pyarrow"                     (the baseline)
    dataflow:       import dataflow; print(dataflow.range(10).take(1))
    ray:            import ray.data; print(ray.data.range(10).take(1))   (auto-starts Ray)
    daft:           import daft; print(daft.range(10).limit(1).to_pylist())

Numbers (medians of ``--runs`` fresh processes):

* ``wall_s``: spawn to exit of the subprocess, as a user's shell sees it (includes interpreter
  start, imports, engine start, the query, and shutdown at exit).
* ``ttfr_s``: spawn to the moment the first row was printed (child's ``time.time()`` minus the
  parent's just before spawning).
* ``ttfr_inproc_s``: the same, measured from the first line of the ``-c`` program (interpreter
  start excluded).

Target: dataflow ``wall_s`` < 0.35 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import benchcommon as bc

PROLOGUE = "import time as _t\n_t0 = _t.perf_counter()\n"
EPILOGUE = "\nprint('@@TTFR', _t.time(), _t.perf_counter() - _t0, flush=True)\n"
SNIPPETS = {
    "python (bare)": "pass",
    "pyarrow import": "import pyarrow",
    "dataflow": "import dataflow; print(dataflow.range(10).take(1))",
    "ray": "import ray.data; print(ray.data.range(10).take(1))",
    "daft": "import daft; print(daft.range(10).limit(1).to_pylist())",
}
SIDE_SNIPPETS = {"raw": ["python (bare)", "pyarrow import"], "dataflow": ["dataflow"],
                 "ray": ["ray"], "daft": ["daft"]}


def _one(code: str, timeout: float) -> dict:
    program = PROLOGUE + code + EPILOGUE
    t_spawn = time.time()
    p = subprocess.run([sys.executable, "-c", program], check=False, capture_output=True, text=True,
                       timeout=timeout, env=os.environ.copy())
    wall = time.time() - t_spawn
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    out: dict = {"wall_s": wall}
    for line in p.stdout.splitlines():
        if line.startswith("@@TTFR"):
            _, t_abs, inproc = line.split()
            out["ttfr_s"] = float(t_abs) - t_spawn
            out["ttfr_inproc_s"] = float(inproc)
        elif line.strip():
            out["first_output"] = line.strip()[:200]
    return out


def _worker(side: str):
    def run(a: dict) -> dict:
        res = {}
        for name in SIDE_SNIPPETS[side]:
            _one(SNIPPETS[name], a["timeout"])  # unmeasured: warm the page cache for the imports
            samples = [_one(SNIPPETS[name], a["timeout"]) for _ in range(a["runs"])]
            errs = [s["error"] for s in samples if "error" in s]
            if errs:
                res[name] = {"status": "error", "error": errs[0]}
                continue
            entry = {"status": "ok", "samples": samples, "first_output": samples[-1].get("first_output")}
            for key in ("wall_s", "ttfr_s", "ttfr_inproc_s"):
                vals = [s[key] for s in samples if key in s]
                entry[key] = bc.median(vals)
            res[name] = entry
        return {"programs": res}

    return run


IMPLS = {side: _worker(side) for side in SIDE_SNIPPETS}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0], default_runs=5)
    args = ap.parse_args()
    results = {}
    for side in bc.sides(args):
        print(f"[startup] {side} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, {"runs": args.runs, "timeout": 300},
                             timeout=args.timeout)
        if res.get("status") != "ok":
            results[SIDE_SNIPPETS[side][-1]] = res
            continue
        for name, entry in res["programs"].items():
            entry["python"] = res.get("python")
            results[name] = entry
    bc.report("startup", results, metric="wall_s", baseline="pyarrow import",
              target={"text": "dataflow wall < 0.35 s", "kind": "abs", "max": 0.35,
                      "metric": "wall_s"},
              extra={"runs": args.runs, "snippets": SNIPPETS},
              columns=[("time to first row", "ttfr_s", "s"), ("ttfr from -c start", "ttfr_inproc_s", "s")],
              json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
