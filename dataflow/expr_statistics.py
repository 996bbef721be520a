"""The part of a filter that Parquet statistics may prune row groups with, for float columns.

Arrow prunes a row group when the filter cannot hold for any value between the column's
min and max. A float column's statistics leave NaN out, so every comparison that is true for
NaN would drop rows: ``x != 2`` skipped a row group of ``[NaN, 2.0]``, ``~(x > 0)`` one of
``[NaN, 1.0]``, ``is_nan(x)`` any group whose other values are numbers. And a group of
``[0.0, -0.0]`` (statistics -0.0 to 0.0) was skipped for ``x.is_in([0])`` although 0.0 is in
it (pyarrow 24). The rows are then lost without an error.

``statistics_filter`` gives a weaker filter (true for every row the filter keeps) that is
safe to prune with: comparisons that are false for NaN as they are, ``is_in`` on a float
column as equalities, negations pushed down to the comparisons (``~(x == 2)`` as ``x != 2``
is true for NaN, so it prunes nothing), and anything else on a float column left out. The
read prunes with it and then applies the whole filter to the rows it reads.
"""

from __future__ import annotations

import math
from typing import Any

from dataflow.expressions import (
    BinaryExpr,
    ColumnExpr,
    Expr,
    LiteralExpr,
    NotPushable,
    Operation,
    UnaryExpr,
)

_ORDERED = (Operation.EQ, Operation.LT, Operation.LE, Operation.GT, Operation.GE)
"""Comparisons that are false when either side is NaN."""


def statistics_filter(expr: Expr, float_columns: frozenset[str]) -> Any:
    """A ``pyarrow.compute.Expression`` true for every row ``expr`` keeps, safe to prune
    row groups with, given the names of the float columns; None: prune nothing."""
    relaxed = _relax(expr, float_columns, negated=False)
    if relaxed is None:
        return None
    try:
        return relaxed.to_pyarrow()
    except NotPushable:
        return None


def _relax(expr: Expr, floats: frozenset[str], negated: bool) -> Expr | None:
    """A weaker form of ``expr`` (of ``~expr`` when ``negated``); None: no condition."""
    if not expr.columns() & floats:
        return UnaryExpr(Operation.NOT, expr) if negated else expr
    if isinstance(expr, UnaryExpr) and expr.op is Operation.NOT:
        return _relax(expr.operand, floats, not negated)
    if isinstance(expr, BinaryExpr) and expr.op in (Operation.AND, Operation.OR):
        left = _relax(expr.left, floats, negated)
        right = _relax(expr.right, floats, negated)
        # De Morgan: under a negation "and" becomes "or" and the other way round
        if (expr.op is Operation.AND) != negated:
            return right if left is None else left if right is None else left & right
        return None if left is None or right is None else left | right
    if isinstance(expr, UnaryExpr) and expr.op in (Operation.IS_NULL, Operation.IS_NOT_NULL):
        if not isinstance(expr.operand, ColumnExpr):
            return None
        if not negated:
            return expr
        flipped = Operation.IS_NOT_NULL if expr.op is Operation.IS_NULL else Operation.IS_NULL
        return UnaryExpr(flipped, expr.operand)
    if isinstance(expr, BinaryExpr) and _plain(expr.left) and _plain(expr.right):
        if expr.op in (Operation.IN, Operation.NOT_IN):
            # "x in S", or "not (x not in S)": the same rows
            return _equalities(expr) if (expr.op is Operation.IN) != negated else None
        if negated:  # of the negated comparisons only "not x != y" is false for NaN: x == y
            return BinaryExpr(Operation.EQ, expr.left, expr.right) if expr.op is Operation.NE else None
        return expr if expr.op in _ORDERED else None
    return None


def _plain(expr: Expr) -> bool:
    return isinstance(expr, (ColumnExpr, LiteralExpr))


def _equalities(expr: BinaryExpr) -> Expr | None:
    """``x.is_in(values)`` as ``x == v1 | x == v2 ...``: equal values count -0.0 as 0.0, so the
    statistics see them; None for a list holding NaN or null (which only ``is_in`` matches)."""
    values = list(expr.right.value) if isinstance(expr.right, LiteralExpr) else []
    if not values or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    result: Expr | None = None
    for value in values:
        term = BinaryExpr(Operation.EQ, expr.left, LiteralExpr(value))
        result = term if result is None else result | term
    return result
