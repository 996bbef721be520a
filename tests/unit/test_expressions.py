"""dataflow.expressions and the filter-string parser, on Arrow tables and plans (nothing runs)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import dataflow
import dataflow.expressions
from dataflow.builtins import FilterExpression
from dataflow.expression_parser import parse
from dataflow.expressions import Expr, FilterExpr, WithColumns, col, lit
from dataflow.optimizer import count_from_metadata, optimize
from dataflow.plan import MapStages, Read

TABLE = pa.table(
    {
        "a": pa.array([7, -7, 6, None, 0], pa.int64()),
        "b": pa.array([2, 2, -4, 1, 3], pa.int64()),
        "f": [7.5, -7.5, 1.0, None, 0.5],
        "s": ["Ab ", "x", "yz", None, "abc"],
        "t": [True, False, None, True, False],
    }
)


def _projected(expr: Expr) -> list:
    """The values of ``expr.to_pyarrow()``, computed by Arrow's own projection."""
    return pads.dataset(TABLE).to_table(columns={"r": expr.to_pyarrow()})["r"].to_pylist()


def _values(expr: Expr) -> list:
    return expr.evaluate(TABLE).to_pylist()


def _py(op, x, y):
    return None if x is None or y is None else op(x, y)


# ----- every operator, on a table and as a pyarrow expression --------------------------------------

A, B, F = TABLE["a"].to_pylist(), TABLE["b"].to_pylist(), TABLE["f"].to_pylist()

CASES = [
    (col("a") + 1, [8, -6, 7, None, 1]),
    (1 + col("a"), [8, -6, 7, None, 1]),
    (col("a") - col("b"), [5, -9, 10, None, -3]),
    (10 - col("a"), [3, 17, 4, None, 10]),
    (col("a") * col("b"), [14, -14, -24, None, 0]),
    (2 * col("a"), [14, -14, 12, None, 0]),
    (col("a") / col("b"), [3.5, -3.5, -1.5, None, 0.0]),
    (1 / col("b"), [0.5, 0.5, -0.25, 1.0, 1 / 3]),
    (col("f") * 2 + lit(1), [16.0, -14.0, 3.0, None, 2.0]),
    (-col("a"), [-7, 7, -6, None, 0]),
    (col("a") == 7, [True, False, False, None, False]),
    (col("a") != 7, [False, True, True, None, True]),
    (col("a") < 6, [False, True, False, None, True]),
    (col("a") <= 6, [False, True, True, None, True]),
    (col("a") > 6, [True, False, False, None, False]),
    (col("a") >= 6, [True, False, True, None, False]),
    (3 < col("b"), [False, False, False, False, False]),  # Python turns it into b > 3
    (col("s") == "x", [False, True, False, None, False]),
    ((col("a") > 0) & (col("b") > 0), [True, False, False, None, False]),
    ((col("a") > 0) | (col("b") > 2), [True, False, True, None, True]),
    (~(col("a") > 0), [False, True, False, None, True]),
    (col("t") & True, [True, False, None, True, False]),
    (True | col("t"), [True, True, True, True, True]),  # Kleene: true or null is true
    (col("a").is_null(), [False, False, False, True, False]),
    (col("a").is_not_null(), [True, True, True, False, True]),
    (col("a").is_in([7, 0]), [True, False, False, False, True]),
    (col("s").is_in(("x", "abc")), [False, True, False, False, True]),
    (col("a").not_in([7, 0]), [False, True, True, True, False]),
    (col("a").fill_null(-1), [7, -7, 6, -1, 0]),
    (col("f").fill_null(col("b")), [7.5, -7.5, 1.0, 1.0, 0.5]),
    (col("a").cast("float64") / 2, [3.5, -3.5, 3.0, None, 0.0]),
    (col("f").cast(pa.int32(), safe=False), [7, -7, 1, None, 0]),
    (col("a").alias("renamed") + 1, [8, -6, 7, None, 1]),
    (col("s").str.upper(), ["AB ", "X", "YZ", None, "ABC"]),
    (col("s").str.lower(), ["ab ", "x", "yz", None, "abc"]),
    (col("s").str.len(), [3, 1, 2, None, 3]),
    (col("s").str.byte_len(), [3, 1, 2, None, 3]),
    (col("s").str.capitalize(), ["Ab ", "X", "Yz", None, "Abc"]),
    (col("s").str.title(), ["Ab ", "X", "Yz", None, "Abc"]),
    (col("s").str.reverse(), [" bA", "x", "zy", None, "cba"]),
    (col("s").str.contains("b"), [True, False, False, None, True]),
    (col("s").str.contains("B", ignore_case=True), [True, False, False, None, True]),
    (col("s").str.starts_with("a"), [False, False, False, None, True]),
    (col("s").str.starts_with("a", ignore_case=True), [True, False, False, None, True]),
    (col("s").str.ends_with("z"), [False, False, True, None, False]),
    (col("s").str.match("a_c"), [False, False, False, None, True]),
    (col("s").str.match_regex("^[xy]"), [False, True, True, None, False]),
    (col("s").str.replace("b", "B"), ["AB ", "x", "yz", None, "aBc"]),
    (col("s").str.slice(0, 2), ["Ab", "x", "yz", None, "ab"]),
    (col("s").str.strip(), ["Ab", "x", "yz", None, "abc"]),
    (col("s").str.strip("aA "), ["b", "x", "yz", None, "bc"]),
    (col("s").str.lstrip("A"), ["b ", "x", "yz", None, "abc"]),
    (col("s").str.rstrip(), ["Ab", "x", "yz", None, "abc"]),
    (col("s").str.len() > 2, [True, False, False, None, True]),
    # the rest of Ray 2.60's .str names (the same pyarrow functions, results checked against Ray)
    (col("s").str.swapcase(), ["aB ", "X", "YZ", None, "ABC"]),
    (col("s").str.is_alpha(), [False, True, True, None, True]),
    (col("s").str.is_alnum(), [False, True, True, None, True]),
    (col("s").str.is_digit(), [False, False, False, None, False]),
    (col("s").str.is_decimal(), [False, False, False, None, False]),
    (col("s").str.is_numeric(), [False, False, False, None, False]),
    (col("s").str.is_space(), [False, False, False, None, False]),
    (col("s").str.is_lower(), [False, True, True, None, True]),
    (col("s").str.is_upper(), [False, False, False, None, False]),
    (col("s").str.is_title(), [True, False, False, None, False]),
    (col("s").str.is_printable(), [True, True, True, None, True]),
    (col("s").str.is_ascii(), [True, True, True, None, True]),
    (col("s").str.find("b"), [1, -1, -1, None, 1]),
    (col("s").str.count("B", ignore_case=True), [1, 0, 0, None, 1]),
    (col("s").str.find_regex("[yz]"), [-1, -1, 0, None, -1]),
    (col("s").str.count_regex("[a-z]"), [1, 1, 2, None, 3]),
    (col("s").str.replace_regex("([a-z])", "<\\1>"), ["A<b> ", "<x>", "<y><z>", None, "<a><b><c>"]),
    (col("s").str.replace_slice(0, 1, "Z"), ["Zb ", "Z", "Zz", None, "Zbc"]),
    (col("s").str.repeat(2), ["Ab Ab ", "xx", "yzyz", None, "abcabc"]),
    (col("s").str.center(5, "*"), ["*Ab *", "**x**", "*yz**", None, "*abc*"]),
    (col("s").str.lpad(3, "_"), ["Ab ", "__x", "_yz", None, "abc"]),
    (col("s").str.rpad(3, "_"), ["Ab ", "x__", "yz_", None, "abc"]),
    (col("s").str.pad(4, "-", side="left"), ["-Ab ", "---x", "--yz", None, "-abc"]),
    (col("s").str.pad(4, side="both"), ["Ab  ", " x  ", " yz ", None, "abc "]),
]


def test_splits_and_extract_give_lists_and_structs():
    splits = [
        (col("s").str.split("b"), [["A", " "], ["x"], ["yz"], None, ["a", "c"]]),
        (col("s").str.split_regex("[by]"), [["A", " "], ["x"], ["", "z"], None, ["a", "c"]]),
        (col("s").str.split_whitespace(), [["Ab", ""], ["x"], ["yz"], None, ["abc"]]),
        (col("s").str.split("b", max_splits=0), [["Ab "], ["x"], ["yz"], None, ["abc"]]),
    ]
    for expr, expected in splits:
        assert expr.evaluate(TABLE).to_pylist() == expected
        assert _projected(expr) == expected
    assert col("s").str.extract("(?P<first>[a-z])").evaluate(TABLE).to_pylist() == [
        {"first": "b"}, {"first": "x"}, {"first": "y"}, None, {"first": "a"}]
    with pytest.raises(ValueError, match="side must be 'left', 'right', or 'both'"):
        col("s").str.pad(3, side="middle")


@pytest.mark.parametrize(("expr", "expected"), CASES, ids=[str(e) for e, _ in CASES])
def test_operator_on_a_table_and_as_a_pyarrow_expression(expr, expected):
    assert _values(expr) == pytest.approx(expected)
    assert _projected(expr) == pytest.approx(expected)


def test_a_boolean_expression_filters_a_table_through_pyarrow():
    expr = (col("a") >= 0) & col("s").str.contains("b")
    assert TABLE.filter(expr.to_arrow())["a"].to_pylist() == [7, 0]
    assert isinstance(expr.to_arrow(), pc.Expression)
    assert expr.to_arrow().equals(expr.to_pyarrow())


def test_floor_division_and_modulo_follow_python():
    for expr, op in ((col("a") // col("b"), lambda x, y: x // y), (col("a") % col("b"), lambda x, y: x % y)):
        expected = [_py(op, x, y) for x, y in zip(A, B, strict=True)]
        on_table = expr.evaluate(TABLE)
        assert on_table.to_pylist() == expected
        assert pa.types.is_integer(on_table.type)  # two integers stay integers on a table
        assert _projected(expr) == pytest.approx(expected)  # float64 inside a pyarrow expression
    floats = [_py(lambda x, y: x // y, x, 2) for x in F]
    assert _values(col("f") // 2) == floats
    assert _values(col("f") % 2) == [_py(lambda x, y: x % y, x, 2) for x in F]
    assert _values(7 // col("b")) == [7 // y for y in B]
    assert _values(-7 % col("b")) == [-7 % y for y in B]


def test_a_constant_expression_fills_every_row():
    assert _values(lit(3)) == [3] * TABLE.num_rows
    assert _values(lit(2) * 4) == [8] * TABLE.num_rows


def test_names_columns_repr_and_structure():
    expr = ((col("a") + 1) * col("b") > 3) & col("s").is_in(["x"])
    assert expr.columns() == {"a", "b", "s"}
    assert repr(expr) == "((((col('a') + 1) * col('b')) > 3) & col('s').is_in(['x']))"
    assert str(expr) == "(((col('a') + 1) * col('b')) > 3) & col('s').is_in(['x'])"
    assert col("a").name == "a" and (col("a") + 1).alias("b").name == "b" and (col("a") + 1).name is None
    assert expr.structurally_equals(((col("a") + 1) * col("b") > 3) & col("s").is_in(["x"]))
    assert not expr.structurally_equals(((col("a") + 2) * col("b") > 3) & col("s").is_in(["x"]))
    assert isinstance(col("a") == 1, Expr)  # == builds an expression, it does not compare trees
    copy = pickle.loads(pickle.dumps(expr))
    assert copy.structurally_equals(expr) and copy.evaluate(TABLE).equals(expr.evaluate(TABLE))


def test_misuse_fails_with_a_clear_error():
    with pytest.raises(TypeError, match=r"no truth value.*&"):
        bool(col("a") > 1)
    with pytest.raises(TypeError, match="no truth value"):
        _ = 0 < col("a") < 5  # a chained comparison needs bool() in between
    with pytest.raises(TypeError, match="pyarrow expression"):
        _ = col("a") + pc.field("b")
    with pytest.raises(TypeError, match="list of values"):
        col("s").is_in("abc")
    with pytest.raises(TypeError, match="type name"):
        col("a").cast("no_such_type")
    with pytest.raises(TypeError, match="column name"):
        col(3)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="no column 'zz'; the columns are"):
        (col("zz") + 1).evaluate(TABLE)


def test_exported_from_the_package():
    assert dataflow.col is dataflow.expressions.col and dataflow.lit is dataflow.expressions.lit
    assert isinstance(dataflow.col("x") > 3, dataflow.expressions.BinaryExpr)


# ----- strings ---------------------------------------------------------------------------------

PARSED = [
    ("a > 5", col("a") > 5),
    ("a > 5 and s == 'x'", (col("a") > 5) & (col("s") == "x")),
    ("a > 5 or b <= -4", (col("a") > 5) | (col("b") <= -4)),
    ("not a > 5", ~(col("a") > 5)),
    ("(a + b) * 2 >= 10 - b", (col("a") + col("b")) * 2 >= 10 - col("b")),
    ("a / b > 1", col("a") / col("b") > 1),
    ("a // b == -2 or a % b == 1", (col("a") // col("b") == -2) | (col("a") % col("b") == 1)),
    ("-a < 0", -col("a") < 0),
    ("+a > 0", col("a") > 0),
    ("0 < a <= 7", (lit(0) < col("a")) & (col("a") <= 7)),
    ("a in [7, 0]", col("a").is_in([7, 0])),
    ("s not in ('x', 'yz')", col("s").not_in(["x", "yz"])),
    ("a in {-7}", col("a").is_in([-7])),
    ("a is None", col("a").is_null()),
    ("a is not None", col("a").is_not_null()),
    ("is_null(a) or is_not_null(s)", col("a").is_null() | col("s").is_not_null()),
    ("is_valid(a)", col("a").is_not_null()),
    ("is_in(b, [2, 3])", col("b").is_in([2, 3])),
    ("t == True", col("t") == True),  # noqa: E712 - builds an expression
    ("(a > 0) & ~(b > 2) | (f < 0)", ((col("a") > 0) & ~(col("b") > 2)) | (col("f") < 0)),
    ("col('odd name') == 1.5", col("odd name") == 1.5),
    ("user.age > 3", col("user.age") > 3),
]


@pytest.mark.parametrize(("text", "expected"), PARSED, ids=[t for t, _ in PARSED])
def test_string_is_parsed_into_the_same_expression(text, expected):
    parsed = parse(text)
    assert parsed.structurally_equals(expected), (repr(parsed), repr(expected))
    if expected.columns() <= set(TABLE.column_names):
        assert _values(parsed) == _values(expected)


def test_is_nan_in_a_string():
    table = pa.table({"x": [1.0, float("nan"), None]})
    assert parse("is_nan(x)").evaluate(table).to_pylist() == [False, True, None]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a >", "invalid filter expression 'a >'"),
        ("", "invalid filter expression ''"),
        ("__import__('os').system('true')", "is not a known function"),
        ("a.upper() == 'X'", "is not a known function"),
        ("open('/etc/passwd')", "is not a known function"),
        ("lambda: 1", "'lambda: 1' is not supported"),
        ("a ** 2 > 1", "Pow is not supported"),
        ("a if b else c", "is not supported"),
        ("a[0] > 1", "is not supported"),
        ("a == None", "x is None"),
        ("a is 3", "only compare with None"),
        ("a in b", "list of constants"),
        ("a in [b, 1]", "'b' is not one"),
        ("is_null(a, b)", "takes 1 argument, got 2"),
        ("is_null(x=a)", "no keyword arguments"),
        ("col(a) > 1", "column name in quotes"),
        ("a == b'x'", "not a number, string or boolean"),
        ("(1).real > 0", "is not a column name"),
        ("[1, 2]", "is not supported"),
    ],
)
def test_a_bad_string_raises_value_error_naming_it(text, reason):
    with pytest.raises(ValueError, match="invalid filter expression") as info:
        parse(text)
    assert reason in str(info.value)
    assert repr(text) in str(info.value)


def test_a_deeply_nested_string_is_refused():
    with pytest.raises(ValueError, match="invalid filter expression"):
        parse("(" * 10_000 + "a" + ")" * 10_000)


# ----- Dataset methods and plans -----------------------------------------------------------------


def _parquet(tmp_path) -> str:
    table = pa.table({"id": pa.array(range(100), pa.int64()), "k": [i % 4 for i in range(100)]})
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=10)
    return str(tmp_path)


@pytest.mark.parametrize("expr", ["id < 15 and k == 1", (col("id") < 15) & (col("k") == 1)], ids=["string", "expr"])
def test_filter_is_pushed_into_a_parquet_read(tmp_path, expr):
    ds = dataflow.read_parquet(_parquet(tmp_path)).filter(expr=expr)
    node = ds._plan
    assert isinstance(node, MapStages) and isinstance(node.stages[0].fn, FilterExpr)
    assert node.filter_expr.equals((pc.field("id") < 15) & (pc.field("k") == 1))
    plan = optimize(node)
    assert isinstance(plan, Read)  # the filter became part of the read
    assert plan.datasource._filter.equals(node.filter_expr)


def test_filter_keeps_taking_pyarrow_expressions():
    pushed = pc.field("id") > 3
    node = dataflow.range(10).filter(expr=pushed)._plan
    assert isinstance(node, MapStages) and isinstance(node.stages[0].fn, FilterExpression)
    assert node.filter_expr.equals(pushed) and node.stages[0].name == "Filter((id > 3))"


def test_filter_arguments_are_checked_when_called():
    ds = dataflow.range(10)
    with pytest.raises(ValueError, match=r"invalid filter expression 'id >>'"):
        ds.filter(expr="id >>")
    with pytest.raises(TypeError, match=r"takes a string.*got int"):
        ds.filter(expr=3)
    with pytest.raises(ValueError, match="exactly one of fn or expr"):
        ds.filter(lambda r: True, expr="id > 1")
    assert ds.filter(expr="id > 1")._plan.stages[0].name == "Filter(col('id') > 1)"


def test_filter_step_names_a_missing_column():
    step = FilterExpr(parse("zz > 1 and id > 0"))
    with pytest.raises(KeyError, match="no column 'zz'; the columns are \\['id'\\]"):
        step(pa.table({"id": [1, 2]}))
    assert FilterExpr(parse("id > 1"))(pa.table({"id": [1, 2]}))["id"].to_pylist() == [2]


def test_with_columns_step_adds_and_replaces_from_the_input():
    step = WithColumns({"b": col("a") * 10, "a": col("a") + 1, "c": col("b").fill_null(0)})
    out = step(pa.table({"a": [1, 2], "b": [None, 5]}))
    assert out.column_names == ["a", "b", "c"]  # a replaced in place, c appended
    assert out.to_pydict() == {"a": [2, 3], "b": [10, 20], "c": [0, 5]}  # c read the input's b
    with pytest.raises(KeyError, match="with_column\\('x'\\): no column 'zz'"):
        WithColumns({"x": col("zz")})(pa.table({"a": [1]}))


def test_with_column_plans_a_row_preserving_step():
    ds = dataflow.range(100).with_column("twice", col("id") * 2)
    assert isinstance(ds._plan, MapStages) and ds._plan.stages[0].name == "WithColumn(twice=col('id') * 2)"
    assert count_from_metadata(optimize(ds._plan)) == 100  # the row count is still known
    many = dataflow.range(100).with_columns([(col("id") + 1).alias("next"), col("id")])
    assert many._plan.stages[0].name == "WithColumns(['next', 'id'])"
    [(name, expr)] = dataflow.range(3).with_columns({"x": lit(1)})._plan.stages[0].fn.items
    assert name == "x" and expr.structurally_equals(lit(1))


def test_with_columns_arguments_are_checked_when_called():
    ds = dataflow.range(10)
    with pytest.raises(ValueError, match="has no name"):
        ds.with_columns([col("id") + 1])
    with pytest.raises(TypeError, match="expected an expression"):
        ds.with_column("x", pc.field("id"))
    with pytest.raises(TypeError, match="dict of name"):
        ds.with_columns(col("id"))
    with pytest.raises(ValueError, match="given twice"):
        ds.with_columns([col("id"), col("id").alias("id")])
    with pytest.raises(ValueError, match="at least one"):
        ds.with_columns({})
    with pytest.raises(TypeError, match="non-empty string"):
        ds.with_column("", col("id"))


def _nested_table() -> pa.Table:
    import datetime

    return pa.table({
        "items": pa.array([[3, 1, None, 2], [5, 4], None, []]),
        "nested": pa.array([[[1, 2], [3]], [[4], None], None, []]),
        "point": pa.array([{"x": 1, "y": 2}, {"x": 3, "y": 4}, None, {"x": 5, "y": 6}]),
        "at": pa.array([datetime.datetime(2026, 5, 17, 13, 45, 10), datetime.datetime(2025, 1, 2, 3, 4, 5), None,
                        datetime.datetime(2024, 12, 31, 23, 59, 59)]),
        "tags": pa.array([[("a", 1), ("b", 2)], None, [], [("c", 3)]], pa.map_(pa.string(), pa.int64())),
        "fixed": pa.array([[1, 2], [3, 4], [5, 6], [7, 8]], pa.list_(pa.int64(), 2)),
    })


@pytest.mark.parametrize(("expr", "expected"), [
    (col("items").list.len(), [4, 2, None, 0]),
    (col("items").list[0], [3, 5, None, None]),
    (col("items").list.get(-1), [2, 4, None, None]),  # from the end; null where too short
    (col("items").list[-3], [1, None, None, None]),
    (col("items").list[1:3], [[1, None], [4], None, []]),
    (col("items").list.sort(), [[1, 2, 3, None], [4, 5], None, []]),
    (col("items").list.sort("descending", "at_start"), [[None, 3, 2, 1], [5, 4], None, []]),
    (col("nested").list.flatten(), [[1, 2, 3], [4], None, []]),
    (col("point").struct["x"], [1, 3, None, 5]),
    (col("point").struct[1], [2, 4, None, 6]),
    (col("point").struct.field("y") * 10, [20, 40, None, 60]),
    (col("at").dt.year(), [2026, 2025, None, 2024]),
    (col("at").dt.month(), [5, 1, None, 12]),
    (col("at").dt.strftime("%Y-%m-%d"), ["2026-05-17", "2025-01-02", None, "2024-12-31"]),
    (col("tags").map.keys(), [["a", "b"], None, [], ["c"]]),
    (col("tags").map.values(), [[1, 2], None, [], [3]]),
    (col("fixed").arr.to_list(), [[1, 2], [3, 4], [5, 6], [7, 8]]),
])
def test_list_struct_datetime_map_and_array_functions_as_rays(expr, expected):
    table = _nested_table()
    assert expr.evaluate(table).to_pylist() == expected
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1)])  # several chunks, sliced arrays
    assert expr.evaluate(chunked).to_pylist() == expected


def test_datetime_rounding_and_the_types_the_functions_keep():
    import datetime

    table = _nested_table()
    day = col("at").dt.floor("day").evaluate(table)
    assert day.type == table.schema.field("at").type
    assert day.to_pylist()[0] == datetime.datetime(2026, 5, 17)
    assert col("at").dt.ceil("hour").evaluate(table).to_pylist()[1] == datetime.datetime(2025, 1, 2, 4)
    assert col("fixed").arr.to_list().evaluate(table).type == pa.list_(pa.int64())
    sorted_fixed = col("fixed").list.sort("descending").evaluate(table)
    assert sorted_fixed.type == pa.list_(pa.int64(), 2) and sorted_fixed.to_pylist()[0] == [2, 1]
    with pytest.raises(ValueError, match="unit must be one of"):
        col("at").dt.floor("fortnight")
    with pytest.raises(ValueError, match="order must be"):
        col("items").list.sort("up")
    with pytest.raises(TypeError, match="List indices must be integers or slices"):
        col("items").list["a"]


def test_a_filter_on_a_kernel_runs_on_the_data_and_pickles():
    step = FilterExpr(col("items").list.len() > 1)
    assert step.arrow_expr is None  # no pyarrow.compute form: not pushed into a read
    assert step(_nested_table()).num_rows == 2
    again = pickle.loads(pickle.dumps(step))
    assert again(_nested_table())["items"].to_pylist() == [[3, 1, None, 2], [5, 4]]
    assert repr(col("items").list[0]) == "col('items').list.get(index=0)"


def test_cast_takes_rays_datatype():
    """Ray's ``Expr.cast`` docstring example, with ``DataType`` from ``dataflow.datatype``."""
    import numpy as np

    from dataflow.datatype import DataType

    table = pa.table({"id": pa.array(range(4), pa.int64())})
    assert (col("id") % 2).cast(DataType.int64()).evaluate(table).type == pa.int64()
    assert col("id").cast(DataType.float64()).evaluate(table).to_pylist() == [0.0, 1.0, 2.0, 3.0]
    assert col("id").cast(DataType.string()).evaluate(table).to_pylist() == ["0", "1", "2", "3"]
    assert col("id").cast(DataType.from_numpy("int8")).evaluate(table).type == pa.int8()
    with pytest.raises(TypeError, match="Python-type-backed DataType"):
        col("id").cast(DataType(int))
    with pytest.raises(TypeError, match="DataType supports only"):
        DataType("int64")
    assert repr(DataType.int32()) == "DataType(arrow:int32)" and repr(DataType.from_numpy("float64")) == "DataType(numpy:float64)"
    assert repr(DataType(str)) == "DataType(python:str)"
    assert DataType.int64() == DataType.from_arrow(pa.int64()) != DataType.from_numpy(np.dtype("int64"))
    assert len({DataType.int64(), DataType.from_arrow(pa.int64())}) == 1
    nested = DataType.struct([("a", DataType.list(DataType.int64())), ("m", DataType.map(DataType.string(), DataType.bool()))])
    assert nested.to_arrow_dtype() == pa.struct([("a", pa.list_(pa.int64())), ("m", pa.map_(pa.string(), pa.bool_()))])
    assert nested.is_struct_type() and nested.is_nested_type() and not nested.is_list_type()
    assert DataType.tensor((2, 3), DataType.float32()).is_tensor_type()
    assert DataType.temporal("timestamp", "ms", "UTC").to_arrow_dtype() == pa.timestamp("ms", tz="UTC")
    assert DataType.uint64().is_uint64_type() and DataType.float32().is_numerical_type() and DataType.binary().is_binary_type()
    assert DataType.from_numpy("float32").to_numpy_dtype() == np.float32 and DataType.string().to_numpy_dtype() == np.dtype(object)
    assert DataType.from_dtype("int16") == DataType.from_numpy("int16") and DataType.from_dtype(None) is None
    assert DataType.infer_dtype(1.5) == DataType.float64() and DataType(int).to_python_type() is int


def test_statistics_filter_keeps_what_holds_for_nan_out_of_float_columns():
    """The filter row-group statistics prune with: true for every row the filter keeps, and
    nothing that is true for NaN (which statistics leave out) on a float column."""
    from dataflow.expr_statistics import statistics_filter

    floats = frozenset({"f"})  # (compared as text: the literals' types differ)
    f, g = pc.field("f"), pc.field("g")
    assert statistics_filter(col("f") != 2, floats) is None
    assert statistics_filter(~(col("f") > 2), floats) is None
    assert statistics_filter(parse("is_nan(f)"), floats) is None
    assert str(statistics_filter(~(col("f") != 2), floats)) == str(f == 2)
    assert str(statistics_filter(col("f") > 2, floats)) == str(f > 2)
    assert str(statistics_filter((col("g") == 1) & (col("f") != 2), floats)) == str(g == 1)
    assert statistics_filter((col("g") == 1) | (col("f") != 2), floats) is None
    assert str(statistics_filter(~((col("f") > 1) | (col("g") < 0)), floats)) == str(~(g < 0))
    assert str(statistics_filter(~((col("f") != 1) & (col("g") < 0)), floats)) == str((f == 1) | ~(g < 0))
    assert str(statistics_filter(col("f").is_in([0, 1.5]), floats)) == str((f == 0) | (f == 1.5))
    assert statistics_filter(col("f").is_in([float("nan")]), floats) is None
    assert str(statistics_filter(~col("f").not_in([3]), floats)) == str(f == 3)
    assert statistics_filter(col("f").not_in([3]), floats) is None
    assert str(statistics_filter(col("f").is_null(), floats)) == "is_null(f)"
    assert str(statistics_filter(~col("f").is_null(), floats)) == str(f.is_valid())
    assert statistics_filter((col("f") * 2) > 1, floats) is None  # not a plain comparison
    assert statistics_filter(~(col("g") != 2), floats).equals(~(g != 2))  # no float column
