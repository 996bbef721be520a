"""Column expressions, shaped like Ray Data's ``ray.data.expressions``.

    from dataflow.expressions import col, lit
    ds.filter(expr=(col("price") > 5) & col("name").str.starts_with("A"))
    ds.with_column("total", col("price") * col("quantity"))

An ``Expr`` is an immutable tree built with Python operators. It turns into a
``pyarrow.compute.Expression`` (``to_pyarrow()``, also ``to_arrow()``), which is what a filter
pushes into a Parquet read, or is evaluated on an Arrow table (``evaluate(table)``), which is
what ``with_column`` runs in its tasks. Both go through one translation (``_arrow`` on each
node), so a filter and a column computed from the same expression agree.

Arithmetic follows Python, not C: ``/`` always divides in float64; ``//`` floors and ``%`` takes
the sign of the divisor. On a table, ``//`` and ``%`` of two integer operands stay integers;
inside a ``pyarrow.compute.Expression`` (no types known yet) they are computed in float64.
``&``, ``|`` and ``~`` are SQL's three-valued logic; a comparison with a null is null, and a
filter drops the rows where its expression is null.

Strings like ``"a > 5 and b == 'x'"`` become expressions in ``expression_parser``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.builtins import FilterExpression
from dataflow.ray_api import RAY_EXPRESSIONS_API, module_getattr
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pyarrow.compute as pc

    from dataflow.expr_namespaces import ArrayNamespace, DatetimeNamespace, ListNamespace, MapNamespace, StructNamespace
else:
    from dataflow.lazy_compute import pc


class Operation(Enum):
    """What a ``BinaryExpr`` or ``UnaryExpr`` computes (names as in Ray Data)."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    MOD = "%"
    GT = ">"
    LT = "<"
    GE = ">="
    LE = "<="
    EQ = "=="
    NE = "!="
    AND = "&"
    OR = "|"
    IN = "in"
    NOT_IN = "not in"
    NOT = "~"
    NEG = "-x"
    IS_NULL = "is_null"
    IS_NOT_NULL = "is_not_null"


# the pyarrow.compute function each operation calls, by name (``pc`` is imported at first use)
_ARROW_BINARY = {
    Operation.ADD: "add_checked",
    Operation.SUB: "subtract_checked",
    Operation.MUL: "multiply_checked",
    Operation.GT: "greater",
    Operation.LT: "less",
    Operation.GE: "greater_equal",
    Operation.LE: "less_equal",
    Operation.EQ: "equal",
    Operation.NE: "not_equal",
    Operation.AND: "and_kleene",
    Operation.OR: "or_kleene",
}
_ARROW_UNARY = {
    Operation.NOT: "invert",
    Operation.NEG: "negate_checked",
    Operation.IS_NULL: "is_null",
    Operation.IS_NOT_NULL: "is_valid",
}


def _as_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, pc.Expression):
        msg = (
            f"cannot combine a dataflow expression with the pyarrow expression {value}; "
            "build both sides with dataflow.expressions.col() and lit()"
        )
        raise TypeError(msg)
    return LiteralExpr(value)


def _arrow_type(target: Any) -> pa.DataType:
    from dataflow.datatype import DataType

    if isinstance(target, DataType):  # Ray's form: col("x").cast(DataType.float64())
        if target.is_python_type():
            msg = ("Python-type-backed DataType (e.g., DataType(int), DataType(str)) requires values to infer the "
                   "Arrow type, which is not available in the cast() context. Please use an Arrow-backed DataType "
                   "instead, such as DataType.int64(), DataType.float64(), or DataType.string().")
            raise TypeError(msg)
        return target.to_arrow_dtype()
    if isinstance(target, pa.DataType):
        return target
    if isinstance(target, str):
        try:
            return pa.type_for_alias(target)
        except ValueError:
            pass
    msg = (f"cast() takes a DataType (DataType.int64()...), a pyarrow DataType or a type name such as 'int64' "
           f"or 'string', got {target!r}")
    raise TypeError(msg)


class _Context:
    """How leaves become Arrow values: ``pc.field`` / ``pc.scalar`` (no table), or a table's data."""

    def __init__(self, table: pa.Table | None = None) -> None:
        self.table = table

    def column(self, name: str) -> Any:
        if self.table is None:
            return pc.field(name)
        if name not in self.table.column_names:
            msg = f"no column {name!r}; the columns are {self.table.column_names}"
            raise ColumnNotFoundError(msg)
        return self.table.column(name)

    def literal(self, value: Any) -> Any:
        return pc.scalar(value) if self.table is None else pa.scalar(value)

    def any_string(self, left: Any, right: Any) -> bool:
        """Whether an operand is known to be a string (only on a table)."""
        if self.table is None:
            return False
        return any(pa.types.is_string(v.type) or pa.types.is_large_string(v.type) for v in (left, right))

    def both_integers(self, left: Any, right: Any) -> bool:
        """Whether both operands are known to be integers (only on a table)."""
        if self.table is None:
            return False
        return pa.types.is_integer(left.type) and pa.types.is_integer(right.type)


def _divide(left: Any, right: Any) -> Any:
    return pc.divide(left.cast(pa.float64()), right.cast(pa.float64()))


def _floordiv_and_mod(op: Operation, left: Any, right: Any, ctx: _Context) -> Any:
    if ctx.both_integers(left, right):
        # Arrow's integer divide truncates toward zero; step down where the signs differ.
        quotient = pc.divide(left, right)
        remainder = pc.subtract(left, pc.multiply(quotient, right))
        adjust = pc.and_(pc.not_equal(remainder, 0), pc.not_equal(pc.less(remainder, 0), pc.less(right, 0)))
        if op is Operation.FLOORDIV:
            return pc.if_else(adjust, pc.subtract(quotient, 1), quotient)
        return pc.if_else(adjust, pc.add(remainder, right), remainder)
    floored = pc.floor(_divide(left, right))
    if op is Operation.FLOORDIV:
        return floored
    return pc.subtract(left.cast(pa.float64()), pc.multiply(right.cast(pa.float64()), floored))


class Expr:
    """Base of all expression nodes; build them with ``col``, ``lit`` and Python operators.

    ``and``, ``or``, ``not`` and chained comparisons (``a < b < c``) cannot be overloaded in
    Python: use ``&``, ``|``, ``~`` and ``(a < b) & (b < c)``; an expression refuses ``bool()``
    so that a mistake fails instead of silently picking one side.
    """

    # arithmetic
    def __add__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.ADD, self, _as_expr(other))

    def __radd__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.ADD, _as_expr(other), self)

    def __sub__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.SUB, self, _as_expr(other))

    def __rsub__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.SUB, _as_expr(other), self)

    def __mul__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.MUL, self, _as_expr(other))

    def __rmul__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.MUL, _as_expr(other), self)

    def __truediv__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.DIV, self, _as_expr(other))

    def __rtruediv__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.DIV, _as_expr(other), self)

    def __floordiv__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.FLOORDIV, self, _as_expr(other))

    def __rfloordiv__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.FLOORDIV, _as_expr(other), self)

    def __mod__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.MOD, self, _as_expr(other))

    def __rmod__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.MOD, _as_expr(other), self)

    def __neg__(self) -> Expr:
        return UnaryExpr(Operation.NEG, self)

    # comparison
    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryExpr(Operation.EQ, self, _as_expr(other))

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryExpr(Operation.NE, self, _as_expr(other))

    def __lt__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.LT, self, _as_expr(other))

    def __le__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.LE, self, _as_expr(other))

    def __gt__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.GT, self, _as_expr(other))

    def __ge__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.GE, self, _as_expr(other))

    __hash__ = object.__hash__

    # boolean logic
    def __and__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.AND, self, _as_expr(other))

    def __rand__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.AND, _as_expr(other), self)

    def __or__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.OR, self, _as_expr(other))

    def __ror__(self, other: Any) -> Expr:
        return BinaryExpr(Operation.OR, _as_expr(other), self)

    def __invert__(self) -> Expr:
        return UnaryExpr(Operation.NOT, self)

    def __str__(self) -> str:
        text = repr(self)
        return text[1:-1] if isinstance(self, BinaryExpr) and text.startswith("(") else text

    def __bool__(self) -> bool:
        msg = (
            f"the expression {self} has no truth value: use & | ~ instead of and / or / not, "
            "and (a < b) & (b < c) instead of a < b < c"
        )
        raise TypeError(msg)

    # predicates and functions
    def is_null(self) -> Expr:
        """True where the value is null."""
        return UnaryExpr(Operation.IS_NULL, self)

    def is_not_null(self) -> Expr:
        """True where the value is not null."""
        return UnaryExpr(Operation.IS_NOT_NULL, self)

    def is_in(self, values: Iterable[Any]) -> Expr:
        """True where the value is one of ``values`` (a null value is in no list)."""
        return BinaryExpr(Operation.IN, self, _value_list(values, "is_in"))

    def not_in(self, values: Iterable[Any]) -> Expr:
        """True where the value is none of ``values``."""
        return BinaryExpr(Operation.NOT_IN, self, _value_list(values, "not_in"))

    def alias(self, name: str) -> Expr:
        """The same values under the name ``name`` (for ``with_columns([...])``)."""
        return AliasExpr(self, name)

    def cast(self, target_type: Any, safe: bool = True) -> Expr:
        """The values converted to ``target_type``: Ray's ``DataType`` (``DataType.float64()``), a
        pyarrow type, or a name such as "float32"."""
        return CastExpr(self, _arrow_type(target_type), safe)

    def fill_null(self, value: Any) -> Expr:
        """The values with nulls replaced by ``value`` (a constant or an expression)."""
        return FunctionExpr("coalesce", (self, _as_expr(value)))

    # math, named as Ray's Expr methods (pyarrow.compute functions; the logarithms,
    # exponential and trigonometry give float64, abs and negate raise on overflow)
    def _unary(self, function: str, float_result: bool = False) -> Expr:
        operand = CastExpr(self, pa.float64(), True) if float_result else self
        return FunctionExpr(function, (operand,))

    def ceil(self) -> Expr:
        return self._unary("ceil")

    def floor(self) -> Expr:
        return self._unary("floor")

    def round(self) -> Expr:
        """Half to even, as ``pyarrow.compute.round``."""
        return self._unary("round")

    def trunc(self) -> Expr:
        return self._unary("trunc")

    def ln(self) -> Expr:
        return self._unary("ln", True)

    def log10(self) -> Expr:
        return self._unary("log10", True)

    def log2(self) -> Expr:
        return self._unary("log2", True)

    def exp(self) -> Expr:
        return self._unary("exp", True)

    def sin(self) -> Expr:
        return self._unary("sin", True)

    def cos(self) -> Expr:
        return self._unary("cos", True)

    def tan(self) -> Expr:
        return self._unary("tan", True)

    def asin(self) -> Expr:
        return self._unary("asin", True)

    def acos(self) -> Expr:
        return self._unary("acos", True)

    def atan(self) -> Expr:
        return self._unary("atan", True)

    def negate(self) -> Expr:
        return self._unary("negate_checked")

    def sign(self) -> Expr:
        """-1, 0 or 1."""
        return self._unary("sign")

    def abs(self) -> Expr:
        return self._unary("abs_checked")

    def power(self, exponent: Any) -> Expr:
        return FunctionExpr("power", (self, _as_expr(exponent)))

    @property
    def str(self) -> StringNamespace:
        """String functions: ``col("name").str.upper()``."""
        return StringNamespace(self)

    @property
    def list(self) -> ListNamespace:
        """List functions: ``col("items").list.len()``, ``.list[0]``, ``.list.sort()``."""
        from dataflow.expr_namespaces import ListNamespace

        return ListNamespace(self)

    @property
    def struct(self) -> StructNamespace:
        """Struct fields: ``col("point").struct["x"]``."""
        from dataflow.expr_namespaces import StructNamespace

        return StructNamespace(self)

    @property
    def dt(self) -> DatetimeNamespace:
        """Date and time parts: ``col("at").dt.year()``, ``.dt.floor("day")``."""
        from dataflow.expr_namespaces import DatetimeNamespace

        return DatetimeNamespace(self)

    @property
    def map(self) -> MapNamespace:
        """Map keys and values: ``col("tags").map.keys()``."""
        from dataflow.expr_namespaces import MapNamespace

        return MapNamespace(self)

    @property
    def arr(self) -> ArrayNamespace:
        """Array conversions: ``col("features").arr.to_list()``."""
        from dataflow.expr_namespaces import ArrayNamespace

        return ArrayNamespace(self)

    @property
    def name(self) -> str | None:
        """The output name: the column's for ``col``, the alias's for ``alias``, else None."""
        return None

    # conversion
    def to_pyarrow(self) -> pc.Expression:
        """This expression as a ``pyarrow.compute.Expression`` (``table.filter(e)``, Parquet pushdown)."""
        return self._arrow(_Context())

    def to_arrow(self) -> pc.Expression:
        """Same as ``to_pyarrow()``."""
        return self.to_pyarrow()

    def evaluate(self, table: pa.Table) -> pa.Array | pa.ChunkedArray:
        """The values of this expression for every row of ``table``.

        Raises ``KeyError`` naming a column that ``table`` lacks.
        """
        value = self._arrow(_Context(table))
        if isinstance(value, pa.Scalar):
            return pa.repeat(value, table.num_rows)
        return value

    def columns(self) -> set[str]:
        """The names of the columns this expression reads."""
        found: set[str] = set()
        for node in self._walk():
            if isinstance(node, ColumnExpr):
                found.add(node.column)
        return found

    def structurally_equals(self, other: Any) -> bool:
        """Whether ``other`` is the same expression tree (``==`` builds a comparison instead)."""
        return type(self) is type(other) and repr(self) == repr(other)

    def _arrow(self, ctx: _Context) -> Any:
        raise NotImplementedError

    def _children(self) -> tuple[Expr, ...]:
        return ()

    def _walk(self) -> Iterable[Expr]:
        yield self
        for child in self._children():
            yield from child._walk()


@dataclass(frozen=True, eq=False, repr=False)
class ColumnExpr(Expr):
    """A reference to the column named ``column``."""

    column: str

    @property
    def name(self) -> str:
        return self.column

    def _arrow(self, ctx: _Context) -> Any:
        return ctx.column(self.column)

    def __repr__(self) -> str:
        return f"col({self.column!r})"


@dataclass(frozen=True, eq=False, repr=False)
class LiteralExpr(Expr):
    """A constant, the same for every row."""

    value: Any

    def _arrow(self, ctx: _Context) -> Any:
        return ctx.literal(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, eq=False, repr=False)
class BinaryExpr(Expr):
    """``left <op> right``."""

    op: Operation
    left: Expr
    right: Expr

    def _children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def _arrow(self, ctx: _Context) -> Any:
        left = self.left._arrow(ctx)
        if self.op in (Operation.IN, Operation.NOT_IN):
            assert isinstance(self.right, LiteralExpr)
            found = pc.is_in(left, value_set=pa.array(list(self.right.value)))
            return pc.invert(found) if self.op is Operation.NOT_IN else found
        right = self.right._arrow(ctx)
        if self.op is Operation.DIV:
            return _divide(left, right)
        if self.op in (Operation.FLOORDIV, Operation.MOD):
            return _floordiv_and_mod(self.op, left, right, ctx)
        if self.op is Operation.ADD and ctx.any_string(left, right):  # "a" + "b" joins, as in Ray
            return pc.binary_join_element_wise(left, right, "")
        return getattr(pc, _ARROW_BINARY[self.op])(left, right)

    def __repr__(self) -> str:
        if self.op in (Operation.IN, Operation.NOT_IN):
            method = "is_in" if self.op is Operation.IN else "not_in"
            return f"{self.left!r}.{method}({list(self.right.value)!r})"  # type: ignore[attr-defined]
        return f"({self.left!r} {self.op.value} {self.right!r})"


@dataclass(frozen=True, eq=False, repr=False)
class UnaryExpr(Expr):
    """``~x``, ``-x``, ``x.is_null()``, ``x.is_not_null()``."""

    op: Operation
    operand: Expr

    def _children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def _arrow(self, ctx: _Context) -> Any:
        return getattr(pc, _ARROW_UNARY[self.op])(self.operand._arrow(ctx))

    def __repr__(self) -> str:
        if self.op is Operation.NOT:
            return f"~{self.operand!r}"
        if self.op is Operation.NEG:
            return f"-{self.operand!r}"
        return f"{self.operand!r}.{self.op.value}()"


@dataclass(frozen=True, eq=False, repr=False)
class AliasExpr(Expr):
    """``expr`` under another output name."""

    expr: Expr
    alias_name: str

    @property
    def name(self) -> str:
        return self.alias_name

    def _children(self) -> tuple[Expr, ...]:
        return (self.expr,)

    def _arrow(self, ctx: _Context) -> Any:
        return self.expr._arrow(ctx)

    def __repr__(self) -> str:
        return f"{self.expr!r}.alias({self.alias_name!r})"


@dataclass(frozen=True, eq=False, repr=False)
class CastExpr(Expr):
    """``expr`` converted to ``target_type``; ``safe`` refuses lossy conversions."""

    expr: Expr
    target_type: pa.DataType
    safe: bool = True

    def _children(self) -> tuple[Expr, ...]:
        return (self.expr,)

    def _arrow(self, ctx: _Context) -> Any:
        return self.expr._arrow(ctx).cast(self.target_type, safe=self.safe)

    def __repr__(self) -> str:
        safe = "" if self.safe else ", safe=False"
        return f"{self.expr!r}.cast({str(self.target_type)!r}{safe})"


@dataclass(frozen=True, eq=False, repr=False)
class FunctionExpr(Expr):
    """A ``pyarrow.compute`` function applied to expressions, with fixed options.

    Only this module makes these (the ``.str`` functions, the math methods, ``fill_null``, the
    parser's ``is_nan``), so ``function`` is always one of a known few.
    """

    function: str
    args: tuple[Expr, ...]
    options: tuple[tuple[str, Any], ...] = ()

    def _children(self) -> tuple[Expr, ...]:
        return self.args

    def _arrow(self, ctx: _Context) -> Any:
        return getattr(pc, self.function)(*(a._arrow(ctx) for a in self.args), **dict(self.options))

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options)
        return f"{self.function}({', '.join(repr(a) for a in self.args)}{options})"


class NotPushable(TypeError):
    """An expression with a kernel of dataflow's own has no ``pyarrow.compute.Expression``
    form: it runs on the data (a filter of it is not pushed into a read)."""


@dataclass(frozen=True, eq=False, repr=False)
class KernelExpr(Expr):
    """A kernel of dataflow's own over one expression's values (the ``.list``, ``.struct``,
    ``.dt``, ``.map`` and ``.arr`` functions, ``dataflow.expr_namespaces.KERNELS``)."""

    kernel: str
    arg: Expr
    options: tuple[tuple[str, Any], ...] = ()

    def _children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def _arrow(self, ctx: _Context) -> Any:
        if ctx.table is None:
            raise NotPushable(f"{self!r} runs on the data: it has no pyarrow.compute.Expression form")
        from dataflow.expr_namespaces import KERNELS

        return KERNELS[self.kernel](self.arg._arrow(ctx), **dict(self.options))

    def __repr__(self) -> str:
        namespace, _, method = self.kernel.partition(".")
        options = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{self.arg!r}.{namespace}.{method}({options})"


@dataclass(frozen=True, eq=False, repr=False)
class UDFExpr(Expr):
    """A function of columns (Ray's ``@udf``): ``fn`` gets each argument's values for a block
    as Ray's evaluator passes them (a column as the table's ``pyarrow.ChunkedArray``, a
    constant as itself) and returns the column's values; the result is cast to ``return_dtype``."""

    fn: Any
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]
    return_dtype: Any

    def _children(self) -> tuple[Expr, ...]:
        return self.args + tuple(value for _, value in self.kwargs)

    def _arrow(self, ctx: _Context) -> Any:
        if ctx.table is None:
            raise NotPushable(f"{self!r} runs on the data: it has no pyarrow.compute.Expression form")

        def value(expr: Expr) -> Any:
            if isinstance(expr, LiteralExpr):
                return expr.value
            return expr._arrow(ctx)  # a column's values as Ray's evaluator passes them: a ChunkedArray

        result = self.fn(*(value(a) for a in self.args), **{k: value(v) for k, v in self.kwargs})
        if not isinstance(result, (pa.Array, pa.ChunkedArray)):
            result = pa.array(result.to_numpy() if hasattr(result, "to_numpy") else result)
        kind = _arrow_type(self.return_dtype) if self.return_dtype is not None else None
        return result.cast(kind) if kind is not None and result.type != kind else result

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{getattr(self.fn, '__name__', type(self.fn).__name__)}({', '.join(parts)})"


class _ClassUDF:
    """A callable class's ``@udf``: constructed where it first runs (once per process), not
    where the expression is built; pickles without its instance."""

    def __init__(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.__name__ = cls.__name__
        self._instance: Any = None

    def __call__(self, *values: Any, **named: Any) -> Any:
        if self._instance is None:
            self._instance = self.cls(*self.args, **self.kwargs)
        return self._instance(*values, **named)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_instance": None}


def udf(return_dtype: Any) -> Callable[[Any], Any]:
    """Ray's ``@udf(return_dtype=DataType.int32())``: a function of ``pyarrow.Array`` columns
    (or a callable class, constructed once per process where it runs) becomes a function of
    expressions: ``add_one(col("id"))`` is an expression for ``with_column``."""

    def decorate(fn: Any) -> Any:
        if isinstance(fn, type):
            cls = fn

            class ExpressionCallable:
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    self._udf = _ClassUDF(cls, args, kwargs)

                def __call__(self, *args: Any, **kwargs: Any) -> UDFExpr:
                    return _udf_expr(self._udf, args, kwargs, return_dtype)

            ExpressionCallable.__name__, ExpressionCallable.__qualname__ = cls.__name__, cls.__qualname__
            ExpressionCallable.__module__ = cls.__module__
            return ExpressionCallable

        @functools.wraps(fn)
        def build(*args: Any, **kwargs: Any) -> UDFExpr:
            return _udf_expr(fn, args, kwargs, return_dtype)

        return build

    return decorate


pyarrow_udf = udf
"""Ray's ``pyarrow_udf``: the same as ``udf`` here, where columns are always Arrow arrays."""


def _udf_expr(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], return_dtype: Any) -> UDFExpr:
    return UDFExpr(fn, tuple(_as_expr(a) for a in args), tuple((k, _as_expr(v)) for k, v in kwargs.items()),
                   return_dtype)


def _value_list(values: Iterable[Any], method: str) -> LiteralExpr:
    if isinstance(values, (str, bytes, Expr, pc.Expression)) or not isinstance(values, Iterable):
        msg = f"{method}() takes a list of values, got {values!r}"
        raise TypeError(msg)
    return LiteralExpr(tuple(values))


def _unary(function: str) -> Callable[[StringNamespace], Expr]:
    """A ``.str`` method that is the ``pyarrow.compute`` function ``function`` of the strings."""

    def method(self: StringNamespace) -> Expr:
        return self._call(function)

    method.__doc__ = f"``pyarrow.compute.{function}`` of each string."
    return method


class StringNamespace:
    """String functions of an expression (``expr.str``), named as in Ray Data."""

    def __init__(self, expr: Expr) -> None:
        self._expr = expr

    def _call(self, function: str, **options: Any) -> Expr:
        return FunctionExpr(function, (self._expr,), tuple(options.items()))

    def len(self) -> Expr:
        """The length of each string in characters."""
        return self._call("utf8_length")

    def byte_len(self) -> Expr:
        """The length of each string in bytes."""
        return self._call("binary_length")

    def upper(self) -> Expr:
        return self._call("utf8_upper")

    def lower(self) -> Expr:
        return self._call("utf8_lower")

    def capitalize(self) -> Expr:
        return self._call("utf8_capitalize")

    def title(self) -> Expr:
        return self._call("utf8_title")

    def reverse(self) -> Expr:
        return self._call("utf8_reverse")

    def starts_with(self, pattern: str, ignore_case: bool = False) -> Expr:
        return self._call("starts_with", pattern=pattern, ignore_case=ignore_case)

    def ends_with(self, pattern: str, ignore_case: bool = False) -> Expr:
        return self._call("ends_with", pattern=pattern, ignore_case=ignore_case)

    def contains(self, pattern: str, ignore_case: bool = False) -> Expr:
        """True where the string contains ``pattern`` (a plain substring, not a regex)."""
        return self._call("match_substring", pattern=pattern, ignore_case=ignore_case)

    def match(self, pattern: str, ignore_case: bool = False) -> Expr:
        """True where the string matches the SQL ``LIKE`` pattern (``%`` and ``_``)."""
        return self._call("match_like", pattern=pattern, ignore_case=ignore_case)

    def match_regex(self, pattern: str, ignore_case: bool = False) -> Expr:
        """True where a part of the string matches the regular expression ``pattern``."""
        return self._call("match_substring_regex", pattern=pattern, ignore_case=ignore_case)

    def replace(self, pattern: str, replacement: str, max_replacements: int | None = None) -> Expr:
        """Occurrences of the substring ``pattern`` replaced by ``replacement`` (the first
        ``max_replacements`` of each string when given, as pyarrow's option Ray passes on)."""
        return self._call("replace_substring", pattern=pattern, replacement=replacement, max_replacements=max_replacements)

    def slice(self, start: int, stop: int | None = None, step: int = 1) -> Expr:
        """Characters ``start:stop:step`` of each string."""
        return self._call("utf8_slice_codeunits", start=start, stop=stop, step=step)

    def strip(self, characters: str | None = None) -> Expr:
        """The string without leading and trailing whitespace (or ``characters``)."""
        if characters is None:
            return self._call("utf8_trim_whitespace")
        return self._call("utf8_trim", characters=characters)

    def lstrip(self, characters: str | None = None) -> Expr:
        if characters is None:
            return self._call("utf8_ltrim_whitespace")
        return self._call("utf8_ltrim", characters=characters)

    swapcase = _unary("utf8_swapcase")

    # classes of characters: true where every character is one (and there is at least one)
    is_alpha = _unary("utf8_is_alpha")
    is_alnum = _unary("utf8_is_alnum")
    is_digit = _unary("utf8_is_digit")
    is_decimal = _unary("utf8_is_decimal")
    is_numeric = _unary("utf8_is_numeric")
    is_space = _unary("utf8_is_space")
    is_lower = _unary("utf8_is_lower")
    is_upper = _unary("utf8_is_upper")
    is_title = _unary("utf8_is_title")
    is_printable = _unary("utf8_is_printable")
    is_ascii = _unary("string_is_ascii")

    # searching
    def find(self, pattern: str, ignore_case: bool = False) -> Expr:
        """The index of the first occurrence of the substring ``pattern`` (-1 if none)."""
        return self._call("find_substring", pattern=pattern, ignore_case=ignore_case)

    def count(self, pattern: str, ignore_case: bool = False) -> Expr:
        """How many times the substring ``pattern`` occurs (non-overlapping)."""
        return self._call("count_substring", pattern=pattern, ignore_case=ignore_case)

    def find_regex(self, pattern: str, ignore_case: bool = False) -> Expr:
        return self._call("find_substring_regex", pattern=pattern, ignore_case=ignore_case)

    def count_regex(self, pattern: str, ignore_case: bool = False) -> Expr:
        return self._call("count_substring_regex", pattern=pattern, ignore_case=ignore_case)

    def extract(self, pattern: str) -> Expr:
        """The named groups of the regular expression ``pattern`` (``(?P<name>...)``) as a
        struct of strings; null where it does not match."""
        return self._call("extract_regex", pattern=pattern)

    # transforming
    def replace_regex(self, pattern: str, replacement: str, max_replacements: int | None = None) -> Expr:
        """Matches of the regular expression ``pattern`` replaced (``\\1`` refers to a group)."""
        return self._call("replace_substring_regex", pattern=pattern, replacement=replacement,
                          max_replacements=max_replacements)

    def replace_slice(self, start: int, stop: int, replacement: str) -> Expr:
        """Characters ``start:stop`` replaced by ``replacement``."""
        return self._call("utf8_replace_slice", start=start, stop=stop, replacement=replacement)

    def repeat(self, n: int) -> Expr:
        return FunctionExpr("binary_repeat", (self._expr, LiteralExpr(n)))

    def split(self, pattern: str, max_splits: int | None = None, reverse: bool = False) -> Expr:
        """The list of parts between occurrences of the substring ``pattern``."""
        return self._call("split_pattern", pattern=pattern, max_splits=max_splits, reverse=reverse)

    def split_regex(self, pattern: str, max_splits: int | None = None, reverse: bool = False) -> Expr:
        return self._call("split_pattern_regex", pattern=pattern, max_splits=max_splits, reverse=reverse)

    def split_whitespace(self, max_splits: int | None = None, reverse: bool = False) -> Expr:
        return self._call("utf8_split_whitespace", max_splits=max_splits, reverse=reverse)

    def center(self, width: int, padding: str = " ") -> Expr:
        """Centered in ``width`` characters (a longer string is left whole)."""
        return self._call("utf8_center", width=width, padding=padding)

    def lpad(self, width: int, padding: str = " ") -> Expr:
        """Right-aligned in ``width`` characters, padded on the left (a longer string is left whole)."""
        return self._call("utf8_lpad", width=width, padding=padding)

    def rpad(self, width: int, padding: str = " ") -> Expr:
        """Left-aligned in ``width`` characters, padded on the right (a longer string is left whole)."""
        return self._call("utf8_rpad", width=width, padding=padding)

    def pad(self, width: int, fillchar: str = " ", side: str = "right") -> Expr:
        """Padded to ``width`` on the ``"left"``, ``"right"`` or ``"both"`` sides."""
        functions = {"left": "utf8_lpad", "right": "utf8_rpad", "both": "utf8_center"}
        if side not in functions:
            msg = f"side must be 'left', 'right', or 'both', got {side!r}"
            raise ValueError(msg)
        return self._call(functions[side], width=width, padding=fillchar)

    def rstrip(self, characters: str | None = None) -> Expr:
        if characters is None:
            return self._call("utf8_rtrim_whitespace")
        return self._call("utf8_rtrim", characters=characters)


def col(name: str) -> ColumnExpr:
    """The column ``name``: ``col("price") * col("quantity")``."""
    if not isinstance(name, str):
        msg = f"col() takes a column name, got {name!r}"
        raise TypeError(msg)
    return ColumnExpr(name)


def lit(value: Any) -> LiteralExpr:
    """A constant for every row: ``col("age") + lit(1)`` (a plain ``1`` works as well)."""
    return LiteralExpr(value)


# ----- as plan steps (run in tasks on pyarrow tables) -------------------------------------------


def _check_columns(table: pa.Table, expr: Expr, what: str) -> None:
    missing = sorted(expr.columns() - set(table.column_names))
    if missing:
        msg = f"{what}: no column {missing[0]!r}; the columns are {table.column_names}"
        raise ColumnNotFoundError(msg)


class FilterExpr:
    """``filter(expr=...)`` with a dataflow expression: keeps the rows where it is true."""

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        try:
            self.arrow_expr: pc.Expression | None = expr.to_pyarrow()
        except NotPushable:  # a kernel of dataflow's own: evaluated on each block
            self.arrow_expr = None

    def for_execution(self) -> FilterExpr:
        """A copy whose ``random()`` expressions are bound to one execution of the plan."""
        from dataflow.expr_generators import bind_for_execution

        bound = bind_for_execution(self.expr)
        return self if bound is self.expr else FilterExpr(bound)

    def __call__(self, table: pa.Table) -> pa.Table:
        _check_columns(table, self.expr, f"filter({self.expr})")
        if self.arrow_expr is None:
            return table.filter(self.expr.evaluate(table))
        return table.filter(self.arrow_expr)


class WithColumns:
    """``with_column`` / ``with_columns``: every expression reads the input columns; a new name
    is appended, an existing one is replaced where it stands. An entry without a name is an
    ``unnest(expr)``: one column per field of the struct ``expr`` gives, named after the field."""

    def __init__(self, exprs: Mapping[str, Expr] | list[tuple[str | None, Expr]]) -> None:
        self.items: list[tuple[str | None, Expr]] = list(exprs.items()) if isinstance(exprs, Mapping) else list(exprs)

    def for_execution(self) -> WithColumns:
        """A copy whose ``random()`` expressions are bound to one execution of the plan."""
        from dataflow.expr_generators import bind_for_execution

        return WithColumns([(name, bind_for_execution(expr)) for name, expr in self.items])

    def __call__(self, table: pa.Table) -> pa.Table:
        values: dict[str, Any] = {}
        for name, expr in self.items:
            what = f"with_column({name!r})" if name is not None else f"with_columns({expr!r})"
            _check_columns(table, expr, what)
            if name is not None:
                values[name] = expr.evaluate(table)
                continue
            assert isinstance(expr, UnnestExpr)
            values.update(expr.fields_of(table))
        for name, column in values.items():
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, column)
            else:
                table = table.append_column(name, column)
        return table


@dataclass(frozen=True, eq=False, repr=False)
class UnnestExpr(Expr):
    """Ray's ``unnest(expr)``: in ``with_columns``, one column per field of the struct ``expr``
    gives, named after the fields (one level deep; the struct is computed once per block).
    Ray needs the struct's type when the plan is built; here it is read from the values, so
    ``unnest`` also works after a ``map_batches`` (a value that is not a struct raises then)."""

    expr: Expr

    def _children(self) -> tuple[Expr, ...]:
        return (self.expr,)

    def alias(self, name: str) -> Expr:
        msg = ("unnest() cannot be aliased: it produces one output column per struct field, named after the "
               "fields themselves. Pass it positionally to with_columns(), e.g. ds.with_columns(unnest(expr)).")
        raise TypeError(msg)

    def _arrow(self, ctx: _Context) -> Any:
        msg = f"{self!r} stands for several columns: pass it to with_columns(), not where one value is expected"
        raise TypeError(msg)

    def fields_of(self, table: pa.Table) -> dict[str, Any]:
        """The struct's fields on ``table``, by name."""
        value = self.expr.evaluate(table)
        if not pa.types.is_struct(value.type):
            msg = f"unnest() requires a struct-typed expression, but {self.expr!r} gives {value.type}"
            raise TypeError(msg)
        names = [value.type.field(i).name for i in range(value.type.num_fields)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            msg = (f"unnest() cannot expand a struct with duplicate field names {twice}: the expanded columns "
                   "would overwrite each other.")
            raise ValueError(msg)
        chunks = value.chunks if isinstance(value, pa.ChunkedArray) else [value]
        return {name: pa.chunked_array([c.field(i) for c in chunks], type=value.type.field(i).type)
                for i, name in enumerate(names)}

    def __repr__(self) -> str:
        return f"UNNEST({self.expr!r})"


def unnest(expr: Expr) -> UnnestExpr:
    """Expand a struct-typed expression into one column per field, in ``with_columns``:
    ``ds.with_columns(unnest(make_features(col("a"), col("b"))))``."""
    if isinstance(expr, UnnestExpr):
        raise TypeError("unnest() cannot be nested inside another unnest().")
    if not isinstance(expr, Expr):
        raise TypeError(f"unnest() expects an expression, got {type(expr).__name__}.")
    return UnnestExpr(expr)


def with_columns_items(args: tuple[Any, ...], method: str = "with_columns") -> list[tuple[str | None, Expr]]:
    """The entries of ``with_columns(exprs, *more_exprs)``: each argument a mapping of name to
    expression, an ``unnest(...)``, or a list of named expressions; names given once only."""
    if not args or all(a is None for a in args):
        msg = f"{method}() needs at least one expression"
        raise ValueError(msg)
    items: list[tuple[str | None, Expr]] = []
    for arg in args:
        if arg is None:
            continue
        if isinstance(arg, UnnestExpr):
            items.append((None, arg))
        else:
            items.extend(named_exprs(arg, method).items())
    names = [name for name, _ in items if name is not None]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        msg = f"{method}(): the column {twice[0]!r} is given twice"
        raise ValueError(msg)
    return items


def named_exprs(exprs: Mapping[str, Expr] | Iterable[Expr], method: str = "with_columns") -> dict[str, Expr]:
    """``{name: expr}`` from a mapping, or from expressions that have a name (``col``, ``alias``)."""
    if isinstance(exprs, Mapping):
        pairs = list(exprs.items())
    elif isinstance(exprs, (str, Expr)) or not isinstance(exprs, Iterable):
        msg = f"{method}() takes a dict of name -> expression or a list of named expressions, got {exprs!r}"
        raise TypeError(msg)
    else:
        pairs = []
        for expr in exprs:
            if not isinstance(expr, Expr) or expr.name is None:
                msg = f"{method}(): {expr!r} has no name; give it one with .alias('name') or pass a dict"
                raise ValueError(msg)
            pairs.append((expr.name, expr))
    named: dict[str, Expr] = {}
    for name, expr in pairs:
        if not isinstance(name, str) or not name:
            msg = f"{method}(): a column name must be a non-empty string, got {name!r}"
            raise TypeError(msg)
        if not isinstance(expr, Expr):
            msg = f"{method}({name!r}): expected an expression such as col('x') * 2, got {type(expr).__name__}"
            raise TypeError(msg)
        if name in named:
            msg = f"{method}(): the column {name!r} is given twice"
            raise ValueError(msg)
        named[name] = expr
    if not named:
        msg = f"{method}() needs at least one expression"
        raise ValueError(msg)
    return named


def filter_step(expr: Any) -> tuple[str, Any, pc.Expression | None]:
    """(step name, batch function, pushable pyarrow expression) for ``filter(expr=...)``.

    ``expr`` is a string (parsed by ``expression_parser``), a dataflow ``Expr`` or a
    ``pyarrow.compute.Expression``.
    """
    if isinstance(expr, pc.Expression):
        return f"Filter({expr})", FilterExpression(expr), expr
    if isinstance(expr, str):
        from dataflow.expression_parser import parse

        expr = parse(expr)
    if not isinstance(expr, Expr):
        msg = (
            "filter(expr=...) takes a string such as \"x > 3 and y == 'a'\", an expression such as "
            f"col('x') > 3, or a pyarrow.compute.Expression; got {type(expr).__name__}"
        )
        raise TypeError(msg)
    step = FilterExpr(expr)
    return f"Filter({expr})", step, step.arrow_expr


__all__ = [
    "AliasExpr",
    "BinaryExpr",
    "CastExpr",
    "ColumnExpr",
    "DownloadExpr",
    "Expr",
    "FunctionExpr",
    "KernelExpr",
    "LiteralExpr",
    "MonotonicallyIncreasingIdExpr",
    "Operation",
    "RandomExpr",
    "StringNamespace",
    "UDFExpr",
    "UUIDExpr",
    "UnaryExpr",
    "UnnestExpr",
    "col",
    "download",
    "lit",
    "monotonically_increasing_id",
    "pyarrow_udf",
    "random",
    "udf",
    "unnest",
    "uuid",
]

from dataflow.expr_generators import (  # noqa: E402  (they subclass Expr, defined above)
    DownloadExpr,
    MonotonicallyIncreasingIdExpr,
    RandomExpr,
    UUIDExpr,
    download,
    monotonically_increasing_id,
    random,
    uuid,
)

# a Ray name this module lacks (``star``) says so
__getattr__ = module_getattr("dataflow.expressions", "ray.data.expressions", RAY_EXPRESSIONS_API)
