"""dataflow: a streaming data engine for AI workloads, with Ray Data's API.

    import dataflow
    ds = dataflow.read_parquet("s3://bucket/data/").map_batches(fn, batch_size=1024)
    for batch in ds.iter_batches(batch_size=256):
        ...

Modules, in the order a dataset meets them:

* ``read_api``    range / from_* / read_*: build a Read node (nothing runs yet)
* ``dataset``     Dataset: lazy transformations append plan nodes; consumers execute
* ``udf``         map / map_batches / filter arguments -> validated plan nodes
* ``builtins``    column operations (select, drop, rename, add, expression filter, aggregates)
* ``expressions`` col / lit expressions for filter and with_column (``expression_parser``: strings)
* ``plan``        logical nodes and explain()
* ``optimizer``   fuse maps, push projections and filters into reads, count from metadata
* ``compile``     logical plan -> engine operators
* ``iterator``    DataIterator: fetch -> rebatch -> shuffle -> format -> prefetch
* ``torch_batches``, ``jax_batches``, ``tf_batches``: the iterator's batches as torch tensors,
  jax Arrays, TensorFlow tensors (each framework imported on first use); ``dask_interop``:
  ``to_dask`` / ``from_dask``
* ``splitting``   split / split_at_indices / train_test_split: materialized parts sharing blocks
* ``random_access`` to_random_access_dataset: rows by key from sorted blocks, mapped once
* ``sources``     which datasources and files a plan reads (``input_files``)
* ``ray_api``     Ray Data's public names; the error for those dataflow does not provide
* ``context``     DataContext and options(); the environment is read there only
* ``progress``    live progress of running executions (rich bars, notebook text, log lines)
* ``logs``        the ``dataflow.*`` loggers and the log file of each process
* ``metrics``     the opt-in Prometheus endpoint (``init(metrics_port=...)``)
* ``errors``      the exceptions users catch

Everything that runs goes through ``engine.runner``, the engine's one entry point: it picks the
backend for the execution mode (``engine.backend``: the multi-process one or the in-process
one); nothing here touches a session, a socket or a block store (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

from typing import Any

from connectors.base import BlockMetadata, Datasink, Datasource, ReadTask
from dataflow import datatype  # noqa: F401  (ray.data.datatype is loaded with ray.data)
from dataflow.context import DataContext, options
from dataflow.dataset import Dataset, MaterializedDataset
from dataflow.errors import DataflowError, UserCodeError, WorkerDiedError
from dataflow.expressions import col, lit
from dataflow.iterator import DataIterator
from dataflow.mixing import MixStoppingCondition
from dataflow.random_seed import RandomSeedConfig
from dataflow.read_api import (
    from_arrow,
    from_blocks,
    from_huggingface,
    from_items,
    from_numpy,
    from_pandas,
    from_polars,
    from_tf,
    from_torch,
    range,
    range_tensor,
    read_audio,
    read_avro,
    read_binary_files,
    read_csv,
    read_datasource,
    read_delta,
    read_iceberg,
    read_images,
    read_json,
    read_lance,
    read_numpy,
    read_orc,
    read_parquet,
    read_sql,
    read_text,
    read_tfrecords,
    read_videos,
    read_webdataset,
)
from dataflow.schema import Schema
from dataflow.summary import DatasetSummary
from dataflow.udf import ActorPoolStrategy, TaskPoolStrategy
from engine.options import ExecutionOptions, ExecutionResources

DatasetContext = DataContext  # Ray's older names, still exported by ray.data
DatasetIterator = DataIterator

__version__ = "0.1.0"


def init(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
    execution_mode: str | None = None,
    runner: str | None = None,
    address: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    **engine_options: Any,
) -> None:
    """Start the engine now with these settings (otherwise the first consuming call starts it).

    ``execution_mode="local"`` runs everything synchronously in this process (for debugging).
    ``runner="ray"`` runs the same plans on a Ray cluster: ``address`` None (a Ray instance this
    process already initialized, or a new local one), ``"auto"`` or ``"ray://host:10001"``
    (also ``DATAFLOW_RUNNER=ray`` and ``DATAFLOW_RAY_ADDRESS``).

    ``metrics_port`` serves Prometheus metrics on ``metrics_host:metrics_port`` (``dataflow.metrics``;
    needs the ``metrics`` extra). Logs go to a file per process from now on (``dataflow.logs``).
    """
    from dataclasses import replace

    from engine import runner as engine_runner

    if runner is not None:
        if runner not in ("ray", "local", "streaming"):
            msg = f"runner must be 'ray', 'streaming' or 'local', got {runner!r}"
            raise ValueError(msg)
        execution_mode = runner
    if address is not None or runner == "ray":
        engine_runner.use_ray(address)
    ctx = DataContext.get_current()
    if execution_mode is not None:
        ctx.execution_mode = execution_mode
        ctx.__post_init__()
    changes = dict(engine_options)
    if isinstance(changes.get("resources"), dict):  # resources={"TPU": 4}: what this machine offers
        changes["resources"] = tuple(sorted(changes["resources"].items()))
    if num_cpus is not None:
        changes["num_cpus"] = num_cpus
    if num_gpus is not None:
        changes["num_gpus"] = num_gpus
    if object_store_memory is not None:
        changes["object_store_memory"] = object_store_memory
    if changes:
        wanted = replace(ctx.execution_options, **changes)
        running = engine_runner.current()
        if running is not None and running.options != wanted:
            msg = "dataflow is already running with other settings; call dataflow.shutdown() first"
            raise RuntimeError(msg)
        ctx.execution_options = wanted
    engine_runner.init(ctx.execution_options, ctx.execution_mode)
    from dataflow import logs, metrics

    logs.setup()
    if metrics_port is not None:
        metrics.serve(metrics_port, metrics_host)


_CONNECTOR_NAMES = {
    "BlockBasedFileDatasink": "connectors.file_based_sinks",
    "RowBasedFileDatasink": "connectors.file_based_sinks",
    "FilenameProvider": "connectors.file_datasink",
    "SaveMode": "connectors.file_datasink",
    "FileShuffleConfig": "connectors.file_selection",
    "from_dask": "dataflow.dask_interop",
    "PathPartitionFilter": "connectors.partitioning",
    "ResumeMismatchError": "connectors.resumable_write",
    "Preprocessor": "dataflow.preprocessor",  # (it imports pandas: ~0.25 s, not at ``import dataflow``)
}


def __getattr__(name: str) -> Any:
    """Ray's names that live in ``connectors`` or need pandas, and the submodules
    (``dataflow.datasource.Partitioning``, as ``ray.data.datasource.Partitioning`` works after
    ``import ray.data``), imported on first use (``import dataflow`` loads no connector, and
    not pandas)."""
    import importlib
    import importlib.util

    module = _CONNECTOR_NAMES.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    from dataflow.ray_api import RAY_DATA_MODULE_API, module_attribute_error

    raise module_attribute_error("dataflow", name, "ray.data", RAY_DATA_MODULE_API)


def configure_logging() -> None:
    """Ray's ``configure_logging``: set up the ``dataflow`` loggers now (the log file, the
    console fallback) rather than at the first execution (``dataflow.logs``)."""
    from dataflow import logs

    logs.setup()


def shutdown() -> None:
    """Stop workers and free all shared memory of this process's engine."""
    from engine import runner

    runner.shutdown()


__all__ = [
    "ActorPoolStrategy",
    "BlockBasedFileDatasink",
    "BlockMetadata",
    "DataContext",
    "DataIterator",
    "DataflowError",
    "Dataset",
    "DatasetContext",
    "DatasetIterator",
    "DatasetSummary",
    "Datasink",
    "Datasource",
    "ExecutionOptions",
    "ExecutionResources",
    "FileShuffleConfig",
    "FilenameProvider",
    "MaterializedDataset",
    "MixStoppingCondition",
    "PathPartitionFilter",
    "Preprocessor",
    "RandomSeedConfig",
    "ReadTask",
    "ResumeMismatchError",
    "RowBasedFileDatasink",
    "SaveMode",
    "Schema",
    "TaskPoolStrategy",
    "UserCodeError",
    "WorkerDiedError",
    "col",
    "from_arrow",
    "from_blocks",
    "from_dask",
    "from_huggingface",
    "from_items",
    "from_numpy",
    "from_pandas",
    "from_polars",
    "from_tf",
    "from_torch",
    "init",
    "lit",
    "options",
    "range",
    "range_tensor",
    "read_audio",
    "read_avro",
    "read_binary_files",
    "read_csv",
    "read_datasource",
    "read_delta",
    "read_iceberg",
    "read_images",
    "read_json",
    "read_lance",
    "read_numpy",
    "read_orc",
    "read_parquet",
    "read_sql",
    "read_text",
    "read_tfrecords",
    "read_videos",
    "read_webdataset",
    "shutdown",
]
