"""Columns of Python objects Arrow cannot hold (a tuple of an image and a label, an instance of
the user's class), pickled one per row, as Ray Data's ``ArrowPythonObjectType`` keeps them.

The type is an Arrow extension type ``dataflow.python_object`` over ``large_binary``; it is
registered when this module is imported (every process that reads blocks imports it), so IPC
blocks and Parquet files written by dataflow come back as objects. Other Arrow readers see the
pickled bytes. Values are pickled with ``pickle`` (protocol 5), or ``cloudpickle`` for what
``pickle`` refuses (lambdas, classes defined in ``__main__``); unpickling runs code, so read
such files only from where you would import code from.

``DataContext.enable_fallback_to_arrow_object_ext_type`` (Ray's setting): None (the default)
falls back with a warning once per process, True without one, False raises the conversion
error instead.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

NAME = "dataflow.python_object"
logger = logging.getLogger("dataflow")
_warned = False


class PythonObjectType(pa.ExtensionType):
    def __init__(self) -> None:
        super().__init__(pa.large_binary(), NAME)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> PythonObjectType:
        return cls()

    def __reduce__(self) -> tuple[Any, ...]:
        return PythonObjectType, ()


PYTHON_OBJECT = PythonObjectType()
try:
    pa.register_extension_type(PYTHON_OBJECT)
except pa.ArrowKeyError:  # registered already (this module loaded twice under another name)
    pass


def is_python_object(typ: pa.DataType) -> bool:
    return isinstance(typ, pa.BaseExtensionType) and typ.extension_name == NAME


def object_array(values: Sequence[Any], fallback: bool | None, error: BaseException) -> pa.Array:
    """``values`` pickled into one column; ``error`` (Arrow's, converting them natively) is
    raised instead when ``fallback`` is False."""
    global _warned
    if fallback is False:
        raise error
    if fallback is None and not _warned:
        _warned = True
        logger.warning("%s; the values are kept as pickled Python objects, as Ray Data does (set "
                       "DataContext.enable_fallback_to_arrow_object_ext_type to silence this)", error)
    data = [None if v is None else _dumps(v) for v in values]
    return pa.ExtensionArray.from_storage(PYTHON_OBJECT, pa.array(data, type=pa.large_binary()))


def objects_to_numpy(column: pa.Array) -> np.ndarray:
    """A 1-d object array of the column's values, unpickled (None for nulls)."""
    out = np.empty(len(column), dtype=object)
    for i, data in enumerate(column.storage.to_pylist()):
        if data is not None:
            out[i] = pickle.loads(data)
    return out


def _dumps(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        return cloudpickle.dumps(value, protocol=5)  # type: ignore[no-any-return]
