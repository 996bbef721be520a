"""``DataType``, as Ray Data's ``ray.data.datatype.DataType``: one type over Arrow, NumPy and
Python types, which ``Expr.cast`` takes (``col("id").cast(DataType.float64())``).

``DataType.int64()``... (every Arrow integer and float, ``string``, ``bool``, ``binary``),
``from_arrow``, ``from_numpy``, ``list``/``large_list``/``fixed_size_list``, ``struct``, ``map``,
``tensor`` (Arrow's fixed-shape tensor, the type tensor columns have here), ``temporal``, the
``is_*`` questions and ``to_arrow_dtype``/``to_numpy_dtype``. Ray's cuDF and Ray-extension
tensor forms do not exist here.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

_FACTORIES = {
    "int8": pa.int8, "int16": pa.int16, "int32": pa.int32, "int64": pa.int64,
    "uint8": pa.uint8, "uint16": pa.uint16, "uint32": pa.uint32, "uint64": pa.uint64,
    "float32": pa.float32, "float64": pa.float64,
    "string": pa.string, "bool": pa.bool_, "binary": pa.binary,
}  # fmt: skip


@dataclass(eq=False)
class DataType:
    """A type of Arrow (``pa.DataType``), NumPy (``np.dtype``) or Python (``int``, ``str``...)."""

    _physical_dtype: pa.DataType | np.dtype | type

    def __post_init__(self) -> None:
        if not isinstance(self._physical_dtype, (pa.DataType, np.dtype, type)):
            raise TypeError("DataType supports only PyArrow DataType, NumPy dtype, or Python type, but was given "
                            f"type {type(self._physical_dtype)}.")

    # where it comes from ---------------------------------------------------------------
    def is_arrow_type(self) -> bool:
        return isinstance(self._physical_dtype, pa.DataType)

    def is_numpy_type(self) -> bool:
        return isinstance(self._physical_dtype, np.dtype)

    def is_python_type(self) -> bool:
        return isinstance(self._physical_dtype, type)

    # conversions -----------------------------------------------------------------------
    def to_arrow_dtype(self, values: builtins.list[Any] | None = None) -> pa.DataType:
        """The Arrow type; a Python type needs ``values`` to infer it from."""
        if isinstance(self._physical_dtype, pa.DataType):
            return self._physical_dtype
        if isinstance(self._physical_dtype, np.dtype):
            return pa.from_numpy_dtype(self._physical_dtype)
        if not values:
            raise ValueError("Values are required to infer Arrow type if the provided type is a Python type")
        return pa.array(values).type

    def to_numpy_dtype(self) -> np.dtype:
        if isinstance(self._physical_dtype, np.dtype):
            return self._physical_dtype
        if isinstance(self._physical_dtype, pa.DataType):
            try:
                return np.dtype(self._physical_dtype.to_pandas_dtype())
            except (TypeError, ValueError, NotImplementedError, pa.ArrowNotImplementedError):
                return np.dtype("object")
        return np.dtype("object")

    def to_python_type(self) -> type:
        if isinstance(self._physical_dtype, type):
            return self._physical_dtype
        raise ValueError(f"DataType {self} is not backed by a Python type. Use to_arrow_dtype() or "
                         "to_numpy_dtype() for conversion.")

    @classmethod
    def from_arrow(cls, arrow_type: pa.DataType) -> DataType:
        return cls(arrow_type)

    @classmethod
    def from_numpy(cls, numpy_dtype: np.dtype | str) -> DataType:
        return cls(np.dtype(numpy_dtype))

    @classmethod
    def from_dtype(cls, dtype: Any) -> DataType | None:
        """A DataType of an Arrow type, a NumPy dtype (or its name) or a Python type; None for None."""
        if dtype is None:
            return None
        if isinstance(dtype, DataType):
            return dtype
        if isinstance(dtype, (pa.DataType, type)):
            return cls(dtype)
        return cls(np.dtype(dtype))

    @classmethod
    def infer_dtype(cls, value: Any) -> DataType:
        """The Arrow type of ``value``."""
        return cls(pa.array([value]).type)

    # nested and special types ------------------------------------------------------------
    @classmethod
    def list(cls, value_type: DataType) -> DataType:
        return cls(pa.list_(value_type.to_arrow_dtype()))

    @classmethod
    def large_list(cls, value_type: DataType) -> DataType:
        return cls(pa.large_list(value_type.to_arrow_dtype()))

    @classmethod
    def fixed_size_list(cls, value_type: DataType, list_size: int) -> DataType:
        return cls(pa.list_(value_type.to_arrow_dtype(), list_size))

    @classmethod
    def struct(cls, fields: builtins.list[tuple[str, DataType]]) -> DataType:
        return cls(pa.struct([(name, kind.to_arrow_dtype()) for name, kind in fields]))

    @classmethod
    def map(cls, key_type: DataType, value_type: DataType) -> DataType:
        return cls(pa.map_(key_type.to_arrow_dtype(), value_type.to_arrow_dtype()))

    @classmethod
    def tensor(cls, shape: tuple[int, ...], dtype: DataType) -> DataType:
        """A fixed-shape tensor: Arrow's ``fixed_shape_tensor``, the type tensor columns have here."""
        return cls(pa.fixed_shape_tensor(dtype.to_arrow_dtype(), builtins.list(shape)))

    @classmethod
    def variable_shaped_tensor(cls, dtype: DataType, ndim: int = 2) -> DataType:
        """A tensor whose shape varies by row, ``ndim`` dimensions (Ray's
        ``ArrowVariableShapedTensorType``): the type ragged tensor columns have here."""
        from engine.ragged_tensors import ragged_type

        return cls(ragged_type(dtype.to_arrow_dtype(), ndim))

    @classmethod
    def temporal(cls, temporal_type: str, unit: str | None = None, tz: str | None = None) -> DataType:
        """``"timestamp"`` (``unit`` "s"/"ms"/"us"/"ns", default "us"; ``tz``), ``"date32"``,
        ``"date64"``, ``"time32"`` ("s"/"ms"), ``"time64"`` ("us"/"ns"), ``"duration"``."""
        makers = {
            "timestamp": lambda: pa.timestamp(unit or "us", tz=tz),
            "date32": pa.date32,
            "date64": pa.date64,
            "time32": lambda: pa.time32(unit or "ms"),
            "time64": lambda: pa.time64(unit or "us"),
            "duration": lambda: pa.duration(unit or "us"),
        }
        if temporal_type not in makers:
            raise ValueError(f"temporal_type must be one of {sorted(makers)}, got {temporal_type!r}")
        return cls(makers[temporal_type]())

    # questions ---------------------------------------------------------------------------
    def _arrow(self) -> pa.DataType | None:
        try:
            return self.to_arrow_dtype()
        except (ValueError, pa.ArrowNotImplementedError, TypeError):
            return None

    def _is(self, *tests: Any) -> bool:
        kind = self._arrow()
        return kind is not None and any(test(kind) for test in tests)

    def is_list_type(self) -> bool:
        return self._is(pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)

    def is_tensor_type(self) -> bool:
        return self._is(lambda t: isinstance(t, pa.FixedShapeTensorType))

    def is_struct_type(self) -> bool:
        return self._is(pa.types.is_struct)

    def is_map_type(self) -> bool:
        return self._is(pa.types.is_map)

    def is_nested_type(self) -> bool:
        return self.is_list_type() or self.is_struct_type() or self.is_map_type()

    def is_null_type(self) -> bool:
        return self._is(pa.types.is_null)

    def is_boolean_type(self) -> bool:
        return self._is(pa.types.is_boolean)

    def is_integer_type(self) -> bool:
        return self._is(pa.types.is_integer)

    def is_floating_type(self) -> bool:
        return self._is(pa.types.is_floating)

    def is_uint64_type(self) -> bool:
        return self._is(pa.types.is_uint64)

    def is_numerical_type(self) -> bool:
        return self._is(pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)

    def is_string_type(self) -> bool:
        return self._is(pa.types.is_string, pa.types.is_large_string)

    def is_binary_type(self) -> bool:
        return self._is(pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)

    def is_temporal_type(self) -> bool:
        return self._is(pa.types.is_temporal)

    def __repr__(self) -> str:
        if isinstance(self._physical_dtype, pa.DataType):
            return f"DataType(arrow:{self._physical_dtype})"
        if isinstance(self._physical_dtype, np.dtype):
            return f"DataType(numpy:{self._physical_dtype})"
        return f"DataType(python:{self._physical_dtype.__name__})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DataType) or type(self._physical_dtype) is not type(other._physical_dtype):
            return False
        return bool(self._physical_dtype == other._physical_dtype)

    def __hash__(self) -> int:
        return hash((type(self._physical_dtype), str(self._physical_dtype)))


def _factory(name: str, make: Any) -> classmethod:  # type: ignore[type-arg]
    def factory(cls: type[DataType]) -> DataType:
        return cls(make())

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"A DataType of Arrow's {make()}."
    return classmethod(factory)


for _name, _make in _FACTORIES.items():
    setattr(DataType, _name, _factory(_name, _make))
