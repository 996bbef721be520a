"""JAX ingest: ``iter_jax_batches``; the one module importing jax, imported on first use.

The stages continue ``DataIterator``'s chain:

    fetch -> rebatch -> shuffle (``dataflow.iterator``) -> format (numpy) or collate_fn
    -> check and pad (numpy) -> prefetch (background thread)
    -> synchronize (all hosts agree, ``synchronize_batches``) -> shard (a ``jax.Array`` over every device)

Every batch becomes a global ``jax.Array`` sharded along its first axis over a 1-D mesh of all
devices (axis ``"data"``), built with ``jax.make_array_from_process_local_data`` from this host's
rows, as Ray Data's ``ray.data.util.jax_util`` does. With ``jax.process_count() > 1`` each host
passes its own ``batch_size`` rows and the global batch is ``batch_size * process_count``.

Work up to the numpy batch runs on the prefetch thread. The last two stages run on the thread
that iterates: ``synchronize`` calls ``process_allgather``, a collective that every host must
enter in the same order relative to the training step's own, and the conversion to ``jax.Array``
honours the JAX settings the loop's thread has (``jax.experimental.enable_x64()``, a default
device), which are per thread. JAX dispatches the copy to the devices asynchronously, so the
loop does not wait for it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

try:
    import jax
except ImportError as err:  # pragma: no cover - depends on what is installed
    msg = "iter_jax_batches needs JAX: pip install 'dataflow[jax]' (or pip install jax)"
    raise ImportError(msg) from err

from dataflow.collate_fn import CollateFn, collate_input, stack_cells
from dataflow.iterator import DataIterator, prefetch
from engine.block_format import to_batch

logger = logging.getLogger(__name__)

MESH_AXIS = "data"
"""The name of the 1-D mesh's axis the batches are sharded along (Ray's ``_GLOBAL_MESH_1D_AXIS``)."""

NumpyBatch = np.ndarray | dict[str, np.ndarray]
Allgather = Callable[[np.ndarray], np.ndarray]

_RETRY_HINT = "set `drop_last=True` or provide a `paddings` in `iter_jax_batches()`"


def iter_jax_batches(
    iterator: DataIterator,
    *,
    prefetch_batches: int = 1,
    batch_size: int = 256,
    dtypes: Any = None,
    collate_fn: Any = None,
    drop_last: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    synchronize_batches: bool = False,
    paddings: Any = None,
) -> Iterator[tuple[Any, int]]:
    """Batches as ``{column: jax.Array}`` sharded over all JAX devices, as Ray Data's, each with
    the number of dataset rows it holds (padding rows not counted; the iterator's ``state_dict``
    counts with it).

    * ``batch_size``: rows per host and batch; a positive multiple of ``jax.local_device_count()``.
    * ``dtypes``: one JAX dtype for every column or ``{column: dtype}`` (columns left out keep
      theirs); the arrays are cast on the devices, as Ray's.
    * ``paddings``: a scalar, or one per column: a short last batch is padded to ``batch_size``
      rows with it. Without it, a last batch whose size is not a multiple of the local device
      count is an error (``drop_last=True`` drops it).
    * ``collate_fn``: an ``ArrowBatchCollateFn``/``NumpyBatchCollateFn``/``PandasBatchCollateFn``
      of ``dataflow.collate_fn`` gets the format it names, a function the numpy dict; it returns
      a ``np.ndarray`` (the batch is then one array) or a dict of them.
    * ``synchronize_batches``: with several JAX processes, the hosts agree on every batch before
      it is made (``process_allgather``, ``prefetch_batches`` batches at a time), so uneven shards
      end together (``drop_last``), are padded (``paddings``) or fail, instead of hanging.

    Arguments are checked here, when called, not at the first batch.
    """
    devices = jax.local_device_count()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0 or batch_size % devices:
        msg = (
            f"The provided batch_size ({batch_size}) must be a positive integer evenly divisible by the "
            f"number of local JAX devices ({devices}) on this host."
        )
        raise ValueError(msg)
    if collate_fn is not None and not isinstance(collate_fn, CollateFn) and not callable(collate_fn):
        msg = (
            f"Unsupported collate function: {type(collate_fn)}; pass an ArrowBatchCollateFn, "
            "NumpyBatchCollateFn or PandasBatchCollateFn (dataflow.collate_fn), or a function of the numpy dict"
        )
        raise ValueError(msg)
    check_dtypes(dtypes)
    check_paddings(paddings)
    synchronize = bool(synchronize_batches) and jax.process_count() > 1
    return _batches(
        iterator, batch_size, dtypes, collate_fn, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
        paddings, synchronize, prefetch_batches, devices,
    )


def check_dtypes(dtypes: Any) -> None:
    values = dtypes.values() if isinstance(dtypes, Mapping) else [dtypes]
    for value in values:
        if value is None:
            continue
        try:
            jax.numpy.dtype(value)
        except TypeError as err:
            msg = f"dtypes must be a JAX dtype (jnp.float32, 'bfloat16', ...) or a dict of column -> dtype, got {value!r}"
            raise TypeError(msg) from err


def check_paddings(paddings: Any) -> None:
    values = paddings.values() if isinstance(paddings, Mapping) else [paddings]
    for value in values:
        if value is not None and not isinstance(value, (int, float, bool, np.number, np.bool_)):
            msg = f"paddings must be an int, float or bool, or a dict of column -> one of them, got {value!r}"
            raise TypeError(msg)


def _batches(
    iterator: DataIterator,
    batch_size: int,
    dtypes: Any,
    collate_fn: Any,
    drop_last: bool,
    shuffle_buffer: int | None,
    shuffle_seed: int | None,
    paddings: Any,
    synchronize: bool,
    depth: int,
    devices: int,
) -> Iterator[tuple[Any, int]]:
    sharding = sharding_1d()
    tables = iterator.iter_tables(batch_size, drop_last, shuffle_buffer, shuffle_seed)

    def on_host(table: Any) -> tuple[NumpyBatch, int]:
        if collate_fn is not None:
            batch = numeric_batch(collate_fn(collate_input(collate_fn, table)), collated=True)
        else:
            batch = numeric_batch(to_batch(table, "numpy"))
        size = batch_rows(batch)
        if size and paddings is not None and size < batch_size:
            batch = pad_batch(batch, batch_size, paddings)
        elif size and paddings is None and not synchronize and size % devices:
            msg = (
                f"The local batch size ({size}) must be evenly divisible by the number of local JAX devices "
                f"({devices}) on this host. To safely truncate or pad the batch, {_RETRY_HINT}."
            )
            raise ValueError(msg)
        return batch, table.num_rows

    host_batches = (item for item in map(on_host, tables) if batch_rows(item[0]))
    ahead = prefetch(host_batches, depth)
    try:
        batches: Iterator[tuple[NumpyBatch, int]] = ahead
        if synchronize:
            batches = synchronized(
                ahead, process_allgather, lookahead=max(depth, 1), drop_last=drop_last, batch_size=batch_size,
                paddings=paddings, devices=devices,
            )
        for batch, rows in batches:
            yield to_jax(batch, sharding, dtypes), rows
    finally:
        ahead.close()  # stops the prefetch thread
        _close(tables)


def _close(tables: Iterator[Any]) -> None:
    """End the epoch's stages now (the plan's run, its blocks), not when a traceback that holds
    them is collected. If a prefetch thread is still inside them (past its join's wait), closing
    fails and is skipped: they close when the thread has let go of them and they are collected."""
    close = getattr(tables, "close", None)
    if close is not None:
        try:
            close()
        except ValueError:  # "generator already executing": the prefetch thread is in it
            pass


# ----- the mesh ----------------------------------------------------------------------------


def sharding_1d(axis_name: str = MESH_AXIS) -> Any:
    """A ``NamedSharding`` splitting the first axis over every device of every process, in the
    topology-aware order of ``mesh_utils.create_device_mesh`` (plain ``jax.devices()`` order
    when it cannot make one)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = None
    try:
        from jax.experimental import mesh_utils

        devices = mesh_utils.create_device_mesh((jax.device_count(),))
    except Exception as err:  # an unknown topology: the default order works, only slower
        logger.debug("jax.experimental.mesh_utils could not order the devices (%s); using jax.devices()", err)
    if devices is None:
        devices = np.array(jax.devices())
    return NamedSharding(Mesh(devices, (axis_name,)), PartitionSpec(axis_name))


def process_allgather(infos: np.ndarray) -> np.ndarray:
    """Every process's ``infos``, stacked: one row per process (a collective: all must call it)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(jax.numpy.asarray(infos, dtype=jax.numpy.int32)))


# ----- numpy batches -----------------------------------------------------------------------


def numeric_batch(batch: Any, collated: bool = False) -> NumpyBatch:
    """``batch`` as one numeric array or a dict of them; a column JAX cannot hold is an error naming it."""
    if isinstance(batch, Mapping):
        return {name: numeric_column(name, values, collated) for name, values in batch.items()}
    if collated and not isinstance(batch, (str, bytes)) and hasattr(batch, "__array__"):
        return numeric_column(None, batch, collated)
    kind = type(batch).__name__
    msg = f"collate_fn must return a np.ndarray or a dict of np.ndarray (they become jax.Arrays), got {kind}"
    raise TypeError(msg)


def numeric_column(name: str | None, values: Any, collated: bool = False) -> np.ndarray:
    array = values if isinstance(values, np.ndarray) else np.asarray(values)
    if array.dtype == object:
        array = stack_cells(
            array, "the array collate_fn returned" if name is None else f"column {name!r}", "one jax.Array",
            "resize or pad them in a map or map_batches, or build the batch with collate_fn",
            "which is not a valid JAX array type (only numeric types are); drop it (select_columns / "
            "drop_columns) or convert it with collate_fn",
        )
    if array.dtype.kind in "biufc" or array.dtype.type.__module__ == "ml_dtypes":  # bfloat16, float8_*
        return array
    what = "the array collate_fn returned" if name is None else f"column {name!r}"
    fix = "return numeric arrays from collate_fn" if collated else (
        "drop it (select_columns / drop_columns) or convert it with collate_fn"
    )
    msg = f"{what} has dtype {array.dtype}, which is not a valid JAX array type (only numeric types are); {fix}"
    raise TypeError(msg)


def batch_rows(batch: NumpyBatch) -> int:
    """Rows of a batch: its first column's length (0 for a dict without columns)."""
    if isinstance(batch, dict):
        first = next(iter(batch.values()), None)
        return 0 if first is None else len(first)
    return len(batch)


def column_value(spec: Any, name: str | None, what: str) -> Any:
    """The ``dtypes``/``paddings`` entry for column ``name`` (None: the batch is one array)."""
    if not isinstance(spec, Mapping):
        return spec
    if name is None:
        if len(spec) != 1:
            msg = f"When constructing a single-tensor batch, only a single {what} should be given, instead got: {spec}"
            raise ValueError(msg)
        return next(iter(spec.values()))
    if what == "dtype":
        return spec.get(name)  # columns left out keep their dtype
    if name not in spec:
        msg = f"paddings has no value for column {name!r} (it has {sorted(spec)}); give every column one, or one scalar"
        raise KeyError(msg)
    return spec[name]


def pad_batch(batch: NumpyBatch, size: int, paddings: Any) -> NumpyBatch:
    """``batch`` grown to ``size`` rows, each column with its padding value."""
    if isinstance(batch, dict):
        return {name: _pad(name, array, size, column_value(paddings, name, "padding")) for name, array in batch.items()}
    return _pad(None, batch, size, column_value(paddings, None, "padding"))


def dummy_batch(template: NumpyBatch, size: int, paddings: Any) -> NumpyBatch:
    """A batch of ``size`` rows shaped like ``template``, all padding (for a host out of data)."""
    if isinstance(template, dict):
        return {name: _pad(name, array[:0], size, column_value(paddings, name, "padding"))
                for name, array in template.items()}
    return _pad(None, template[:0], size, column_value(paddings, None, "padding"))


def _pad(name: str | None, array: np.ndarray, size: int, value: Any) -> np.ndarray:
    if len(array) >= size:
        return array
    try:
        filler = np.full((size - len(array), *array.shape[1:]), value, dtype=array.dtype)
    except (OverflowError, ValueError, TypeError) as err:
        what = "the batch" if name is None else f"column {name!r}"
        msg = f"padding {value!r} does not fit {what}, of dtype {array.dtype}: {err}"
        raise _builtin_class(err)(msg) from err
    return np.concatenate([array, filler])


# ----- synchronize across hosts ------------------------------------------------------------


def synchronized(
    batches: Iterator[tuple[NumpyBatch, int]],
    allgather: Allgather,
    *,
    lookahead: int,
    drop_last: bool,
    batch_size: int,
    paddings: Any,
    devices: int,
) -> Iterator[tuple[NumpyBatch, int]]:
    """This host's batches, in step with every other host's: Ray's ``_yield_batches_with_sync``.

    Each round takes up to ``lookahead`` local batches and shares ``(has a batch, its rows)`` for
    each through ``allgather`` (rows: one per host). A batch only some hosts have ends the epoch
    (``drop_last``), is matched by a batch of padding on the others (``paddings``), or is an
    error; without paddings, every host's batch must have the same size, a multiple of
    ``devices``. Padding batches count 0 rows.
    """
    template: NumpyBatch | None = None
    while True:
        window = list(itertools.islice(batches, lookahead))
        if template is None and window:
            template = window[0][0]
        infos = np.zeros((lookahead, 2), dtype=np.int32)
        for i, (batch, _) in enumerate(window):
            infos[i] = (1, batch_rows(batch))
        gathered = np.asarray(allgather(infos.reshape(-1))).reshape(-1, lookahead, 2)
        for i in range(lookahead):
            have, sizes = gathered[:, i, 0], gathered[:, i, 1]
            if not have.any():
                return
            if not have.all():  # some hosts are out of batches, others are not
                if drop_last:
                    return
                if paddings is None:
                    msg = (
                        "Uneven number of batches detected across JAX workers. To safely drop orphaned "
                        f"batches without hanging, {_RETRY_HINT}."
                    )
                    raise ValueError(msg)
            if paddings is not None:
                if i < len(window):
                    yield window[i]  # padded to batch_size on the prefetch thread
                    continue
                if template is None:
                    msg = (
                        "Cannot create dummy batches for synchronization because this JAX host has not "
                        "received any data batches to use as a template. This usually happens if one JAX "
                        "host's dataset shard is completely empty while others have data. Ensure that all "
                        "JAX hosts have at least one batch of data, or use `drop_last=True` to avoid "
                        "yielding dummy batches."
                    )
                    raise ValueError(msg)
                yield dummy_batch(template, batch_size, paddings), 0
                continue
            low, high = int(sizes.min()), int(sizes.max())
            if high > low:
                msg = (
                    f"Uneven batch sizes detected across JAX workers. Host batch sizes range from {low} to "
                    f"{high}. To handle uneven batch sizes, provide a `paddings` in `iter_jax_batches()`."
                )
                raise ValueError(msg)
            if low % devices:
                msg = (
                    f"The globally minimum batch size ({low}) must be evenly divisible by the number of local "
                    f"JAX devices ({devices}) on this host. To safely truncate or pad the batch, {_RETRY_HINT}."
                )
                raise ValueError(msg)
            yield window[i]


# ----- numpy -> jax.Array ------------------------------------------------------------------


def to_jax(batch: NumpyBatch, sharding: Any, dtypes: Any = None) -> Any:
    """One global ``jax.Array`` per column, each host's rows on its own devices."""
    if isinstance(batch, np.ndarray):
        return _to_array(None, batch, sharding, column_value(dtypes, None, "dtype"))
    return {name: _to_array(name, array, sharding, column_value(dtypes, name, "dtype")) for name, array in batch.items()}


def _to_array(name: str | None, array: np.ndarray, sharding: Any, dtype: Any) -> Any:
    global_shape = (len(array) * jax.process_count(), *array.shape[1:])
    try:
        out = jax.make_array_from_process_local_data(sharding, array, global_shape)
        if dtype is not None and out.dtype != jax.numpy.dtype(dtype):
            out = out.astype(dtype)
    except (TypeError, ValueError) as err:
        what = "the batch" if name is None else f"column {name!r}"
        msg = f"JAX Array Conversion Error for {what} (dtype {array.dtype}, shape {array.shape}): {err}"
        raise _builtin_class(err)(msg) from err
    return out


def _builtin_class(err: BaseException) -> type[Exception]:
    """The built-in class of ``err`` to re-raise it as, with a message naming the column (an
    ``except`` for the original's built-in class still catches it)."""
    for cls in (OverflowError, TypeError, ValueError):
        if isinstance(err, cls):
            return cls
    return ValueError


__all__ = ["iter_jax_batches", "sharding_1d", "synchronized", "to_jax"]
