"""Where datasets come from: ``range``, ``from_*`` for data in memory, ``read_*`` for files.

Each validates its arguments and returns ``Dataset(Read(datasource))``; nothing is read until a
consuming call. File readers fail at once with FileNotFoundError when a path does not exist.
The ``read_*`` functions are thin wrappers over the Datasources in ``connectors/`` (imported on
first call, so ``import dataflow`` loads no format, pandas, fsspec or torch); their names and main
arguments are Ray Data's. ``override_num_blocks`` asks for about that many read tasks; the
task arguments every ``read_*`` takes (``concurrency``, ``num_cpus``, ``num_gpus``, ``memory``,
``resources``, ``ray_remote_args``, and ``parallelism``, Ray's old name for
``override_num_blocks``) are described at ``read_datasource``.
"""

from __future__ import annotations

import builtins
import functools
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.base import Datasource
from connectors.memory import ArrowDatasource, RangeDatasource
from dataflow import builtins as bi
from dataflow.context import DataContext
from dataflow.dataset import Dataset, MaterializedDataset
from dataflow.plan import Read
from dataflow.ray_api import refuse_catalog

READ_TASK_ARGS = ("parallelism", "concurrency", "num_cpus", "num_gpus", "memory", "resources", "ray_remote_args",
                  "accelerator_type", "label_selector", "fallback_strategy", "max_calls", "runtime_env", "catalog")
_REMOTE_NAMED = ("accelerator_type", "label_selector", "fallback_strategy", "max_calls", "runtime_env")
"""Ray's named read arguments that are remote options: checked as ``ray_remote_args`` are."""


def read_datasource(datasource: Datasource, *, override_num_blocks: int | None = None, **task_args: Any) -> Dataset:
    """A dataset reading from a custom ``Datasource``.

    ``task_args``, as Ray's for every ``read_*``: ``concurrency`` caps the read tasks running at
    once; ``num_cpus``, ``num_gpus``, ``memory``, ``resources`` and ``ray_remote_args`` are what
    each read task holds (a map after such a read runs in tasks of its own unless it asks for
    the same); ``parallelism`` is Ray's deprecated name for ``override_num_blocks``.
    """
    return _read(datasource, "read_datasource", override_num_blocks, task_args)


def _read(datasource: Datasource, method: str, override_num_blocks: int | None, task_args: dict[str, Any]) -> Dataset:
    from dataflow.udf import task_limits

    unknown = [name for name in task_args if name not in READ_TASK_ARGS]
    if unknown:
        msg = f"{method}() got an unexpected keyword argument {unknown[0]!r}"
        raise TypeError(msg)
    refuse_catalog(method, task_args.get("catalog"))
    override_num_blocks = _num_blocks(method, task_args.get("parallelism", -1), override_num_blocks, stacklevel=4)
    asked = {k: task_args.get(k) for k in ("num_cpus", "num_gpus", "memory", "resources")}
    named = {k: task_args[k] for k in _REMOTE_NAMED if task_args.get(k) is not None}
    remote_options = {**(task_args.get("ray_remote_args") or {}), **named} or None
    remote, concurrency = task_limits(method, task_args.get("concurrency"), **asked, ray_remote_args=remote_options)
    if remote.max_retries is not None or remote.retry_exceptions or remote.env_vars:
        msg = (f"{method}() takes resources for its read tasks (num_cpus, num_gpus, memory, resources); "
               "max_retries, retry_exceptions and runtime_env are for the functions of map steps")
        raise ValueError(msg)
    custom = any(v is not None for v in asked.values()) or bool(remote_options)
    return Dataset(Read(datasource, override_num_blocks or -1, resources=remote.resources if custom else None,
                        max_concurrency=concurrency))


def _num_blocks(method: str, parallelism: int, override_num_blocks: int | None, stacklevel: int = 3) -> int | None:
    """``override_num_blocks``, or Ray's deprecated ``parallelism`` that means the same (-1: unset)."""
    if parallelism is None or parallelism == -1:
        return override_num_blocks
    warnings.warn("`parallelism` is deprecated; use `override_num_blocks` instead", DeprecationWarning, stacklevel=stacklevel)
    if override_num_blocks is not None:
        msg = f"{method}() takes override_num_blocks or parallelism (its old name), not both"
        raise ValueError(msg)
    return parallelism


def _min_blocks() -> int:
    """Blocks an in-memory source makes at least, where it has rows enough: 2 per CPU, the floor
    of Ray's read parallelism, so that a few slow rows spread over the workers."""
    return 2 * DataContext.get_current().execution_options.resolved_num_cpus()


def range(
    n: int, *, parallelism: int = -1, concurrency: int | None = None, override_num_blocks: int | None = None
) -> Dataset:
    """Rows ``{"id": 0}`` ... ``{"id": n - 1}``; ``concurrency`` caps the tasks making them."""
    blocks = _num_blocks("range", parallelism, override_num_blocks)
    return _read(RangeDatasource(n, blocks, min_blocks=_min_blocks()), "range", None, {"concurrency": concurrency})


def range_tensor(
    n: int,
    *,
    shape: tuple[int, ...] = (1,),
    parallelism: int = -1,
    concurrency: int | None = None,
    override_num_blocks: int | None = None,
) -> Dataset:
    """Rows ``{"data": np.full(shape, i)}`` for i in 0 ... n - 1: one int64 tensor column (Ray's
    ``range_tensor``)."""
    shape = tuple(shape)
    if not all(isinstance(d, int) and d > 0 for d in shape):
        msg = f"range_tensor(shape=...) takes positive ints, got {shape!r}"
        raise ValueError(msg)
    blocks = _num_blocks("range_tensor", parallelism, override_num_blocks)
    return range(n, concurrency=concurrency, override_num_blocks=blocks)._column_step(
        "range_tensor", f"RangeTensor{shape}", bi.RangeTensor(shape), {}
    )


def from_blocks(blocks: Sequence[Any]) -> MaterializedDataset:
    """A materialized dataset of exactly these blocks (Arrow tables or pandas DataFrames), one
    each and in this order: Ray's ``from_blocks``, for tests that need a given block layout."""
    from engine.block_format import frame_to_table

    tables = [b if isinstance(b, pa.Table) else frame_to_table(b) for b in blocks]
    return _in_memory(ArrowDatasource(tables, max(len(tables), 1), "FromBlocks"))


def _in_memory(source: ArrowDatasource) -> MaterializedDataset:
    """Data already in this process as a materialized dataset, in order, as Ray's ``from_*``
    give one (``num_blocks()`` answers, ``print`` shows rows): its blocks are put into the
    object store now, once, by this process (as Ray's ``ray.put``: no task, and no block size
    a message to a worker could not carry), and every execution reads them from there."""
    from engine import runner

    ctx = DataContext.get_current()
    runner.reclaim_abandoned(ctx.execution_options.spill_dir)  # (as a first execution would)
    refs, holder = runner.hold(source.slices(), ctx.execution_options, ctx.execution_mode)
    return MaterializedDataset(refs, holder, None)


def from_arrow(tables: pa.Table | Sequence[pa.Table], *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """A dataset of Arrow tables (or record batches) already in memory."""
    if isinstance(tables, (pa.Table, pa.RecordBatch)):
        tables = [tables]
    tables = [pa.Table.from_batches([t]) if isinstance(t, pa.RecordBatch) else t for t in tables]
    return _in_memory(ArrowDatasource(tables, override_num_blocks, "FromArrow"))


def items_to_table(items: Sequence[Any]) -> pa.Table:
    """Dicts become columns; any other value becomes column ``item`` (as ``ray.data.from_items``)."""
    from engine.block_format import rows_to_block, to_block

    objects = DataContext.get_current().enable_fallback_to_arrow_object_ext_type
    if items and all(isinstance(i, dict) for i in items):
        return rows_to_block(list(items), objects)  # (data, not a UDF: absent is null)
    return to_block({"item": list(items)}, objects)


def from_items(
    items: Sequence[Any], *, parallelism: int = -1, override_num_blocks: int | None = None
) -> MaterializedDataset:
    """A dataset of Python values: dicts become rows, other values a column ``item``. No items:
    no blocks and no schema (``schema()`` is None), as in Ray. As in Ray, one block per item up
    to 200 (or 2 per CPU): items are often units of work (prompts, paths) for slow functions."""
    items = list(items)
    blocks = _num_blocks("from_items", parallelism, override_num_blocks) or min(len(items), max(200, _min_blocks()))
    return _in_memory(ArrowDatasource([items_to_table(items)] if items else [], blocks, "FromItems"))


def from_pandas(dfs: Any, *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """A dataset of one pandas DataFrame or a list of them (the index is dropped)."""
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    from engine.block_format import frame_to_table

    tables = [frame_to_table(df) for df in frames]
    return _in_memory(ArrowDatasource(tables, override_num_blocks, "FromPandas"))


def from_polars(dfs: Any, *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """A dataset of one polars DataFrame or a list of them."""
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    return _in_memory(ArrowDatasource([df.to_arrow() for df in frames], override_num_blocks, "FromPolars"))


def from_numpy(ndarrays: np.ndarray | Sequence[np.ndarray], *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """Column ``data``; an n-d array becomes one tensor column (one row per first-axis entry)."""
    from engine.block_format import tensor_array

    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    tables = [pa.Table.from_arrays([tensor_array(np.asarray(a))], names=["data"]) for a in arrays]
    return _in_memory(ArrowDatasource(tables, override_num_blocks, "FromNumpy"))


def read_parquet(
    paths: str | list[str],
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    filesystem: Any = None,
    partitioning: Any = "hive",
    include_paths: bool = False,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **kwargs: Any,
) -> Dataset:
    """Parquet files: a file, a folder (recursive), a glob or a list; local or ``s3://``.

    ``columns`` and ``filter`` (a ``pyarrow.compute`` expression) are pushed into the reader;
    row groups whose statistics rule the filter out are never read. Hive partition columns are
    strings (as Ray); ``partition_filter`` (a ``PathPartitionFilter``) skips files by their
    partition values before reading; ``shuffle="files"`` or ``FileShuffleConfig(seed=...)``
    reads the files in a random order.
    """
    task_args = {k: kwargs.pop(k) for k in READ_TASK_ARGS if k in kwargs}  # the rest are the reader's
    _refuse_scanner_args(kwargs)
    from connectors.parquet_format import ParquetDatasource

    _check_names("read_parquet", kwargs, ParquetDatasource)

    source = ParquetDatasource(paths, columns=columns, filter=filter, filesystem=filesystem,
                               partitioning=partitioning, include_paths=include_paths,
                               partition_filter=partition_filter, shuffle=shuffle, **kwargs)
    return _read(source, "read_parquet", override_num_blocks, task_args)


log = logging.getLogger("dataflow")

_SCANNER_TUNING = ("batch_size", "batch_readahead", "fragment_readahead", "use_threads", "cache_metadata", "memory_pool")
"""Ray's ``**arrow_parquet_args`` that only tune pyarrow's Scanner (how many rows per batch it
decodes, how far ahead, on how many threads): accepted, without effect, with a warning."""
_SCANNER_ARGS = ("fragment_scan_options", "dataset_kwargs", "_block_udf")
"""Those that change what is read: refused."""
_warned_tuning: set[str] = set()


def _refuse_scanner_args(kwargs: dict[str, Any], api: str = "read_parquet") -> None:
    """Ray hands the rest of ``read_parquet``'s (and ``read_delta``'s) keywords to pyarrow's
    ``ParquetDataset`` and ``Scanner``; dataflow uses neither. Those that only tune the scan are
    accepted and logged once as doing nothing; those that change what is read are refused saying
    so (``meta_provider=None``, Ray's deprecated default, is accepted)."""
    if kwargs.get("meta_provider", 0) is None:
        del kwargs["meta_provider"]
    how = ("it reads each file's row groups with ParquetFile, one thread a task, and cuts blocks at "
           f"DataContext.target_max_block_size ({_TAKEN[api]} are taken)")
    for name in _SCANNER_TUNING:
        if name in kwargs:
            value = kwargs.pop(name)
            if name not in _warned_tuning:
                _warned_tuning.add(name)
                log.warning("%s(%s=%r) tunes pyarrow's Scanner, which dataflow does not use: no effect; %s",
                            api, name, value, how)
    for name in _SCANNER_ARGS:
        if name in kwargs:
            raise TypeError(f"{api}({name}=...): Ray passes it on to pyarrow's ParquetDataset/Scanner, which dataflow "
                            f"does not use: {how}")


_TAKEN = {"read_parquet": "columns=, filter=, schema=, partitioning= and tensor_column_schema=",
          "read_delta": "columns= and filter="}


def _check_names(api: str, kwargs: dict[str, Any], source_class: type) -> None:
    """A ``TypeError`` naming ``api`` (not the datasource's ``__init__``) for an unknown keyword."""
    unknown = sorted(set(kwargs) - _init_keywords(source_class))
    if unknown:
        raise TypeError(f"{api}() got an unexpected keyword argument {unknown[0]!r}")


@functools.cache
def _init_keywords(source_class: type) -> frozenset[str]:
    """The keywords the ``__init__`` of ``source_class`` and of its bases (up to ``object``) take."""
    import inspect

    known: set[str] = set()
    for cls in source_class.__mro__[:-1]:
        init = cls.__dict__.get("__init__")
        if init is not None:
            known |= {p.name for p in inspect.signature(init).parameters.values()
                      if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return frozenset(known)


def _file_kwargs(
    filesystem: Any,
    partitioning: Any,
    include_paths: bool,
    file_extensions: Sequence[str] | None,
    partition_filter: Any = None,
    shuffle: Any = None,
    task_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The arguments every ``FileDatasource`` takes; ``None`` extensions keep the format's own.
    Ray's ``ignore_missing_paths`` and ``arrow_open_stream_args`` are taken out of the call's
    other keywords (``task_args``)."""
    kwargs: dict[str, Any] = {"filesystem": filesystem, "include_paths": include_paths,
                              "partition_filter": partition_filter, "shuffle": shuffle}
    if task_args and "ignore_missing_paths" in task_args:
        kwargs["ignore_missing_paths"] = bool(task_args.pop("ignore_missing_paths"))
    if task_args and "arrow_open_stream_args" in task_args:
        kwargs["arrow_open_stream_args"] = task_args.pop("arrow_open_stream_args")
    if partitioning != "default":
        kwargs["partitioning"] = partitioning
    if file_extensions is not None:
        kwargs["file_extensions"] = [e if e.startswith(".") else "." + e for e in file_extensions]
    return kwargs


def read_csv(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    partitioning: Any = "hive",
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    read_options: Any = None,
    parse_options: Any = None,
    convert_options: Any = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """CSV files (a file, folder, glob or list; local or ``s3://``), one row per line.

    ``read_options``/``parse_options``/``convert_options`` are ``pyarrow.csv``'s. A folder is read
    whole, as Ray's: every file but hidden ones (names starting with ``.`` or ``_``, such as
    ``_SUCCESS``), whatever its extension; ``file_extensions=["csv"]`` reads only those (compressed
    ``.csv.gz`` and the like included). A compressed file is decompressed by its extension. A row
    with the wrong number of fields fails naming the file and the line.
    """
    from connectors.csv_format import CSVDatasource

    source = CSVDatasource(
        paths, read_options=read_options, parse_options=parse_options, convert_options=convert_options,
        **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_csv", override_num_blocks, task_args)


def read_json(
    paths: str | list[str],
    *,
    lines: bool = False,
    filesystem: Any = None,
    partitioning: Any = "hive",
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    read_options: Any = None,
    parse_options: Any = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """JSON Lines files (one object per line), or files holding one JSON array of objects (or
    one object, a row), as Ray's ``lines=False``; ``lines=True``: JSON Lines only.

    ``read_options``/``parse_options`` are ``pyarrow.json``'s. Folders are read for ``.json``,
    ``.jsonl`` and ``.ndjson`` files unless ``file_extensions`` says otherwise.
    """
    from connectors.json_format import JSONDatasource

    source = JSONDatasource(
        paths, read_options=read_options, parse_options=parse_options, lines=lines,
        **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_json", override_num_blocks, task_args)


def read_text(
    paths: str | list[str],
    *,
    encoding: str = "utf-8",
    drop_empty_lines: bool = True,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Lines of text files, one row per line in column ``text`` (empty lines dropped by default)."""
    from connectors.text_format import TextDatasource

    source = TextDatasource(
        paths, encoding=encoding, drop_empty_lines=drop_empty_lines,
        **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_text", override_num_blocks, task_args)


def read_audio(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Audio files, one row each: ``amplitude``, a ``float32`` tensor of shape ``(channels,
    samples)``, and ``sample_rate`` (``int64``), as Ray Data's. Needs ``soundfile``
    (``pip install 'dataflow[audio]'``); ``connectors.audio_format`` has the details."""
    from connectors.audio_format import AudioDatasource

    source = AudioDatasource(
        paths, **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_audio", override_num_blocks, task_args)


def read_avro(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Records of Avro object container files (``.avro``), one row each, a column per field,
    with Arrow types from the files' Avro schema (``connectors.avro_format`` has the table).
    Needs ``fastavro`` (``pip install 'dataflow[avro]'``)."""
    from connectors.avro_format import AvroDatasource

    source = AvroDatasource(
        paths, **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_avro", override_num_blocks, task_args)


def read_binary_files(
    paths: str | list[str],
    *,
    include_paths: bool = False,
    filesystem: Any = None,
    partitioning: Any = None,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Whole files, one row each: their bytes in column ``bytes`` (and ``path`` if asked)."""
    from connectors.binary_format import BinaryDatasource

    source = BinaryDatasource(paths, **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args))
    return _read(source, "read_binary_files", override_num_blocks, task_args)


def read_images(
    paths: str | list[str],
    *,
    size: tuple[int, int] | None = None,
    mode: str | None = None,
    include_paths: bool = False,
    filesystem: Any = None,
    partitioning: Any = None,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Images decoded into ``uint8`` tensors of shape ``(height, width, channels)`` in column ``image``.

    ``size=(height, width)`` resizes every image (so they share one shape); ``mode`` is a Pillow
    mode to convert to (``"RGB"``, ``"L"``...). Needs Pillow. Ray's ``arrow_open_file_args`` is
    what it passes as the files' open-stream arguments: the same as ``arrow_open_stream_args``.
    """
    from connectors.image_format import ImageDatasource

    if "arrow_open_file_args" in task_args:  # Ray hands it on as open_stream_args
        if "arrow_open_stream_args" in task_args:
            msg = "read_images() takes arrow_open_file_args or arrow_open_stream_args, not both"
            raise TypeError(msg)
        task_args["arrow_open_stream_args"] = task_args.pop("arrow_open_file_args")
    source = ImageDatasource(
        paths, size=size, mode=mode, **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args)
    )
    return _read(source, "read_images", override_num_blocks, task_args)


def read_numpy(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    allow_pickle: bool = False,
    **task_args: Any,
) -> Dataset:
    """``.npy`` files: one row per entry of each array's first axis, in column ``data``.

    Rows of more than one dimension form a tensor column. Pickled object arrays are refused
    unless ``allow_pickle=True`` (unpickling runs code: only for files you trust). Ray's
    ``**numpy_load_args`` (``encoding``, ``fix_imports``, ``max_header_size``) go to ``np.load``.
    """
    from connectors.numpy_format import NUMPY_LOAD_ARGS, NumpyDatasource

    load_args = {k: task_args.pop(k) for k in NUMPY_LOAD_ARGS if k in task_args}
    if "mmap_mode" in task_args:
        msg = "read_numpy(mmap_mode=...): files are read whole into memory here (local or remote), not mapped"
        raise TypeError(msg)
    source = NumpyDatasource(paths, allow_pickle=allow_pickle, numpy_load_args=load_args,
                             **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter,
                                            shuffle, task_args))
    return _read(source, "read_numpy", override_num_blocks, task_args)


def read_lance(
    uri: str,
    *,
    version: int | str | None = None,
    columns: list[str] | None = None,
    filter: Any = None,
    storage_options: dict[str, str] | None = None,
    scanner_options: dict[str, Any] | None = None,
    override_num_blocks: int | None = None,
    **task_args: Any,
) -> Dataset:
    """A Lance dataset (needs the ``lance`` extra): read by fragments at one version.

    ``columns`` and ``filter`` (a SQL string such as ``"a > 3 AND b IS NOT NULL"``, or a
    ``pyarrow.compute`` expression) are evaluated by Lance's scanner; ``scanner_options`` go to
    ``LanceDataset.scanner``. See ``connectors.lance_format``.
    """
    from connectors.lance_format import LanceDatasource

    source = LanceDatasource(uri, version=version, columns=columns, filter=filter,
                             storage_options=storage_options, scanner_options=scanner_options)
    return _read(source, "read_lance", override_num_blocks, task_args)


def read_delta(
    path: str,
    version: int | None = None,
    *,
    filesystem: Any = None,
    columns: list[str] | None = None,
    filter: Any = None,
    storage_options: dict[str, str] | None = None,
    include_paths: bool = False,
    override_num_blocks: int | None = None,
    shuffle: Any = None,
    **kwargs: Any,
) -> Dataset:
    """A Delta Lake table (needs the ``delta`` extra) at ``version`` (default: the latest).

    The files of that version are taken from the table's log and read as Parquet, with partition
    columns from the log; ``columns`` and ``filter`` (a ``pyarrow.compute`` expression) are pushed
    down, and files whose partition values or statistics rule the filter out are never opened.
    ``shuffle="files"`` or ``FileShuffleConfig(seed=...)`` reads the files in a random order.
    Ray's ``**arrow_parquet_args`` go to pyarrow's Scanner, which dataflow does not use: they
    are refused saying so. See ``connectors.delta_format``.
    """
    task_args = {k: kwargs.pop(k) for k in READ_TASK_ARGS if k in kwargs}
    _refuse_scanner_args(kwargs, "read_delta")
    if kwargs:
        raise TypeError(f"read_delta() got an unexpected keyword argument {sorted(kwargs)[0]!r}")
    from connectors.delta_format import DeltaDatasource

    source = DeltaDatasource(path, version, columns=columns, filter=filter, filesystem=filesystem,
                             storage_options=storage_options, include_paths=include_paths, shuffle=shuffle)
    return _read(source, "read_delta", override_num_blocks, task_args)


def read_iceberg(
    table_identifier: str,
    *,
    row_filter: Any = None,
    selected_fields: tuple[str, ...] = ("*",),
    snapshot_id: int | None = None,
    catalog_kwargs: dict[str, Any] | None = None,
    scan_kwargs: dict[str, Any] | None = None,
    override_num_blocks: int | None = None,
    **task_args: Any,
) -> Dataset:
    """An Apache Iceberg table (needs the ``iceberg`` extra), through pyiceberg.

    ``catalog_kwargs``: ``name`` and the catalog's properties (``{"name": "default", "type":
    "sql", "uri": ...}``). ``row_filter`` (a pyiceberg expression or a string such as ``"a > 3"``)
    and ``selected_fields`` prune files and columns; deletes are applied. See
    ``connectors.iceberg_format``.
    """
    from connectors.iceberg_format import IcebergDatasource

    source = IcebergDatasource(table_identifier, row_filter=row_filter, selected_fields=selected_fields,
                               snapshot_id=snapshot_id, catalog_kwargs=catalog_kwargs, scan_kwargs=scan_kwargs)
    return _read(source, "read_iceberg", override_num_blocks, task_args)


def read_orc(
    paths: str | list[str],
    *,
    columns: list[str] | None = None,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """ORC files (a file, folder, glob or list; local or ``s3://``), read stripe by stripe.

    ``columns`` (and a later ``select_columns``) is pushed into the reader: other columns are
    never decoded. Large files are split by stripes across tasks. ``partitioning``: None (as
    Ray), or ``"hive"``; ``partition_filter`` and ``shuffle`` as for ``read_parquet``.
    """
    from connectors.orc_format import ORCDatasource

    source = ORCDatasource(
        paths, columns=columns,
        **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_orc", override_num_blocks, task_args)


def read_sql(
    sql: str,
    connection_factory: Any,
    *,
    shard_keys: list[str] | None = None,
    shard_hash_fn: str = "MD5",
    parallelism: int = -1,
    override_num_blocks: int | None = None,
    sql_params: Any = None,
    **task_args: Any,
) -> Dataset:
    """The rows of a SQL query, over any DB-API 2 connection (``lambda: sqlite3.connect(path)``).

    ``sql_params`` are bound to the query's placeholders, in the connector's own style
    (``?`` for sqlite3, ``%s`` for psycopg), as Ray's.

    Without ``shard_keys`` one task runs the query; with them the query is split into shards
    by a hash of the keys (``shard_hash_fn``, as Ray), one task each: ``override_num_blocks``
    (or ``parallelism``) of them, by default one per CPU, and never fewer than 50 rows per
    shard. Rows stream into Arrow blocks. See ``connectors.sql``.
    """
    from connectors.sql import SQLDatasource
    from dataflow.context import DataContext

    shards = override_num_blocks or (parallelism if parallelism > 0 else None)
    if shards is None and shard_keys:
        shards = DataContext.get_current().execution_options.resolved_num_cpus()
    source = SQLDatasource(sql, connection_factory, shard_keys=shard_keys, shard_hash_fn=shard_hash_fn,
                           num_shards=shards, sql_params=sql_params)
    return _read(source, "read_sql", override_num_blocks, task_args)


_TORCH_CHUNK = 4096


def _torch_value(value: Any) -> Any:
    """A torch sample as Ray 2.60's ``from_torch`` stores it: a tensor as a numpy array (a 0-d
    one as its value), a PIL image as a ``uint8`` array, anything else as it is. A tuple, list
    or dict holding tensors (``TensorDataset``'s ``(features, label)``) thus stays a Python
    object with its tensors in it, as Ray keeps it: Arrow cannot hold a tensor inside one."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch.Tensor
        array = value.detach().cpu().numpy()
        return array.item() if array.ndim == 0 else array
    if type(value).__module__.startswith("PIL."):
        return np.asarray(value)
    return value


def _tensor_lists(samples: list[Any]) -> pa.Array | None:
    """Samples that are tuples of tensors of one shape and dtype, as a list column of tensors
    (rows give lists of numpy arrays), or None for other samples."""
    first = samples[0] if samples else None
    if not isinstance(first, (list, tuple)) or not first or not isinstance(first[0], np.ndarray) or first[0].ndim == 0:
        return None
    kind = (first[0].shape, first[0].dtype)
    if not all(isinstance(s, (list, tuple)) and all(isinstance(v, np.ndarray) and (v.shape, v.dtype) == kind for v in s)
               for s in samples):
        return None
    values = pa.FixedShapeTensorArray.from_numpy_ndarray(np.stack([v for s in samples for v in s]))
    offsets = np.cumsum([0] + [len(s) for s in samples], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _torch_chunk_table(samples: list[Any], first_index: int) -> pa.Table:
    from engine.block_format import to_block

    tensors = _tensor_lists(samples)
    if tensors is not None:
        return pa.table({"item": tensors})
    try:
        return to_block({"item": samples}, DataContext.get_current().enable_fallback_to_arrow_object_ext_type)
    except (TypeError, ValueError) as exc:
        kinds = sorted({type(v).__name__ for s in samples[:1] if isinstance(s, (list, tuple)) for v in s})
        hint = (
            f" (sample {first_index} is a tuple of {', '.join(kinds)}: an Arrow column cannot hold a tuple of"
            " mixed types, and enable_fallback_to_arrow_object_ext_type is False)"
            if kinds
            else ""
        )
        msg = (
            f"from_torch: the samples cannot be stored as one Arrow column 'item'{hint}; "
            "wrap the dataset so that __getitem__ returns a dict of named fields, e.g. "
            "{'image': x, 'label': y}, and it becomes a struct column"
        )
        raise TypeError(msg) from exc


def from_torch(dataset: Any, *, local_read: bool = False, override_num_blocks: int | None = None) -> MaterializedDataset:
    """A torch ``Dataset``'s samples, one row each, in column ``item`` (as ``ray.data.from_torch``).

    The samples are read here, in this process (``dataset[i]`` for a map-style dataset, iteration
    for an iterable one). A tensor sample becomes a NumPy array (same-shape ones a tensor
    column, 0-d ones plain values), a PIL image a ``uint8`` array; a tuple, list or dict that
    holds tensors stays a Python object with its tensors, as in Ray (``row["item"][0]`` is a
    ``torch.Tensor``); one of plain values becomes a list or struct. Python objects are pickled
    into an extension column (``engine.python_objects``) and given back as they were.
    ``local_read`` (Ray's: read on this node) is how dataflow always reads it.
    """
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        samples: Any = (dataset[i] for i in builtins.range(len(dataset)))
    elif hasattr(dataset, "__iter__"):
        samples = iter(dataset)
    else:
        msg = f"from_torch needs a torch.utils.data.Dataset (map-style or iterable), got {type(dataset).__name__}"
        raise TypeError(msg)
    tables: list[pa.Table] = []
    chunk: list[Any] = []
    count = 0
    for sample in samples:
        chunk.append(_torch_value(sample))
        count += 1
        if len(chunk) == _TORCH_CHUNK:
            tables.append(_torch_chunk_table(chunk, count - len(chunk)))
            chunk = []
    if chunk or not tables:
        tables.append(_torch_chunk_table(chunk, count - len(chunk)) if chunk else pa.table({"item": pa.array([])}))
    return _in_memory(ArrowDatasource(tables, override_num_blocks, "FromTorch"))


def from_tf(dataset: Any) -> MaterializedDataset:
    """A ``tf.data.Dataset``'s elements, one row each, as ``ray.data.from_tf``: the dataset is
    read here, in this process, through ``as_numpy_iterator()``, and its elements become rows
    as ``from_items`` makes them. A dict element (``tfds`` datasets) gives one column per key,
    arrays of one shape a tensor column and strings ``binary``; any other element (a
    ``(features, label)`` tuple) is kept in column ``item``, as a Python object for a tuple of
    arrays. For small datasets: everything is held in memory at once. tensorflow is not
    imported here (the dataset brings it).
    """
    as_numpy_iterator = getattr(dataset, "as_numpy_iterator", None)
    if as_numpy_iterator is None:
        msg = f"from_tf takes a tf.data.Dataset, got {type(dataset).__name__}"
        raise TypeError(msg)
    return from_items(list(as_numpy_iterator()))


def from_huggingface(
    dataset: Any, *, parallelism: int = -1, concurrency: int | None = None, override_num_blocks: int | None = None
) -> Dataset:
    """A Hugging Face ``datasets.Dataset``, through its Arrow table (no row-by-row conversion).

    Selections, shuffles and splits made on the Hugging Face side are applied (their index
    mapping is taken into account). Pass one split of a ``DatasetDict`` (``dd["train"]``).
    """
    try:
        import datasets as hf_datasets
    except ImportError as exc:
        msg = "from_huggingface needs the 'datasets' package: pip install datasets"
        raise ImportError(msg) from exc
    if isinstance(dataset, hf_datasets.DatasetDict):
        msg = f"from_huggingface takes one split, got a DatasetDict with {list(dataset)}: pass e.g. dataset['train']"
        raise TypeError(msg)
    if not isinstance(dataset, hf_datasets.Dataset):
        msg = f"from_huggingface takes a datasets.Dataset, got {type(dataset).__name__}"
        raise TypeError(msg)
    table = dataset.with_format("arrow")[:]
    blocks = _num_blocks("from_huggingface", parallelism, override_num_blocks)
    return _read(ArrowDatasource([table], blocks, "FromHuggingFace"), "from_huggingface", None,
                 {"concurrency": concurrency})


def read_videos(
    paths: str | list[str],
    *,
    include_timestamps: bool = False,
    fps: int | None = None,
    resize: tuple[int, int] | None = None,
    filesystem: Any = None,
    partitioning: Any = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    partition_filter: Any = None,
    shuffle: Any = None,
    **task_args: Any,
) -> Dataset:
    """Frames of video files, one row each: ``frame`` (a ``uint8`` RGB tensor ``(height, width,
    3)``), ``frame_index``, and with ``include_timestamps=True`` ``frame_timestamp`` (``[start,
    end]`` seconds), as Ray Data's; ``fps`` keeps every ``round(source_fps / fps)``-th frame,
    ``resize=(height, width)`` scales them. Needs PyAV (``pip install 'dataflow[video]'``);
    ``connectors.video_format`` has the details."""
    from connectors.video_format import VideoDatasource

    source = VideoDatasource(
        paths, include_timestamps=include_timestamps, fps=fps, resize=resize,
        **_file_kwargs(filesystem, partitioning, include_paths, file_extensions, partition_filter, shuffle, task_args),
    )
    return _read(source, "read_videos", override_num_blocks, task_args)


def read_webdataset(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    decoder: Any = True,
    fileselect: Any = None,
    filerename: Any = None,
    suffixes: Any = None,
    verbose_open: bool = False,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    expand_json: bool = False,
    **kwargs: Any,
) -> Dataset:
    """WebDataset tar shards (a file, folder, glob or list; local or ``s3://``), one row per sample.

    Members are grouped into samples by key (``__key__``), one column per suffix, plus
    ``__url__``. ``decoder`` (True: images to ``uint8`` arrays, ``npy``, ``json``, ``txt``,
    ``cls``; a callable or list; False/None: bytes), ``fileselect``, ``filerename``, ``suffixes``
    and ``verbose_open`` are Ray Data's; ``expand_json=True`` makes each field of a sample's
    ``json`` member a column. Shards are streamed, never held whole; a damaged one fails naming
    the member. See ``connectors.webdataset_format``.
    """
    task_args = {k: kwargs.pop(k) for k in READ_TASK_ARGS if k in kwargs}  # the rest are the reader's
    from connectors.webdataset_format import WebDatasetDatasource

    source = WebDatasetDatasource(
        paths, decoder=decoder, fileselect=fileselect, filerename=filerename, suffixes=suffixes,
        verbose_open=verbose_open, expand_json=expand_json,
        **{**_file_kwargs(filesystem, None, include_paths, file_extensions), **kwargs},
    )
    return _read(source, "read_webdataset", override_num_blocks, task_args)


def read_tfrecords(
    paths: str | list[str],
    *,
    filesystem: Any = None,
    include_paths: bool = False,
    tf_schema: Any = None,
    compression: str | None = None,
    arrow_open_stream_args: dict[str, Any] | None = None,
    file_extensions: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    **kwargs: Any,
) -> Dataset:
    """TFRecord files of ``tf.train.Example`` records, one row per record; TensorFlow is not needed.

    One column per feature, as Ray Data: a feature with one value in every record a scalar
    column, others list columns; ``tf_schema`` fixes the types (then every feature is a list).
    Both CRCs of every record are checked. ``compression`` (``"gzip"``, ``"zlib"``; also taken
    from ``arrow_open_stream_args={"compression": ...}`` as in Ray) defaults to the extension
    (``.gz``). See ``connectors.tfrecords_format``.
    """
    task_args = {k: kwargs.pop(k) for k in READ_TASK_ARGS if k in kwargs}  # the rest are the reader's
    from connectors.tfrecords_format import TFRecordDatasource

    if arrow_open_stream_args is not None and not isinstance(arrow_open_stream_args, Mapping):
        raise TypeError(f"arrow_open_stream_args must be a dict, got {type(arrow_open_stream_args).__name__}")
    open_args = dict(arrow_open_stream_args or {})
    if compression is None:  # the records' codec (zlib too) is the reader's, not the stream's
        compression = open_args.get("compression")
    open_args.pop("compression", None)
    source = TFRecordDatasource(
        paths, tf_schema=tf_schema, compression=compression or "auto", arrow_open_stream_args=open_args or None,
        **{**_file_kwargs(filesystem, None, include_paths, file_extensions), **kwargs},
    )
    return _read(source, "read_tfrecords", override_num_blocks, task_args)
