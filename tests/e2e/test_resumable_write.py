"""Resumable writes: ``write_*(..., mode="resume")`` killed at any point and run again ends
with the files an uninterrupted run writes, file for file and row for row."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from connectors.resumable_write import ResumeMismatchError

ROOT = Path(__file__).parents[2]

JOB = """
    import sys, time
    import dataflow

    src, dst, kind = sys.argv[1:4]
    dataflow.init(num_cpus=2)

    def slow(batch):
        time.sleep(0.05)
        return {"id": batch["id"], "part": (batch["id"] % 3).astype(str), "v": batch["id"] * 3 + 1}

    class Model:
        def __init__(self):
            self.k = 7

        def __call__(self, batch):
            time.sleep(0.05)
            return {"id": batch["id"], "v": batch["id"] * self.k}

    ds = dataflow.read_parquet(src)
    if kind == "tasks":
        ds = ds.map_batches(slow, batch_size=100).filter(lambda r: r["id"] % 7 != 3)
        ds.write_parquet(dst, mode="resume", max_rows_per_file=150, partition_cols=["part"])
    else:
        ds.map_batches(Model, batch_size=64, concurrency=1).write_parquet(dst, mode="resume")
    print("done", flush=True)
"""


def _make_input(folder: Path, files: int = 16, rows: int = 400) -> Path:
    folder.mkdir()
    for i in range(files):
        ids = pa.array(range(i * rows, (i + 1) * rows), pa.int64())
        pq.write_table(pa.table({"id": ids}), folder / f"part-{i:03d}.parquet")
    return folder


def _output(folder: Path) -> dict[str, pa.Table]:
    """Every data file under ``folder`` (relative name -> table), the manifest left out."""
    found = {}
    for path in sorted(folder.rglob("*.parquet")):
        relative = path.relative_to(folder).as_posix()
        if not relative.startswith("_"):
            found[relative] = pq.read_table(path, partitioning=None)
    return found


def _assert_same_output(out: Path, ref: Path) -> None:
    got, want = _output(out), _output(ref)
    assert sorted(got) == sorted(want)
    for name, table in want.items():
        assert got[name].equals(table), name
    for folder in (out, ref):
        assert (folder / "_SUCCESS").exists()
        assert not [p for p in folder.iterdir() if p.name.startswith("_staging")]
        assert json.loads((folder / "_resume" / "job.json").read_text())["complete"] is True


def _run_job(script: Path, src: Path, dst: Path, kind: str, kill_after: float | None) -> bool:
    """Run the job in a driver process; SIGKILL the driver after ``kill_after`` seconds (then
    wait until its workers are gone too). True when it ran to the end."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(src), str(dst), kind],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DATAFLOW_PROGRESS": "off"},
    )
    try:
        out, err = proc.communicate(timeout=kill_after if kill_after is not None else 120)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        _, alive = psutil.wait_procs(tree, timeout=15)
        assert not alive, f"the killed driver's processes outlived it: {alive}"
        return False
    assert proc.returncode == 0, err[-3000:]
    assert "done" in out
    return True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["tasks", "actors"])
def test_a_write_killed_at_random_points_resumes_to_the_uninterrupted_output(kind, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    src = _make_input(tmp_path / "src", files=24)
    ref, out = tmp_path / "ref", tmp_path / "out"
    started = time.monotonic()
    assert _run_job(script, src, ref, kind, None)
    duration = time.monotonic() - started
    rng = random.Random(f"resume-{kind}")
    committed: list[int] = []
    kills = 4 if kind == "tasks" else 3  # an actor pool's runs start slower: fewer, for time
    for _ in range(kills):  # killed at random points: start-up, reading, staging, committing units
        if _run_job(script, src, out, kind, rng.uniform(0.3, 0.6 * duration)):
            break
        committed.append(len(list((out / "_resume" / "units").glob("??????.json"))))
    assert len(committed) >= kills - 2 and committed[0] < 24, f"the job ({duration:.1f} s) ended before most kills: {committed}"
    assert _run_job(script, src, out, kind, None)
    _assert_same_output(out, ref)
    rows = pa.concat_tables(_output(out).values(), promote_options="permissive")
    assert rows.num_rows == len(set(rows["id"].to_pylist())) == (8229 if kind == "tasks" else 9600)


def _write(ds: dataflow.Dataset, dst: Path, **kwargs) -> None:
    ds.write_parquet(str(dst), mode="resume", **kwargs)


def test_resume_skips_committed_units_and_rewrites_the_rest(mode, tmp_path):
    src = _make_input(tmp_path / "src", files=8, rows=100)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ds = dataflow.read_parquet(str(src)).map(lambda r: {"id": r["id"], "twice": r["id"] * 2})
    _write(ds, ref)
    _write(ds, out)
    units = out / "_resume" / "units"
    assert len(list(units.glob("*.json"))) == 8
    # as if the driver had been killed while units 2, 5 and 6 were being written
    job = json.loads((out / "_resume" / "job.json").read_text())
    (out / "_resume" / "job.json").write_text(json.dumps({**job, "complete": False}))
    for unit in (2, 5, 6):
        record = json.loads((units / f"{unit:06d}.json").read_text())
        (units / f"{unit:06d}.json").unlink()
        for relative in record["files"]:
            (out / relative).unlink()
    (out / "_SUCCESS").unlink()
    ds = dataflow.read_parquet(str(src)).map(lambda r: {"id": r["id"], "twice": r["id"] * 2})
    _write(ds, out)
    assert ds._last_stats is not None and ds._last_stats.operators[-1].rows_out == 300  # 3 units of 100 rows
    _assert_same_output(out, ref)


def test_resume_undoes_a_half_committed_unit(mode, tmp_path):
    src = _make_input(tmp_path / "src", files=4, rows=50)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ds = dataflow.read_parquet(str(src))
    _write(ds, ref)
    _write(ds, out)
    units = out / "_resume" / "units"
    job_id = json.loads((out / "_resume" / "job.json").read_text())["fingerprint"][:16]
    # killed between putting unit 1's files in place and recording it: an intent, no record,
    # its files in place, one of them a name the re-run will not write; and a staging folder
    record = json.loads((units / "000001.json").read_text())
    (units / "000001.json").unlink()
    stray = f"{job_id}_000001_0007.parquet"
    pq.write_table(pa.table({"id": [-1]}), out / stray)
    (units / "000001.intent.json").write_text(json.dumps({"unit": 1, "files": [*record["files"], stray]}))
    (out / f"_staging-{job_id}" / "000001-0").mkdir(parents=True)
    _write(dataflow.read_parquet(str(src)), out)
    assert not (out / stray).exists()
    assert not (units / "000001.intent.json").exists()
    _assert_same_output(out, ref)


def test_a_completed_job_run_again_writes_nothing(mode, tmp_path):
    src = _make_input(tmp_path / "src", files=3, rows=20)
    out = tmp_path / "out"
    _write(dataflow.read_parquet(str(src)), out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    ds = dataflow.read_parquet(str(src))
    _write(ds, out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == before
    assert ds._last_stats is not None and ds._last_stats.operators[-1].rows_out == 0


def test_resume_refuses_another_job_in_the_same_folder(mode, tmp_path):
    src = _make_input(tmp_path / "src", files=3, rows=20)
    out = tmp_path / "out"
    _write(dataflow.read_parquet(str(src)), out)
    pq.write_table(pa.table({"id": [1000]}), src / "part-999.parquet")  # the input changed
    with pytest.raises(ResumeMismatchError, match=r"not the job recorded in .*_resume"):
        _write(dataflow.read_parquet(str(src)), out)
    with pytest.raises(ResumeMismatchError, match="not the job recorded"):  # so did the plan
        _write(dataflow.read_parquet(str(src)).map(lambda r: r).filter(lambda r: True), out)


def test_resume_refuses_what_it_cannot_resume_by_unit(mode, tmp_path):
    ds = dataflow.range(100)
    with pytest.raises(ValueError, match=r"mode='resume'.*Sort"):
        ds.sort("id").write_parquet(str(tmp_path / "a"), mode="resume")
    with pytest.raises(ValueError, match=r"mode='resume'.*Limit"):
        ds.limit(10).write_parquet(str(tmp_path / "b"), mode="resume")
    with pytest.raises(ValueError, match="min_rows_per_file"):
        ds.write_parquet(str(tmp_path / "c"), mode="resume", min_rows_per_file=10)
    with pytest.raises(ValueError, match="mode must be one of"):
        ds.write_lance(str(tmp_path / "d"), mode="resume")
    assert not any((tmp_path / name).exists() and any((tmp_path / name).rglob("*.parquet")) for name in "abc")


def test_a_unit_split_over_many_tasks_is_written_by_one(mode, tmp_path, monkeypatch):
    """A read task's rows come out as several small blocks and each block is a task of the map
    (tiny bundles, a map that does not fuse with the read): a unit's blocks reach the write
    from several tasks, at different times, and are still written, named and committed
    together."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        table = pa.table({"id": pa.array(range(i * 2000, (i + 1) * 2000), pa.int64())})
        pq.write_table(table, src / f"part-{i}.parquet", row_group_size=250)
    options = dataflow.DataContext.get_current().execution_options
    monkeypatch.setattr(options, "min_task_input_bytes", 1)
    monkeypatch.setattr(options, "target_max_block_size", 4096)
    ds = dataflow.read_parquet(str(src)).map_batches(lambda b: {"id": b["id"], "v": b["id"] % 5}, num_cpus=0.5)
    out = tmp_path / "out"
    _write(ds, out, max_rows_per_file=900)
    assert ds._last_stats is not None and ds._last_stats.operators[-2].tasks > 3  # the map split the units
    records = [json.loads(p.read_text()) for p in sorted((out / "_resume" / "units").glob("??????.json"))]
    assert [(r["unit"], r["rows"], len(r["files"])) for r in records] == [(0, 2000, 3), (1, 2000, 3), (2, 2000, 3)]
    table = pa.concat_tables(_output(out).values())
    assert sorted(table["id"].to_pylist()) == list(range(6000))


@pytest.mark.s3
def test_resume_on_s3(s3_engine, tmp_path):
    """On an object store: units are committed with copies and one-request records."""
    src = _make_input(tmp_path / "src", files=4, rows=50)
    ds = dataflow.read_parquet(str(src)).map(lambda r: {"id": r["id"], "v": r["id"] + 1})
    ds.write_parquet("s3://test-bucket/ref", mode="resume")
    ds.write_parquet("s3://test-bucket/out", mode="resume")
    records = sorted(k for k in s3_engine.keys("out/_resume/units/") if k.endswith(".json"))
    assert len(records) == 4
    # as if killed mid-job: unit 3's record and files gone, job not complete
    record = json.loads(s3_engine.client.get_object(Bucket="test-bucket", Key=records[3])["Body"].read())
    for key in [records[3], "out/_SUCCESS"] + [f"out/{relative}" for relative in record["files"]]:
        s3_engine.client.delete_object(Bucket="test-bucket", Key=key)
    ds = dataflow.read_parquet(str(src)).map(lambda r: {"id": r["id"], "v": r["id"] + 1})
    ds.write_parquet("s3://test-bucket/out", mode="resume")
    assert ds._last_stats is not None and ds._last_stats.operators[-1].rows_out == 50

    def data(prefix: str) -> dict[str, bytes]:
        keys = [k for k in s3_engine.keys(prefix + "/") if not k.split("/", 1)[1].startswith("_")]
        return {k.split("/", 1)[1]: s3_engine.client.get_object(Bucket="test-bucket", Key=k)["Body"].read() for k in keys}

    got, want = data("out"), data("ref")
    assert sorted(got) == sorted(want) and len(want) == 4
    for name in want:
        assert pq.read_table(pa.BufferReader(got[name])).equals(pq.read_table(pa.BufferReader(want[name])))
    assert "out/_SUCCESS" in s3_engine.keys("out/")
    assert not [k for k in s3_engine.keys("out/") if "_staging" in k]
