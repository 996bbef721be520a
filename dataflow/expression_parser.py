"""Filter strings such as ``"a > 5 and b == 'x'"`` turned into ``dataflow.expressions.Expr``.

The string is parsed with Python's ``ast`` and nothing in it is ever evaluated: only the node
types below are accepted, names are column names, and calls are limited to a few known
functions. Anything else raises ``ValueError`` naming the expression and the part refused.

* names (``price``, ``user.age`` for a column named "user.age"), ``col("odd name")``;
* constants: numbers, strings, ``True``, ``False``, ``None`` (only in ``x is None``);
* ``+ - * / // %``, unary ``-`` and ``+``;
* ``== != < <= > >=`` (chains such as ``0 < x <= 5`` are and-ed), ``in`` / ``not in`` a list,
  tuple or set of constants, ``is None`` / ``is not None``;
* ``and``, ``or``, ``not`` (also ``&``, ``|``, ``~``);
* ``is_null(x)``, ``is_not_null(x)`` (or ``is_valid(x)``), ``is_nan(x)``, ``is_in(x, [..])``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from dataflow.expressions import Expr, FunctionExpr, LiteralExpr, col, lit

_BINARY: dict[type[ast.operator], Callable[[Expr, Expr], Expr]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Expr, Expr], Expr]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_ONE_ARGUMENT = {
    "is_null": lambda x: x.is_null(),
    "is_not_null": lambda x: x.is_not_null(),
    "is_valid": lambda x: x.is_not_null(),
    "is_nan": lambda x: FunctionExpr("is_nan", (x,)),
}
_CONSTANT_TYPES = (bool, int, float, str)


class _Refused(Exception):
    """A part of the string that is not allowed; ``parse`` turns it into a ValueError."""


def parse(text: str) -> Expr:
    """The expression ``text`` describes; ``ValueError`` naming it when it is not one we accept."""
    if not isinstance(text, str):
        msg = f"expected an expression string, got {type(text).__name__}"
        raise TypeError(msg)
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _Converter().convert(tree.body)
    except SyntaxError as exc:
        msg = f"invalid filter expression {text!r}: {exc.msg}"
        raise ValueError(msg) from None
    except _Refused as exc:
        msg = f"invalid filter expression {text!r}: {exc}"
        raise ValueError(msg) from None
    except RecursionError:
        msg = f"invalid filter expression {text!r}: nested too deeply"
        raise ValueError(msg) from None


class _Converter:
    def convert(self, node: ast.AST) -> Expr:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise _Refused(f"{_describe(node)} is not supported")
        result: Expr = method(node)
        return result

    def _BoolOp(self, node: ast.BoolOp) -> Expr:
        values = [self.convert(v) for v in node.values]
        result = values[0]
        for value in values[1:]:
            result = (result & value) if isinstance(node.op, ast.And) else (result | value)
        return result

    def _UnaryOp(self, node: ast.UnaryOp) -> Expr:
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return ~self.convert(node.operand)
        if isinstance(node.op, ast.UAdd):
            return self.convert(node.operand)
        operand = self.convert(node.operand)  # USub
        if isinstance(operand, LiteralExpr) and _is_number(operand.value):
            return lit(-operand.value)
        return -operand

    def _BinOp(self, node: ast.BinOp) -> Expr:
        combine = _BINARY.get(type(node.op))
        if combine is None:
            raise _Refused(f"the operator {type(node.op).__name__} is not supported")
        return combine(self.convert(node.left), self.convert(node.right))

    def _Compare(self, node: ast.Compare) -> Expr:
        parts = []
        left_node = node.left
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            parts.append(self._compare_one(left_node, op, right_node))
            left_node = right_node
        result = parts[0]
        for part in parts[1:]:
            result = result & part
        return result

    def _compare_one(self, left_node: ast.expr, op: ast.cmpop, right_node: ast.expr) -> Expr:
        left = self.convert(left_node)
        if isinstance(op, (ast.In, ast.NotIn)):
            values = self._constants(right_node, "in")
            return left.is_in(values) if isinstance(op, ast.In) else left.not_in(values)
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not (isinstance(right_node, ast.Constant) and right_node.value is None):
                raise _Refused("'is' and 'is not' only compare with None")
            return left.is_null() if isinstance(op, ast.Is) else left.is_not_null()
        if _is_none(left_node) or _is_none(right_node):
            raise _Refused("compare with None using 'x is None' or 'x is not None'")
        return _COMPARE[type(op)](left, self.convert(right_node))

    def _Name(self, node: ast.Name) -> Expr:
        return col(node.id)

    def _Attribute(self, node: ast.Attribute) -> Expr:
        parts = [node.attr]
        value: ast.expr = node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name):
            raise _Refused(f"{_describe(node)} is not a column name")
        parts.append(value.id)
        return col(".".join(reversed(parts)))

    def _Constant(self, node: ast.Constant) -> Expr:
        if node.value is None:
            raise _Refused("None is only allowed in 'x is None' and 'x is not None'")
        if not isinstance(node.value, _CONSTANT_TYPES):
            raise _Refused(f"the constant {node.value!r} is not a number, string or boolean")
        return lit(node.value)

    def _Call(self, node: ast.Call) -> Expr:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        known = sorted([*_ONE_ARGUMENT, "is_in", "col"])
        if name not in known:
            raise _Refused(f"{_describe(node.func)} is not a known function; known are {known}")
        if node.keywords:
            raise _Refused(f"{name}() takes no keyword arguments")
        wanted = 2 if name == "is_in" else 1
        if len(node.args) != wanted:
            raise _Refused(f"{name}() takes {wanted} argument{'s' if wanted > 1 else ''}, got {len(node.args)}")
        if name == "col":
            arg = node.args[0]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                raise _Refused("col() takes a column name in quotes")
            return col(arg.value)
        if name == "is_in":
            return self.convert(node.args[0]).is_in(self._constants(node.args[1], "is_in"))
        return _ONE_ARGUMENT[name](self.convert(node.args[0]))

    def _constants(self, node: ast.expr, what: str) -> list[Any]:
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            raise _Refused(f"{what} needs a list of constants such as [1, 2, 3], got {_describe(node)}")
        values = []
        for element in node.elts:
            converted = self.convert(element)
            if not isinstance(converted, LiteralExpr):
                raise _Refused(f"{what} needs a list of constants; {_describe(element)} is not one")
            values.append(converted.value)
        return values


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _describe(node: ast.AST) -> str:
    try:
        return repr(ast.unparse(node))
    except Exception:  # unparse of an odd node should not hide the real error
        return type(node).__name__


__all__ = ["parse"]
