"""The keyword arguments and settings Ray Data scripts pass, with their Ray meaning, on both modes.

Each is honoured, or refused with the reason; none is silently dropped. What Ray 2.60 does was
read from its source (and, for partitions and ``to_pandas``, seen running it).
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from connectors.errors import FileFormatError
from dataflow import ActorPoolStrategy, ExecutionResources, FileShuffleConfig, PathPartitionFilter
from dataflow.errors import ResourceError


def _ids(rows):
    return sorted(r["id"] for r in rows)


# ----- UDF keywords: what is accepted, refused, unknown -----------------------------------------


@pytest.mark.parametrize("method", ["map", "map_batches", "flat_map", "filter"])
def test_an_unknown_keyword_is_a_type_error_naming_it(method):
    ds = dataflow.range(3)
    with pytest.raises(TypeError, match=rf"^{method}\(\) got an unexpected keyword argument 'num_cpu'$"):
        getattr(ds, method)(lambda x: x, num_cpu=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        getattr(ds, method)(lambda x: x, batchsize=8)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"placement_group": "pg"}, "placement groups"),
        ({"scheduling_strategy": object()}, "one machine"),
        ({"label_selector": {"zone": "a"}}, "no node labels"),
        ({"runtime_env": {"pip": ["requests"]}}, r"runtime_env \['pip'\] is not supported"),
        ({"num_returns": 2}, "stream"),
        ({"resources": {"CPU": 2}}, "num_cpus"),
        ({"retry_exceptions": ["not an exception"]}, "retry_exceptions"),
    ],
)
def test_ray_options_without_a_meaning_here_are_refused_with_the_reason(kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        dataflow.range(3).map_batches(lambda b: b, **kwargs)


def test_remote_args_become_plan_resources():
    ds = dataflow.range(3)
    plan = ds.map(lambda r: r, num_cpus=0.5, accelerator_type="A100", resources={"TPU": 1})._plan
    assert plan.resources.num_cpus == 0.5
    assert dict(plan.resources.custom) == {"TPU": 1.0, "accelerator_type:A100": 0.001}  # as Ray
    # named arguments win over **ray_remote_args, what ray_remote_args_fn returns over both
    plan = ds.map_batches(lambda b: b, num_cpus=2, ray_remote_args_fn=lambda: {"num_cpus": 0.25})._plan
    assert plan.resources.num_cpus == 0.25
    with pytest.raises(TypeError, match=r"'num_cpu'.*ray_remote_args_fn"):
        ds.map(lambda r: r, ray_remote_args_fn=lambda: {"num_cpu": 1})
    with pytest.raises(TypeError, match="must return a dict"):
        ds.map(lambda r: r, ray_remote_args_fn=lambda: 3)
    # harmless on one machine: accepted
    ds.map(lambda r: r, scheduling_strategy="SPREAD", name="x", max_restarts=2, enable_task_events=False)


def test_memory_caps_how_many_run_at_once():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    plan = dataflow.range(3).map(lambda r: r, memory=total // 4)._plan
    assert plan.max_concurrency == 2  # 70% of RAM holds two tasks of a quarter each
    with pytest.raises(ValueError, match="could never run"):
        dataflow.range(3).map(lambda r: r, memory=total)


def test_max_calls_is_not_silently_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="dataflow.udf"):
        dataflow.range(3).map(lambda r: r, max_calls=1)
    assert "reuses worker processes" in caplog.text


def test_an_accelerator_type_must_be_offered(mode):
    ds = dataflow.range(4).map(lambda r: r, accelerator_type="A100")
    with pytest.raises(ResourceError, match="accelerator_type:A100"):
        ds.take_all()
    if mode == "local":  # the in-process backend offers what each execution's options say
        with dataflow.options(resources=(("accelerator_type:A100", 1.0),)):
            assert _ids(ds.take_all()) == [0, 1, 2, 3]


def test_remote_args_run(mode):
    ds = dataflow.range(20, override_num_blocks=4).map_batches(
        lambda b: {"id": b["id"] + 1}, num_cpus=0.5, memory=1 << 20, scheduling_strategy="DEFAULT",
        runtime_env={"env_vars": {}}, label_selector={},
    )
    assert _ids(ds.take_all()) == list(range(1, 21))


def test_runtime_env_vars_are_set_while_the_function_runs(mode):
    os.environ.pop("DATAFLOW_TEST_VAR", None)
    ds = dataflow.range(4, override_num_blocks=2).map(
        lambda r: {"id": r["id"], "v": os.environ.get("DATAFLOW_TEST_VAR")},
        runtime_env={"env_vars": {"DATAFLOW_TEST_VAR": "set"}},
    )
    assert {r["v"] for r in ds.take_all()} == {"set"}
    assert "DATAFLOW_TEST_VAR" not in os.environ  # restored after each call


def test_retry_exceptions_retries_the_call(mode, tmp_path):
    def flaky(batch):
        seen = tmp_path / f"seen-{batch['id'][0]}"
        if not seen.exists():  # fails the first time it sees a batch, in any process
            seen.touch()
            raise OSError("transient")
        return batch

    ds = dataflow.range(8, override_num_blocks=4)
    assert _ids(ds.map_batches(flaky, retry_exceptions=[OSError], max_retries=1).take_all()) == list(range(8))
    for seen in tmp_path.iterdir():
        seen.unlink()
    with pytest.raises(OSError, match="transient"):  # not a listed exception type: no retry
        ds.map_batches(flaky, retry_exceptions=[KeyError], max_retries=3).take_all()

    def always(batch):
        raise OSError("always")

    with pytest.raises(OSError, match="always"):  # retries run out
        ds.map_batches(always, retry_exceptions=True, max_retries=2).take_all()


def test_zero_copy_batch_false_hands_writable_batches(mode):
    def bump(batch):
        batch["id"] += 1  # in place
        return batch

    ds = dataflow.range(10, override_num_blocks=2)
    assert _ids(ds.map_batches(bump, zero_copy_batch=False).take_all()) == list(range(1, 11))
    assert _ids(ds.map_batches(bump, batch_format="pandas", zero_copy_batch=False).take_all()) == list(range(1, 11))
    with pytest.raises(ValueError, match="read-only"):  # the default: zero-copy views, as Ray
        ds.map_batches(bump).take_all()


class AddOne:
    def __call__(self, batch):
        return {"id": batch["id"] + 1}


def test_compute_strategies(mode):
    ds = dataflow.range(12, override_num_blocks=3)
    expected = list(range(1, 13))
    assert _ids(ds.map_batches(AddOne, compute="actors").take_all()) == expected
    pool = ActorPoolStrategy(min_size=1, max_size=2, initial_size=1, max_tasks_in_flight_per_actor=2)
    assert _ids(ds.map_batches(AddOne, compute=pool).take_all()) == expected
    assert _ids(ds.map_batches(AddOne, concurrency=(1, 2, 1)).take_all()) == expected  # Ray's (min, max, initial)
    assert _ids(ds.map_batches(lambda b: {"id": b["id"] + 1}, compute="tasks").take_all()) == expected
    with pytest.raises(ValueError, match="cannot run with compute='tasks'"):
        ds.map_batches(AddOne, compute="tasks")
    with pytest.raises(ValueError, match="only a callable class runs on an actor pool"):
        ds.map_batches(lambda b: b, compute=ActorPoolStrategy(size=2))
    with pytest.raises(ValueError, match="initial_size"):
        ActorPoolStrategy(min_size=2, max_size=3, initial_size=5)
    with pytest.raises(ValueError, match="cannot be set at the same time"):
        ActorPoolStrategy(size=2, min_size=1)


def test_filter_expr_takes_the_remote_args(mode):
    ds = dataflow.range(10).filter(expr="id > 5", num_cpus=0.5, concurrency=2)
    assert ds._plan.resources.num_cpus == 0.5 and ds._plan.max_concurrency == 2
    assert _ids(ds.take_all()) == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="are for fn, not expr"):
        dataflow.range(10).filter(expr="id > 5", fn_kwargs={"x": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        dataflow.range(10).filter(expr="id > 5", bogus=1)


# ----- settings ---------------------------------------------------------------------------------


def test_execution_options_are_mutable_as_in_ray(mode):
    ctx = dataflow.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # Ray's idiom; no FrozenInstanceError

    def shuffled_delay(batch):
        time.sleep(0.02 * (3 - int(batch["id"][0]) % 4))
        return batch

    rows = dataflow.range(400, override_num_blocks=8).map_batches(shuffled_delay).take_all()
    assert [r["id"] for r in rows] == list(range(400))
    ctx.execution_options.locality_with_output = True  # Ray's, and true on one machine anyway
    with pytest.raises(AttributeError, match="has no setting 'preserve_ordr'"):
        ctx.execution_options.preserve_ordr = True
    with pytest.raises(AttributeError, match="label_selector"):
        ctx.execution_options.label_selector = {"a": "b"}


class _ReadsConfigAtStart:
    def __init__(self) -> None:
        self.at_start = dataflow.DataContext.get_current().get_config("test.threshold", "unset")

    def __call__(self, batch):
        n = len(batch["id"])
        return {"id": batch["id"], "at_start": [self.at_start] * n,
                "now": [dataflow.DataContext.get_current().get_config("test.threshold", "unset")] * n}


def test_data_context_key_value_configs_reach_every_task(mode, tmp_path):
    """Ray's ``set_config``/``get_config``/``remove_config``/``copy``: UDFs, actors' constructors
    and writers in any process see the driver's values as each execution started."""
    ctx = dataflow.DataContext.get_current()
    ds = dataflow.range(8, override_num_blocks=4)

    def seen(batch):
        return {"v": [dataflow.DataContext.get_current().get_config("test.threshold", "unset")] * len(batch["id"])}

    try:
        ctx.set_config("test.threshold", {"limit": 7})
        assert ctx.get_config("test.threshold") == {"limit": 7} and ctx.get_config("other", 3) == 3
        assert {r["v"]["limit"] for r in ds.map_batches(seen).take_all()} == {7}
        pooled = ds.map_batches(_ReadsConfigAtStart, concurrency=1).take_all()
        assert {(r["at_start"]["limit"], r["now"]["limit"]) for r in pooled} == {(7, 7)}
        ds.map_batches(seen).write_parquet(str(tmp_path / "out"))
        written = dataflow.read_parquet(str(tmp_path / "out")).take_all()
        assert len(written) == 8 and {r["v"]["limit"] for r in written} == {7}
        ctx.set_config("test.threshold", 8)  # the next execution sees the new value
        assert {r["v"] for r in ds.map_batches(seen).take_all()} == {8}
        copied = ctx.copy()
        copied.set_config("test.threshold", 9)
        copied.execution_options.preserve_order = not ctx.execution_options.preserve_order
        assert ctx.get_config("test.threshold") == 8 and copied.get_config("test.threshold") == 9
        assert copied.execution_options.preserve_order != ctx.execution_options.preserve_order
        ctx.remove_config("test.threshold")
        ctx.remove_config("test.threshold")  # (not set: nothing happens)
        assert {r["v"] for r in ds.map_batches(seen).take_all()} == {"unset"}
        ctx.set_config("test.lock", threading.Lock())  # tasks get the configs pickled
        with pytest.raises(TypeError, match=r"config 'test.lock' .*cannot be pickled"):
            ds.map_batches(seen).take_all()
    finally:
        ctx.remove_config("test.threshold")
        ctx.remove_config("test.lock")


def test_retried_map_errors_run_a_failing_task_again(mode, tmp_path):
    """Ray's ``retried_map_errors`` and ``max_map_retries``: a task whose UDF raised a matching
    error runs again (in any process), without losing or repeating rows; other errors, and
    the last of too many, reach the caller saying how many attempts were made."""
    ctx = dataflow.DataContext.get_current()
    marks = tmp_path / "marks"
    ds = dataflow.range(20, override_num_blocks=2)

    def fails_once_per_block(batch):
        mark = marks / str(int(batch["id"][0]))
        if not mark.exists():
            mark.touch()
            raise ConnectionError(f"429 rate limited on block {int(batch['id'][0])}")
        return batch

    def always(batch):
        raise ValueError("rate limited for good")

    try:
        marks.mkdir()
        with pytest.raises(ConnectionError, match="rate limited"):  # Ray's default: no retries
            ds.map_batches(fails_once_per_block).take_all()
        for mark in marks.iterdir():
            mark.unlink()
        ctx.retried_map_errors, ctx.max_map_retries = [r"\b429\b"], 1  # a regular expression
        assert sorted(r["id"] for r in ds.map_batches(fails_once_per_block).take_all()) == list(range(20))
        assert list(marks.iterdir())  # (a first attempt failed in each task)
        for mark in marks.iterdir():
            mark.unlink()
        ctx.retried_map_errors = ["Timeout"]  # matches neither the type nor the message
        with pytest.raises(ConnectionError) as info:
            ds.map_batches(fails_once_per_block).take_all()
        assert "attempts" not in str(info.value)
        ctx.retried_map_errors = True
        with pytest.raises(ValueError, match="rate limited for good") as info:
            ds.map_batches(always).take_all()
        assert "after 2 attempts (DataContext.retried_map_errors)" in str(info.value)
        ctx.max_map_retries = -1
        with pytest.raises(ValueError, match="max_map_retries must be an int >= 0"):
            ds.take_all()
        ctx.max_map_retries, ctx.retried_map_errors = 1, "Timeout"
        with pytest.raises(ValueError, match="retried_map_errors must be True, False or a list"):
            ds.take_all()
    finally:
        ctx.retried_map_errors, ctx.max_map_retries = False, 0


def test_data_context_settings_are_honoured_or_refused(mode):
    ctx = dataflow.DataContext.get_current()
    ctx.target_max_block_size = 8_000  # 1000 int64 rows
    assert ctx.execution_options.target_max_block_size == 8_000
    assert dataflow.range(10_000, override_num_blocks=1).materialize().num_blocks() >= 10
    with pytest.raises(ValueError, match="positive number of bytes"):
        ctx.target_max_block_size = None
    ctx.enable_progress_bars = False  # what Ray scripts set to quiet the bars
    assert ctx.progress_mode == "off" and ctx.enable_progress_bars is False
    ctx.enable_progress_bars = True
    assert ctx.progress_mode == "auto" and ctx.enable_progress_bars is True
    ctx.enable_rich_progress_bars = True
    assert ctx.progress_mode == "rich" and ctx.enable_rich_progress_bars is True
    ctx.enable_rich_progress_bars = False
    assert ctx.progress_mode == "auto"
    with pytest.raises(AttributeError, match=r"has no setting 'lance_config' .*retried_io_errors"):
        ctx.lance_config = object()  # a Ray setting whose intent this engine cannot carry out: refused, saying why
    with pytest.raises(AttributeError, match=r"has no setting 'execution_no_progress_timeout_s' .*task_timeout_s"):
        ctx.execution_no_progress_timeout_s = 60
    with pytest.raises(AttributeError, match=r"'shufle_strategy' \(a Ray Data setting dataflow does not have, or a typo"):
        ctx.shufle_strategy = "x"


def test_ray_settings_that_tune_only_ray_are_kept_and_said_to_do_nothing(caplog):
    """A Ray script's tuning of Ray's own machinery runs unchanged: the value is kept (read back
    as set; Ray's default before), a warning says once why it does nothing, results are the same."""
    ctx = dataflow.DataContext.get_current().copy()
    assert ctx.use_push_based_shuffle is False and ctx.default_hash_shuffle_parallelism == 200
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        ctx.use_push_based_shuffle = True
        ctx.use_push_based_shuffle = True
        ctx.scheduling_strategy = "DEFAULT"
    assert ctx.use_push_based_shuffle is True and ctx.scheduling_strategy == "DEFAULT"
    said = [r.getMessage() for r in caplog.records if "use_push_based_shuffle" in r.getMessage()]
    assert len(said) <= 1  # once per process (an earlier test may have set it first)
    assert all("has no effect in dataflow: Ray's shuffle machinery" in m for m in said)
    assert ctx.copy().scheduling_strategy == "DEFAULT"  # kept by copies
    assert dataflow.DataContext.get_current().scheduling_strategy == "SPREAD"  # not by the context copied from
    with pytest.raises(AttributeError, match="has no attribute 'not_a_setting'"):
        ctx.not_a_setting


class FlakyModel:
    """A constructor that fails its first ``failures`` calls in each process (per ``token``)."""

    calls: dict[str, int] = {}

    def __init__(self, token, failures):
        calls = FlakyModel.calls[token] = FlakyModel.calls.get(token, 0) + 1
        if calls <= failures:
            raise ConnectionError(f"model server busy (call {calls})")
        self.calls = calls

    def __call__(self, batch):
        batch["calls"] = np.full(len(batch["id"]), self.calls)
        return batch


def test_actor_init_retry_on_errors_calls_the_constructor_again(mode):
    """Ray's ``actor_init_retry_on_errors`` and ``actor_init_max_retries``: a constructor that
    raised is called again in the same worker, up to the limit; then its error fails the job."""
    ctx = dataflow.DataContext.get_current()

    def run(failures):
        token = f"{time.monotonic_ns()}-{failures}"
        ds = dataflow.range(20, override_num_blocks=2).map_batches(
            FlakyModel, fn_constructor_args=(token, failures), concurrency=1)
        return ds.take_all()

    with pytest.raises(ConnectionError, match=r"call 1\)") as info:  # off by default, as in Ray
        run(2)
    assert "FlakyModel" in str(info.value)
    try:
        ctx.actor_init_retry_on_errors = True
        rows = run(2)  # 3 calls are allowed by default: the third succeeds
        assert sorted(r["id"] for r in rows) == list(range(20)) and {r["calls"] for r in rows} == {3}
        groups = dataflow.from_items([{"g": i % 2, "id": i} for i in range(10)]).groupby("g").map_groups(
            FlakyModel, fn_constructor_args=(f"groups-{time.monotonic_ns()}", 2))
        assert {r["calls"] for r in groups.take_all()} == {3}  # map_groups' classes too
        ctx.actor_init_max_retries = 1
        with pytest.raises(ConnectionError, match=r"call 2\)"):
            run(2)
        ctx.actor_init_max_retries = -1  # no limit
        assert {r["calls"] for r in run(6)} == {7}
        ctx.actor_init_max_retries = -2
        with pytest.raises(ValueError, match="actor_init_max_retries must be an int >= -1"):
            run(0)
    finally:
        ctx.actor_init_retry_on_errors, ctx.actor_init_max_retries = False, 3


def test_resource_limits_cap_cpus_and_store(mode):
    def timed(batch):
        start = time.monotonic()
        time.sleep(0.15)
        return {"start": [start], "end": [time.monotonic()]}

    ctx = dataflow.DataContext.get_current()
    ctx.execution_options.resource_limits = ExecutionResources(cpu=1, object_store_memory=64 << 20)
    ds = dataflow.range(4, override_num_blocks=4).map_batches(timed)
    spans = sorted((r["start"], r["end"]) for r in ds.take_all())
    assert all(later[0] >= earlier[1] - 0.01 for earlier, later in itertools.pairwise(spans))
    assert ds._last_handle.execution.store_capacity <= 64 << 20
    ctx.execution_options.resource_limits = ExecutionResources.for_limits(gpu=1)
    with pytest.raises(ValueError, match=r"resource_limits\.gpu"):
        dataflow.range(3).take_all()


# ----- reads --------------------------------------------------------------------------------------


def _files_of_ten(path):
    path.mkdir()
    for i in range(10):
        pq.write_table(pa.table({"id": list(range(i * 10, i * 10 + 10))}), path / f"f{i:02d}.parquet")


def _first_ids(ds):
    return [r["id"] for r in ds.take_all()][::10]


def test_read_shuffles_files(mode, tmp_path):
    _files_of_ten(tmp_path / "d")
    dataflow.DataContext.get_current().execution_options.preserve_order = True
    fixed = dataflow.read_parquet(str(tmp_path / "d"), shuffle=FileShuffleConfig(seed=7, reseed_after_execution=False))
    order = _first_ids(fixed)
    assert sorted(order) == list(range(0, 100, 10)) and order != sorted(order)
    assert _first_ids(fixed) == order  # the same seed, the same order, every execution
    reseeded = dataflow.read_parquet(str(tmp_path / "d"), shuffle=FileShuffleConfig(seed=7))
    assert _first_ids(reseeded) != _first_ids(reseeded)  # a new order each execution (Ray's default)
    assert _ids(dataflow.read_parquet(str(tmp_path / "d"), shuffle="files").take_all()) == list(range(100))
    with pytest.raises(ValueError, match="Invalid value for 'shuffle'"):
        dataflow.read_parquet(str(tmp_path / "d"), shuffle="rows")
    with pytest.raises(ValueError, match="Seed must be an integer"):
        FileShuffleConfig(seed="7")


def test_partition_filter_picks_files_before_reading(mode, tmp_path):
    table = pa.table({"id": list(range(30)), "year": [2020 + i % 3 for i in range(30)]})
    dataflow.from_arrow(table).write_parquet(str(tmp_path / "p"), partition_cols=["year"])
    keep = PathPartitionFilter.of(lambda values: values["year"] == "2021")  # values are strings
    ds = dataflow.read_parquet(str(tmp_path / "p"), partition_filter=keep)
    assert ds.count() == 10
    assert _ids(ds.take_all()) == [i for i in range(30) if i % 3 == 1]
    assert all("year=2021" in f for f in ds.input_files())
    with pytest.raises(TypeError, match="PathPartitionFilter"):
        dataflow.read_parquet(str(tmp_path / "p"), partition_filter=lambda d: True)


def test_read_json_lines(mode, tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (tmp_path / "one.json").write_text('{\n  "a": 3,\n  "b": [1, 2]\n}\n')
    (tmp_path / "array.json").write_text('[{"a": 4}, {"a": 5}]')
    assert dataflow.read_json(str(tmp_path / "rows.jsonl"), lines=True).take_all() == [{"a": 1}, {"a": 2}]
    assert dataflow.read_json(str(tmp_path / "one.json")).take_all() == [{"a": 3, "b": [1, 2]}]  # one row, as Ray
    assert dataflow.read_json(str(tmp_path / "array.json")).take_all() == [{"a": 4}, {"a": 5}]
    with pytest.raises(dataflow.DataflowError, match=r"array\.json"):  # lines=True: JSON Lines only
        dataflow.read_json(str(tmp_path / "array.json"), lines=True).take_all()


# ----- results as Ray gives them ----------------------------------------------------------------


def test_hive_partition_columns_are_strings(mode, tmp_path):
    (tmp_path / "year=2022" / "month=09").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), tmp_path / "year=2022" / "month=09" / "f.parquet")
    (tmp_path / "year=2022" / "month=09" / "f.csv").write_text("x\n1\n")
    assert dataflow.read_parquet(str(tmp_path)).take_all() == [{"x": 1, "year": "2022", "month": "09"}]
    assert dataflow.read_csv(str(tmp_path), file_extensions=["csv"]).take_all() == [{"x": 1, "year": "2022", "month": "09"}]
    typed = dataflow.read_parquet(str(tmp_path), partitioning=pa.schema([("year", pa.int64()), ("month", pa.int64())]))
    assert typed.take_all() == [{"x": 1, "year": 2022, "month": 9}]


def test_to_pandas_dtypes_are_ray_s(mode):
    frame = dataflow.from_items([{"i": 1, "f": 1.5, "s": "a"}, {"i": 2, "f": 2.5, "s": "b"}]).to_pandas()
    assert {name: str(dtype) for name, dtype in frame.dtypes.items()} == {
        "i": "int64[pyarrow]", "f": "double[pyarrow]", "s": "string[pyarrow]",
    }
    tensors = dataflow.from_numpy(np.ones((3, 2, 2))).to_pandas()
    assert tensors["data"].dtype == object and tensors["data"][0].shape == (2, 2)
    df = pd.DataFrame({"x": [1.0, 2.0]})
    pd.testing.assert_frame_equal(dataflow.from_pandas(df).to_pandas(), df)  # pandas in, pandas' dtypes out
    ctx = dataflow.DataContext.get_current()
    ctx.enable_arrow_backed_pandas_conversion = False
    try:
        assert str(dataflow.range(3).to_pandas()["id"].dtype) == "int64"
    finally:
        ctx.enable_arrow_backed_pandas_conversion = True


def test_from_torch_keeps_tensor_values(mode):
    torch = pytest.importorskip("torch")
    rows = dataflow.from_torch(torch.utils.data.TensorDataset(torch.arange(6.0).reshape(2, 3))).take_all()
    # Ray 2.60: a (tensor,) tuple stays a tuple of torch tensors (a Python object), not numpy
    assert isinstance(rows[0]["item"], tuple) and isinstance(rows[0]["item"][0], torch.Tensor)
    assert rows[1]["item"][0].tolist() == [3.0, 4.0, 5.0]
    pairs = dataflow.from_torch(torch.utils.data.TensorDataset(torch.zeros(2, 1, 2, 2), torch.arange(2))).take_all()
    image, label = pairs[1]["item"]
    assert image.shape == (1, 2, 2) and isinstance(image, torch.Tensor) and label.item() == 1
    assert dataflow.from_torch(torch.utils.data.TensorDataset(torch.arange(2))).take(1)[0]["item"][0].item() == 0
    named = dataflow.from_torch([{"x": torch.ones(2), "y": 1}]).take_all()[0]["item"]
    assert isinstance(named["x"], torch.Tensor) and named["y"] == 1
    plain = dataflow.from_torch([torch.ones(2, 2) for _ in range(3)]).take(1)
    assert isinstance(plain[0]["item"], np.ndarray) and plain[0]["item"].shape == (2, 2)


def test_json_round_trip_of_a_written_dataset(mode, tmp_path):
    dataflow.range(5).write_json(str(tmp_path / "j"), mode="overwrite")
    lines = [json.loads(line) for p in sorted((tmp_path / "j").glob("*.json")) for line in p.read_text().splitlines()]
    assert sorted(row["id"] for row in lines) == list(range(5))


def test_comparing_a_partition_column_with_a_number_says_why(mode, tmp_path):
    dataflow.from_arrow(pa.table({"id": [1, 2], "k": [1, 2]})).write_parquet(str(tmp_path / "p"), partition_cols=["k"])
    with pytest.raises(TypeError, match="partition columns are strings"):
        dataflow.read_parquet(str(tmp_path / "p")).filter(expr=dataflow.col("k") == 1).take_all()


def test_max_retries_bounds_the_attempts_of_a_task_whose_worker_dies(streaming):
    from engine import session as engine_session

    assert engine_session.current_session().executor.wait_for_workers()  # not in the driver
    driver = os.getpid()

    def die(batch):
        if batch["id"][0] == 0 and os.getpid() != driver:
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    with pytest.raises(dataflow.WorkerDiedError, match="failed 2 times"):
        dataflow.range(100, override_num_blocks=4).map_batches(die, max_retries=1).take_all()
    assert dataflow.range(10).map(lambda r: r).count() == 10  # still usable


# ----- writes, groupby, schema and column steps: the rest of Ray's keywords ----------------------


class _TimedSink(dataflow.Datasink):
    """Records when each write task ran (in files: tasks run in other processes)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def write(self, blocks, ctx):
        start = time.monotonic()
        rows = sum(b.num_rows for b in blocks)
        time.sleep(0.15)
        with open(os.path.join(self.folder, f"{ctx.task_index}-{ctx.attempt}.json"), "w") as f:
            json.dump({"start": start, "end": time.monotonic(), "rows": rows}, f)
        return rows


def _spans(folder):
    spans = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            spans.append(json.load(f))
    return sorted((s["start"], s["end"]) for s in spans), sum(s["rows"] for s in spans)


def _overlaps(spans):
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def _workers_up():
    """Until its workers are up a session runs tasks in the driver, one at a time: wait."""
    from engine import session as engine_session

    assert engine_session.current_session().executor.wait_for_workers()


@pytest.mark.parametrize("args", [{"concurrency": 1}, {"ray_remote_args": {"num_cpus": 2}}])
def test_write_concurrency_and_remote_args_bound_the_write_tasks(streaming, tmp_path, args):
    """``concurrency=1`` (or tasks that each take both CPUs) writes one block at a time; without
    either, the two workers write at once."""
    _workers_up()
    ds = dataflow.range(600, override_num_blocks=6).materialize()
    for kwargs, overlapping in ((args, False), ({}, True)):
        folder = tmp_path / f"spans{len(kwargs)}"
        folder.mkdir()
        with dataflow.options(min_task_input_bytes=1):  # a task per block, not one for all six
            ds.write_datasink(_TimedSink(str(folder)), **kwargs)
        spans, rows = _spans(str(folder))
        assert rows == 600 and len(spans) >= 2
        assert _overlaps(spans) == overlapping, (kwargs, spans)
    with pytest.raises(ResourceError, match=r"num_gpus|GPU"):
        ds.write_parquet(str(tmp_path / "gpu"), ray_remote_args={"num_gpus": 1})
    with pytest.raises(TypeError, match="num_cpu"):
        ds.write_parquet(str(tmp_path / "typo"), ray_remote_args={"num_cpu": 1})


def test_write_parquet_with_concurrency_writes_every_row(mode, tmp_path):
    dataflow.range(1000, override_num_blocks=5).map_batches(lambda b: b).write_parquet(
        str(tmp_path / "out"), concurrency=1, ray_remote_args={"num_cpus": 1})
    assert sorted(pq.read_table(tmp_path / "out")["id"].to_pylist()) == list(range(1000))


def test_try_create_dir_and_open_stream_args(mode, tmp_path):
    ds = dataflow.range(50)
    with pytest.raises(FileNotFoundError, match="try_create_dir=False"):
        ds.write_csv(str(tmp_path / "missing" / "out"), try_create_dir=False)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "there").mkdir()
    ds.write_csv(str(tmp_path / "there"), try_create_dir=False, arrow_open_stream_args={"compression": "gzip"})
    files = [p for p in (tmp_path / "there").iterdir() if p.name.endswith(".csv")]
    assert files and all(p.read_bytes()[:2] == b"\x1f\x8b" for p in files)  # gzip
    import gzip

    import pyarrow.csv as pacsv

    ids = [i for p in files for i in pacsv.read_csv(io.BytesIO(gzip.decompress(p.read_bytes())))["id"].to_pylist()]
    assert sorted(ids) == list(range(50))
    with pytest.raises(TypeError, match="'compresion' is not an argument"):
        ds.write_json(str(tmp_path / "j"), arrow_open_stream_args={"compresion": "gzip"})


def test_groupby_num_partitions_sets_the_reduce_tasks(mode):
    ds = dataflow.range(3000, override_num_blocks=6).map(lambda r: {"k": r["id"] % 50, "v": r["id"]})
    for n in (1, 4):
        counted = ds.groupby("k", num_partitions=n).count().materialize()
        assert counted.num_blocks() == n
        assert sorted((r["k"], r["count()"]) for r in counted.take_all()) == [(k, 60) for k in range(50)]
        groups = ds.groupby("k", num_partitions=n).map_groups(lambda b: {"k": b["k"][:1], "n": [len(b["k"])]},
                                                               batch_format="numpy")
        groups = groups.materialize()
        assert groups.num_blocks() == n and sorted(r["n"] for r in groups.take_all()) == [60] * 50
    with pytest.raises(ValueError, match="num_partitions"):
        ds.groupby("k", num_partitions=0)


def test_schema_without_fetching(mode):
    ds = dataflow.range(10)
    mapped = ds.map(lambda r: {"x": r["id"]})
    assert mapped.schema(fetch_if_missing=False) is None and mapped.columns(fetch_if_missing=False) is None
    assert mapped.columns() == ["x"]
    assert ds.columns(fetch_if_missing=False) == ["id"]  # the source knows it
    assert mapped.materialize().columns(fetch_if_missing=False) == ["x"]


def test_column_steps_take_task_arguments(mode):
    ds = dataflow.range(100, override_num_blocks=4)
    out = (ds.add_column("d", lambda df: df["id"] * 2, concurrency=1, num_cpus=1)
           .with_column("t", dataflow.col("id") * 3, num_cpus=0.5)
           .rename_columns({"id": "i"}, concurrency=2)
           .drop_columns(["t"], memory=1 << 20)
           .select_columns(["i", "d"], ray_remote_args_fn=lambda: {"num_cpus": 1}))
    assert sorted((r["i"], r["d"]) for r in out.take_all()) == [(i, 2 * i) for i in range(100)]
    with pytest.raises(TypeError, match=r"^select_columns\(\) got an unexpected keyword argument 'concurency'$"):
        ds.select_columns(["id"], concurency=2)
    with pytest.raises(ValueError, match="runs as tasks"):
        ds.drop_columns(["id"], compute=ActorPoolStrategy(size=2))


def test_repartition_strict_blocks_are_exact(mode):
    for strict in (True, False):
        out = dataflow.range(1000, override_num_blocks=7).repartition(target_num_rows_per_block=300,
                                                                       strict=strict).materialize()
        assert [b.num_rows for b in out.iterator().iter_blocks()] == [300, 300, 300, 100]


def _timed_group(folder: str):
    def fn(batch):
        start = time.monotonic()
        time.sleep(0.1)
        with open(os.path.join(folder, f"{int(batch['k'][0])}.json"), "w") as f:
            json.dump({"start": start, "end": time.monotonic(), "rows": len(batch["k"])}, f)
        return {"k": batch["k"][:1], "n": [len(batch["k"])]}

    return fn


@pytest.mark.parametrize("args", [{"concurrency": 1}, {"num_cpus": 2}, {"ray_remote_args": {"num_cpus": 2}}])
def test_map_groups_runs_with_its_resources_and_concurrency(streaming, tmp_path, args):
    """The reduce tasks that call ``fn`` hold what it asks for: one at a time here with either
    argument, two at once without."""
    _workers_up()
    ds = dataflow.range(800, override_num_blocks=4).map(lambda r: {"k": r["id"] % 8})
    for kwargs, overlapping in ((args, False), ({}, True)):
        folder = tmp_path / f"spans{len(kwargs)}"
        folder.mkdir()
        remote = kwargs.get("ray_remote_args", {})
        named = {k: v for k, v in kwargs.items() if k != "ray_remote_args"}
        out = ds.groupby("k", num_partitions=4).map_groups(_timed_group(str(folder)), batch_format="numpy",
                                                           **named, **remote).take_all()
        assert sorted(r["n"] for r in out) == [100] * 8
        spans, rows = _spans(str(folder))
        assert rows == 800 and _overlaps(spans) == overlapping, (kwargs, spans)


def test_map_groups_zero_copy_batch_and_refusals(mode):
    ds = dataflow.range(100).map(lambda r: {"k": r["id"] % 4, "v": r["id"]})

    def bump(batch):
        batch["v"] += 1
        return {"k": batch["k"][:1], "s": [int(batch["v"].sum())]}

    out = ds.groupby("k").map_groups(bump, zero_copy_batch=False, batch_format="numpy").take_all()
    assert sum(r["s"] for r in out) == sum(range(100)) + 100
    with pytest.raises(ValueError, match="read-only"):
        ds.groupby("k").map_groups(bump, batch_format="numpy").take_all()
    with pytest.raises(TypeError, match=r"^map_groups\(\) got an unexpected keyword argument 'num_cpu'$"):
        ds.groupby("k").map_groups(bump, num_cpu=1)
    with pytest.raises(ValueError, match="runtime_env"):
        ds.groupby("k").map_groups(bump, runtime_env={"pip": ["x"]})


def test_random_shuffle_remote_args_are_its_tasks_resources_or_refused(mode):
    """They were accepted and ignored, whatever they were (random_shuffle(foo=1) ran)."""
    ds = dataflow.range(1000, override_num_blocks=4)
    assert sorted(r["id"] for r in ds.random_shuffle(seed=3, num_cpus=1).take_all()) == list(range(1000))
    with pytest.raises(TypeError, match=r"^random_shuffle\(\) got an unexpected keyword argument 'foo'$"):
        ds.random_shuffle(foo=1)
    with pytest.raises(ValueError, match=r"random_shuffle\(memory=\.\.\.\)"):
        ds.random_shuffle(memory=1 << 30)
    from engine.errors import ResourceError

    with pytest.raises(ResourceError, match="no_such_device"):  # held by its tasks: it could never run
        ds.random_shuffle(resources={"no_such_device": 1}).take_all()
    with pytest.raises(ValueError, match="sort key must be a column name or a list of them, got None"):
        ds.sort(None)


class _TimedSource(dataflow.Datasource):
    """Six read tasks of 100 rows that record when they ran."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def get_read_tasks(self, parallelism):
        from connectors.base import BlockMetadata, ReadTask

        def task(k, folder=self.folder):
            def read():
                start = time.monotonic()
                time.sleep(0.1)
                with open(os.path.join(folder, f"{k}.json"), "w") as f:
                    json.dump({"start": start, "end": time.monotonic(), "rows": 100}, f)
                return [pa.table({"id": np.arange(k * 100, (k + 1) * 100)})]

            return ReadTask(read, BlockMetadata(num_rows=100, size_bytes=800))

        return [task(k) for k in range(6)]


@pytest.mark.parametrize("args", [{"concurrency": 1}, {"num_cpus": 2}, {"ray_remote_args": {"num_cpus": 2}}])
def test_read_tasks_run_with_their_concurrency_and_resources(streaming, tmp_path, args):
    _workers_up()
    for kwargs, overlapping in ((args, False), ({}, True)):
        folder = tmp_path / f"spans{len(kwargs)}"
        folder.mkdir()
        ds = dataflow.read_datasource(_TimedSource(str(folder)), override_num_blocks=6, **kwargs)
        assert sorted(r["id"] for r in ds.map(lambda r: r).take_all()) == list(range(600))
        spans, rows = _spans(str(folder))
        assert rows == 600 and _overlaps(spans) == overlapping, (kwargs, spans)


def test_read_task_arguments_on_every_reader(mode, tmp_path):
    dataflow.range(300, override_num_blocks=3).write_parquet(str(tmp_path / "p"))
    dataflow.range(300, override_num_blocks=3).write_csv(str(tmp_path / "c"))
    assert dataflow.read_parquet(str(tmp_path / "p"), concurrency=2, num_cpus=1, memory=1 << 20).count() == 300
    assert dataflow.read_csv(str(tmp_path / "c"), ray_remote_args={"num_cpus": 0.5}).count() == 300
    with pytest.warns(DeprecationWarning, match="override_num_blocks"):
        ds = dataflow.read_parquet(str(tmp_path / "p"), parallelism=2)
    assert ds.count() == 300
    with pytest.raises(TypeError, match=r"^read_csv\(\) got an unexpected keyword argument 'concurency'$"):
        dataflow.read_csv(str(tmp_path / "c"), concurency=2)
    with pytest.raises(ValueError, match="concurrency"):
        dataflow.read_parquet(str(tmp_path / "p"), concurrency=0)
    with pytest.raises(ValueError, match="runtime_env"):
        dataflow.read_csv(str(tmp_path / "c"), ray_remote_args={"runtime_env": {"env_vars": {"A": "1"}}})
    with pytest.raises(ResourceError, match="nowhere"):  # a resource no machine offers (Ray's test cluster has GPUs)
        dataflow.read_parquet(str(tmp_path / "p"), resources={"nowhere": 1}).take_all()
    # Ray 2.60's other named read arguments: at their defaults they change nothing ...
    defaults = {"accelerator_type": None, "label_selector": None, "fallback_strategy": None, "max_calls": 0,
                "runtime_env": None}
    assert dataflow.read_text(str(tmp_path / "c"), **defaults).count() == 303  # and 3 files' header lines
    # ... and set, they mean what they mean for a map: a resource, or a clear refusal
    with pytest.raises(ResourceError, match="accelerator_type:A100"):
        dataflow.read_parquet(str(tmp_path / "p"), accelerator_type="A100").take_all()
    with pytest.raises(ValueError, match="node labels"):
        dataflow.read_csv(str(tmp_path / "c"), label_selector={"zone": "a"})
    with pytest.raises(ValueError, match="runtime_env"):
        dataflow.read_parquet(str(tmp_path / "p"), runtime_env={"env_vars": {"A": "1"}})
    dataflow.from_numpy(np.zeros((2, 4, 4, 3), np.uint8)).write_images(str(tmp_path / "img"), "data")
    assert dataflow.read_images(str(tmp_path / "img"), arrow_open_file_args={}).count() == 2  # Ray's name there
    # Ray's catalog=: its default None is taken, a catalog is refused saying dataflow has none
    assert dataflow.read_parquet(str(tmp_path / "p"), catalog=None).count() == 300
    dataflow.range(3).write_parquet(str(tmp_path / "w"), catalog=None)
    with pytest.raises(TypeError, match="catalogs"):
        dataflow.read_parquet(str(tmp_path / "p"), catalog=object())
    with pytest.raises(TypeError, match="catalogs"):
        dataflow.range(3).write_parquet(str(tmp_path / "w2"), catalog=object())
    # a column step's ray_remote_args dict, as Ray's select_columns(..., ray_remote_args=...)
    assert dataflow.range(5).select_columns(["id"], ray_remote_args={"num_cpus": 1}).take_all()[-1] == {"id": 4}


def test_ignore_missing_paths_skips_what_is_not_there(mode, tmp_path):
    dataflow.range(100).write_parquet(str(tmp_path / "p"))
    dataflow.range(50).write_csv(str(tmp_path / "c"))
    missing = str(tmp_path / "gone")
    assert dataflow.read_parquet([str(tmp_path / "p"), missing], ignore_missing_paths=True).count() == 100
    assert dataflow.read_csv([missing + "/*.csv", str(tmp_path / "c")], ignore_missing_paths=True).count() == 50
    with pytest.raises(FileNotFoundError, match="gone"):
        dataflow.read_csv([missing, str(tmp_path / "c")])
    with pytest.raises(FileNotFoundError, match="gone") as info:  # nothing left to read at all
        dataflow.read_csv([missing], ignore_missing_paths=True)
    assert isinstance(info.value, ValueError)  # Ray's "None of the provided paths exist" is one
    assert "none of the paths exist (ignore_missing_paths=True)" in str(info.value)


def test_write_task_arguments_with_writes_of_their_own_are_refused(mode, tmp_path):
    ds = dataflow.range(10)
    with pytest.raises(ValueError, match="min_bytes_per_file"):
        ds.write_parquet(str(tmp_path / "a"), min_bytes_per_file=1 << 20, concurrency=1)
    with pytest.raises(ValueError, match="resume"):
        ds.write_parquet(str(tmp_path / "b"), mode="resume", ray_remote_args={"num_cpus": 1})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_arrow_open_stream_args_name_the_codec_of_files_whose_extension_does_not(mode, tmp_path):
    """Ray's ``arrow_open_stream_args`` on reads: gzip files without ``.gz`` read with
    ``compression="gzip"``; ``buffer_size`` is passed on; unknown names and codecs that cannot
    be streamed are refused; Parquet (opened for random access) does not take it."""
    import gzip

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_bytes(gzip.compress(b"id,name\n1,x\n2,y\n"))
    (folder / "b.jsonl").write_bytes(gzip.compress(b'{"id": 3}\n{"id": 4}\n'))
    (folder / "c.txt").write_bytes(gzip.compress(b"hello\nworld\n"))
    buf = io.BytesIO()
    np.save(buf, np.arange(5))
    (folder / "d.npy").write_bytes(gzip.compress(buf.getvalue()))
    gz = {"compression": "gzip", "buffer_size": 1 << 16}
    assert dataflow.read_csv(str(folder / "a.csv"), arrow_open_stream_args=gz).take_all() == [
        {"id": 1, "name": "x"}, {"id": 2, "name": "y"}]
    assert [r["id"] for r in dataflow.read_json(str(folder / "b.jsonl"), arrow_open_stream_args=gz).take_all()] == [3, 4]
    assert [r["text"] for r in dataflow.read_text(str(folder / "c.txt"), arrow_open_stream_args=gz).take_all()] == [
        "hello", "world"]
    assert [r["data"] for r in dataflow.read_numpy(str(folder / "d.npy"), arrow_open_stream_args=gz).take_all()] == [
        0, 1, 2, 3, 4]
    raw = dataflow.read_binary_files(str(folder / "c.txt"), arrow_open_stream_args={"compression": "gzip"})
    assert raw.take_all()[0]["bytes"] == b"hello\nworld\n"
    assert dataflow.read_binary_files(str(folder / "c.txt")).take_all()[0]["bytes"].startswith(b"\x1f\x8b")
    with pytest.raises(FileFormatError, match=r"a\.csv"):  # without it: the compressed bytes, not CSV
        dataflow.read_csv(str(folder / "a.csv")).take_all()
    with pytest.raises(TypeError, match="'mode' is not an argument"):
        dataflow.read_csv(str(folder / "a.csv"), arrow_open_stream_args={"mode": "rb"})
    with pytest.raises(ValueError, match="snappy"):
        dataflow.read_text(str(folder / "c.txt"), arrow_open_stream_args={"compression": "snappy"})
    with pytest.raises(ValueError, match="buffer_size"):
        dataflow.read_text(str(folder / "c.txt"), arrow_open_stream_args={"buffer_size": -1})
    dataflow.range(10).write_parquet(str(tmp_path / "p"))
    with pytest.raises(TypeError, match="random access"):
        dataflow.read_parquet(str(tmp_path / "p"), arrow_open_stream_args={"buffer_size": 1 << 16})


def test_read_parquet_tensor_column_schema_and_the_scanner_arguments(mode, tmp_path):
    """Ray's ``tensor_column_schema`` turns binary columns of raw arrays into tensor columns;
    the keywords Ray hands to pyarrow's Scanner are refused saying why; unknown ones name
    ``read_parquet``."""
    images = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    vectors = np.arange(6 * 4, dtype=np.int16).reshape(6, 4)
    for i in range(2):  # two files of three rows
        rows = slice(3 * i, 3 * i + 3)
        pq.write_table(pa.table({"id": list(range(3 * i, 3 * i + 3)),
                                 "img": [a.tobytes() for a in images[rows]],
                                 "vec": [v.tobytes() for v in vectors[rows]]}), tmp_path / f"part-{i}.parquet")
    spec = {"img": (np.float32, (2, 3)), "vec": (np.dtype("int16"), (4,))}
    ds = dataflow.read_parquet(str(tmp_path), tensor_column_schema=spec)
    schema = ds.schema()
    assert schema.field("img").type == pa.fixed_shape_tensor(pa.float32(), (2, 3))
    assert schema.field("vec").type == pa.fixed_shape_tensor(pa.int16(), (4,))  # Ray: ArrowTensorTypeV2(shape=(4,))
    batch = ds.sort("id").take_batch(6)
    np.testing.assert_array_equal(batch["img"], images)
    np.testing.assert_array_equal(batch["vec"], vectors)
    assert batch["img"].dtype == np.float32 and batch["vec"].dtype == np.int16
    # projected, filtered, and through a map: the same arrays
    assert ds.select_columns(["id"]).take(1) == [{"id": 0}]
    doubled = ds.filter(expr="id >= 4").map_batches(lambda b: {"img": b["img"] * 2}).take_batch(2)["img"]
    np.testing.assert_array_equal(np.sort(doubled, axis=0), images[4:] * 2)
    with pytest.raises(FileFormatError, match=r"part-[01]\.parquet, column 'img'.*not all 16 bytes"):
        dataflow.read_parquet(str(tmp_path), tensor_column_schema={"img": (np.float32, (4,))}).take_all()
    with pytest.raises(ValueError, match="'id', which is int64, not binary"):
        dataflow.read_parquet(str(tmp_path), tensor_column_schema={"id": (np.float32, (1,))}).take_all()
    with pytest.raises(ValueError, match="names 'nope', not a column"):
        dataflow.read_parquet(str(tmp_path), tensor_column_schema={"nope": (np.float32, (1,))}).take_all()
    # the Scanner's tuning does nothing here: accepted, said once; what changes the read is refused
    assert dataflow.read_parquet(str(tmp_path), batch_size=1024, use_threads=False).count() == 6
    with pytest.raises(TypeError, match=r"read_parquet\(dataset_kwargs=\.\.\.\): Ray passes it on to pyarrow"):
        dataflow.read_parquet(str(tmp_path), dataset_kwargs={})
    with pytest.raises(TypeError, match=r"^read_parquet\(\) got an unexpected keyword argument 'colums'$"):
        dataflow.read_parquet(str(tmp_path), colums=["id"])
    assert dataflow.read_parquet(str(tmp_path), meta_provider=None).count() == 6  # Ray's deprecated default
