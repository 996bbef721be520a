"""WebDataset and TFRecords ingest against each format's own reader and Ray Data.

Case ``webdataset``: 8 tar shards of 400 samples (a 224x224 RGB JPEG and a class label each,
about 60 MB): read -> decode the images -> torch batches of 256 -> touch every batch.

    dataflow:   read_webdataset(dir).select_columns(["jpg", "cls"]).iter_torch_batches(batch_size=256)
    webdataset: the library's own loader, as its README shows it: WebDataset(shards).decode("rgb8")
                .to_tuple("jpg", "cls").batched(256) in WebLoader(num_workers=2) (one worker per core)
    ray:        ray.data.read_webdataset(dir).select_columns(...).iter_torch_batches(batch_size=256)

Case ``tfrecords``: 4 files of 100,000 ``tf.train.Example`` records (an int label, 16 floats, a
float weight and a bytes id; about 50 MB): read every record into numpy batches of 4096.

    dataflow:   read_tfrecords(dir).iter_batches(batch_size=4096, batch_format="numpy")
    tensorflow: tf.data.TFRecordDataset(files).batch(4096).map(tf.io.parse_example) (TF's own reader)
    ray:        ray.data.read_tfrecords(dir).iter_batches(...) (its reader parses with TensorFlow)

Peers run in their own venvs (git-ignored), each made with its packages from the local wheels:

    python3.11 -m venv benchmarks/.venvs/wds && benchmarks/.venvs/wds/bin/pip install webdataset torch==2.13.0 pillow
    benchmarks/.venvs/ray/bin/pip install pillow torch==2.13.0 tensorflow-cpu   # on top of setup_peers.sh's

A side whose venv or package is missing is reported as not run. Targets: webdataset: dataflow
<= 1.2x the webdataset loader and faster than Ray Data; tfrecords: faster than Ray Data.
Data are made once under benchmarks/data/ (``--rebuild`` makes them again).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import benchcommon as bc

WDS_DATA = bc.DATA_DIR / "wds_jpeg224"
TFR_DATA = bc.DATA_DIR / "tfrecords400k"
SHARDS, PER_SHARD, SIZE = 8, 400, 224
TFR_FILES, TFR_PER_FILE = 4, 100_000


# ----- data --------------------------------------------------------------------------------------


def make_wds(out: Path) -> None:
    """Shards written with ``tarfile`` (not by dataflow): ``s<i>.jpg`` (quality 90) and ``s<i>.cls``."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    for shard in range(SHARDS):
        with tarfile.open(out / f"shard-{shard:04d}.tar", "w") as tar:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                base = np.stack([(xx + i) % 256, (yy * 2 + i) % 256, (xx + yy) % 256], axis=-1)
                image = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(image).save(buf, format="JPEG", quality=90)
                for name, data in ((f"s{i:06d}.jpg", buf.getvalue()), (f"s{i:06d}.cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def make_tfrecords(out: Path) -> None:
    """TFRecord files written by dataflow's encoder (its framing and Examples match TensorFlow's byte for byte)."""
    import numpy as np
    import pyarrow as pa

    sys.path.insert(0, str(bc.REPO))
    from connectors.tfrecords_format import encode_tfrecords

    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    n = TFR_PER_FILE
    for f in range(TFR_FILES):
        table = pa.table({
            "label": rng.integers(0, 1000, n),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 16, dtype=np.float32)), 16),
            "weight": rng.random(n, dtype=np.float32),
            "id": [f"rec-{f}-{i:08d}".encode() for i in range(n)],
        })
        (out / f"part-{f:02d}.tfrecords").write_bytes(encode_tfrecords(table))


# ----- sides -------------------------------------------------------------------------------------


def _touch(batch: dict) -> int:
    """Rows in a batch of tensors, after reading one value of each (so nothing stays lazy)."""
    n = 0
    for value in batch.values() if isinstance(batch, dict) else batch:
        n = len(value)
        _ = value[0] if n else None
    return n


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0

    def drain_wds() -> int:
        ds = dataflow.read_webdataset(a["data"]).select_columns(["jpg", "cls"])
        return sum(_touch(b) for b in ds.iter_torch_batches(batch_size=a["batch_size"]))

    def drain_tfr() -> int:
        ds = dataflow.read_tfrecords(a["data"])
        return sum(_touch(b) for b in ds.iter_batches(batch_size=a["batch_size"], batch_format="numpy"))

    times, rows = bc.timed_runs(drain_wds if a["case"] == "webdataset" else drain_tfr, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "rows": rows, "init_s": init_s}


def run_wds(a: dict) -> dict:
    try:
        import webdataset as wds
    except ImportError:
        return {"not_run": "not run: no webdataset in benchmarks/.venvs/wds (see this script's docstring)"}
    from importlib.metadata import version

    shards = sorted(str(p) for p in Path(a["data"]).glob("*.tar"))

    def drain() -> int:
        dataset = (
            wds.WebDataset(shards, shardshuffle=False, empty_check=False)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
            .batched(a["batch_size"], partial=True)
        )
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
        return sum(_touch(b) for b in loader)

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "version": version("webdataset")}


def run_ray(a: dict) -> dict:
    needs = ("torch", "PIL") if a["case"] == "webdataset" else ("tensorflow",)
    missing = [m for m in needs if not _importable(m)]
    if missing:
        return {"not_run": f"not run: no {', '.join(missing)} in the Ray venv (see this script's docstring)"}
    if a.get("reader") == "tensorflow":
        return _run_tensorflow(a)
    ray = _init_ray()

    def drain_wds() -> int:
        ds = ray.data.read_webdataset(a["data"]).select_columns(["jpg", "cls"])
        return sum(_touch(b) for b in ds.iter_torch_batches(batch_size=a["batch_size"]))

    def drain_tfr() -> int:
        ds = ray.data.read_tfrecords(a["data"])
        return sum(_touch(b) for b in ds.iter_batches(batch_size=a["batch_size"], batch_format="numpy"))

    times, rows = bc.timed_runs(drain_wds if a["case"] == "webdataset" else drain_tfr, a["runs"])
    ray.shutdown()
    return {"times": times, "rows": rows, "version": ray.__version__}


def _init_ray():
    """``bc.init_ray`` in a new local Ray: a plain ``ray.init()`` joins the Ray instance this machine
    started last (``/tmp/ray/ray_current_cluster``), such as another test's, and may wait forever."""
    import os

    os.environ["RAY_ADDRESS"] = "local"
    return bc.init_ray()


def _run_tensorflow(a: dict) -> dict:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    files = sorted(str(p) for p in Path(a["data"]).glob("*.tfrecords"))
    spec = {
        "label": tf.io.FixedLenFeature([], tf.int64),
        "features": tf.io.FixedLenFeature([16], tf.float32),
        "weight": tf.io.FixedLenFeature([], tf.float32),
        "id": tf.io.FixedLenFeature([], tf.string),
    }

    def drain() -> int:
        ds = tf.data.TFRecordDataset(files, num_parallel_reads=2).batch(a["batch_size"])
        ds = ds.map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=2)
        return sum(_touch({k: v.numpy() for k, v in b.items()}) for b in ds)

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "version": tf.__version__}


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


IMPLS = {"dataflow": run_dataflow, "wds": run_wds, "ray": run_ray}


def _run_case(case: str, data: Path, sides: list[tuple[str, str, dict]], args) -> dict[str, dict]:
    import peers

    results: dict[str, dict] = {}
    for label, side, extra in sides:
        wargs = {"case": case, "data": str(data), "runs": args.runs, **extra}
        print(f"[{case}] {label} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("not_run"):
            res["status"] = res["not_run"]
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["rows_per_s"] = res["rows"] / res["median_s"]
        results[label] = res
    return results


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--cases", default="webdataset,tfrecords")
    ap.add_argument("--rebuild", action="store_true", help="make the data sets again")
    args = ap.parse_args()
    cases = {c.strip() for c in args.cases.split(",")}
    out: dict[str, dict[str, dict]] = {}
    targets = {}
    if "webdataset" in cases:
        if args.rebuild or not WDS_DATA.exists():
            make_wds(WDS_DATA)
        for p in WDS_DATA.glob("*.tar"):
            p.read_bytes()
        sides = [("webdataset", "wds", {"batch_size": 256}), ("dataflow", "dataflow", {"batch_size": 256}),
                 ("ray", "ray", {"batch_size": 256})]
        out["webdataset"] = _run_case("webdataset", WDS_DATA, sides, args)
        targets["webdataset"] = {"text": "dataflow <= 1.2x the webdataset loader", "kind": "ratio", "max": 1.2,
                                 "baseline": "webdataset"}
    if "tfrecords" in cases:
        if args.rebuild or not TFR_DATA.exists():
            make_tfrecords(TFR_DATA)
        for p in TFR_DATA.glob("*.tfrecords"):
            p.read_bytes()
        sides = [("tensorflow", "ray", {"batch_size": 4096, "reader": "tensorflow"}),
                 ("dataflow", "dataflow", {"batch_size": 4096}),
                 ("ray", "ray", {"batch_size": 4096, "runs": 1})]  # ~100x slower: one run is enough
        out["tfrecords"] = _run_case("tfrecords", TFR_DATA, sides, args)
        targets["tfrecords"] = {"text": "dataflow faster than Ray Data", "kind": "ratio", "max": 1.0, "baseline": "ray"}
    baselines = {"webdataset": "webdataset", "tfrecords": "tensorflow"}
    for case, results in out.items():
        bc.print_side_table(case, results, "median_s", baselines[case], "s",
                            [("rows/s", "rows_per_s", "int")], targets.get(case), fmt=bc.fmt_num)
        if "ray" in results and results["ray"].get("median_s") and results["dataflow"].get("median_s"):
            ratio = results["dataflow"]["median_s"] / results["ray"]["median_s"]
            print(f"dataflow / ray: {ratio:.2f}x ({'ahead' if ratio < 1 else 'behind'})")
    bc._emit_json({"workload": "webdataset_tfrecords", "targets": targets, "cases": out},
                  {"runs": args.runs}, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
