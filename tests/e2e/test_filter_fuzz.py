"""Random filters over random Parquet files, checked against Python's evaluation of the same
condition on the same rows: int, float (NaN, -0.0), string and bool columns with nulls, hive
partition folders, row groups of 1-40 rows (so statistics prune), and conditions of
comparisons, ``in``, ``is None``, ``is_nan``, arithmetic, ``and``/``or``/``not``. Each one runs
pushed into the read (as a string, as a pyarrow expression), after a map (not pushed), on the
same rows in memory, projected, and counted. A failing case names its seed in the test id."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.expression_parser import parse

SEEDS = range(int(os.environ.get("DATAFLOW_FUZZ_SEEDS", "8")) * 5)
"""More for a soak: ``DATAFLOW_FUZZ_SEEDS=100 pytest tests/e2e/test_filter_fuzz.py``."""

COLUMNS = ("i", "f", "s", "b", "p")
SCHEMA = pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("b", pa.bool_()), ("p", pa.string())])
STRINGS = ["", "a", "ab", "b", "ba", "z", "é", "A"]
COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
           "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    def maybe(value: Any, p: float = 0.15) -> Any:
        return None if rng.random() < p else value

    rows = []
    for _ in range(n):
        u = rng.random()
        f = None if u < 0.1 else math.nan if u < 0.2 else rng.choice([-1.5, 0.0, 0.5, 2.0, 3.25, -0.0])
        rows.append({"i": maybe(rng.randrange(-5, 6)), "f": f, "s": maybe(rng.choice(STRINGS)),
                     "b": maybe(rng.random() < 0.5), "p": rng.choice(["x", "y", "10", "9"])})
    return rows


def _literal(rng: random.Random, column: str) -> Any:
    return {"i": lambda: rng.choice([-3, 0, 1, 5, 2.5]), "f": lambda: rng.choice([-1.5, 0, 0.5, 2, 3.25, 1e9]),
            "s": lambda: rng.choice(STRINGS), "p": lambda: rng.choice(["x", "y", "10", "9", "a"]),
            "b": lambda: rng.choice([True, False])}[column]()


def _leaf(rng: random.Random) -> tuple[str, tuple]:
    column, k = rng.choice(COLUMNS), rng.random()
    if k < 0.1:
        return f"{column} is None", ("null", column)
    if k < 0.2:
        return f"{column} is not None", ("valid", column)
    if k < 0.3 and column != "b":
        values = [_literal(rng, column) for _ in range(rng.randrange(1, 4))]
        values = [int(v) for v in values] if column == "i" else values
        return f"{column} in {values!r}", ("in", column, values)
    if k < 0.35 and column == "f":
        return "is_nan(f)", ("nan",)
    if k < 0.45 and column == "i":
        add, op, value = rng.randrange(-3, 4), rng.choice(["<", ">", "=="]), rng.randrange(-5, 6)
        return f"i + {add} {op} {value}", ("add", add, op, value)
    op = rng.choice(["==", "!="] if column == "b" else list(COMPARE))
    value = _literal(rng, column)
    return f"{column} {op} {value!r}", ("cmp", column, op, value)


def _condition(rng: random.Random, depth: int) -> tuple[str, tuple]:
    if depth == 0 or rng.random() < 0.35:
        return _leaf(rng)
    if rng.random() < 0.2:
        text, tree = _condition(rng, depth - 1)
        return f"not ({text})", ("not", tree)
    (left, a), (right, b) = _condition(rng, depth - 1), _condition(rng, depth - 1)
    op = rng.choice(["and", "or"])
    return f"({left}) {op} ({right})", (op, a, b)


def _holds(tree: tuple, row: dict[str, Any]) -> bool | None:
    """Three-valued (Kleene) truth of ``tree`` for ``row``; ``in`` is pyarrow's ``is_in`` (a
    null is in no list, floats match by value and sign: -0.0 is not in [0])."""
    kind = tree[0]
    if kind == "null":
        return row[tree[1]] is None
    if kind == "valid":
        return row[tree[1]] is not None
    if kind == "in":
        v = row[tree[1]]
        if v is None:
            return False
        return any(repr(float(v)) == repr(float(x)) if isinstance(v, float) else v == x for x in tree[2])
    if kind == "nan":
        return None if row["f"] is None else math.isnan(row["f"])
    if kind == "add":
        return None if row["i"] is None else COMPARE[tree[2]](row["i"] + tree[1], tree[3])
    if kind == "cmp":
        v = row[tree[1]]
        return None if v is None else COMPARE[tree[2]](v, tree[3])
    if kind == "not":
        v = _holds(tree[1], row)
        return None if v is None else not v
    a, b = _holds(tree[1], row), _holds(tree[2], row)
    if kind == "and":
        return False if a is False or b is False else None if a is None or b is None else True
    return True if a is True or b is True else None if a is None or b is None else False


def _key(row: dict[str, Any]) -> str:
    return repr({c: "nan" if isinstance(row.get(c), float) and math.isnan(row[c]) else row.get(c) for c in COLUMNS})


def _write(rng: random.Random, rows: list[dict[str, Any]], folder: Path, hive: bool) -> None:
    files = rng.randrange(1, 4)
    for j in range(files):
        part = rows[j::files]
        if not hive:
            pq.write_table(pa.Table.from_pylist(part, SCHEMA), folder / f"f{j}.parquet", row_group_size=rng.randrange(1, 40))
            continue
        for value in sorted({r["p"] for r in part}):
            (folder / f"p={value}").mkdir(exist_ok=True)
            kept = [{c: r[c] for c in COLUMNS if c != "p"} for r in part if r["p"] == value]
            pq.write_table(pa.Table.from_pylist(kept, SCHEMA.remove(4)), folder / f"p={value}" / f"f{j}.parquet",
                           row_group_size=rng.randrange(1, 40))
    if not rows:
        pq.write_table(SCHEMA.empty_table(), folder / "f0.parquet")


@pytest.mark.parametrize("seed", SEEDS)
def test_filters_keep_the_rows_python_keeps(mode, tmp_path, seed):
    rng = random.Random(seed)
    rows = _rows(rng, rng.choice([0, 1, 7, 60, 300]))
    _write(rng, rows, tmp_path, hive=rng.random() < 0.4)
    text, tree = _condition(rng, rng.randrange(0, 4))
    want = sorted(_key(r) for r in rows if _holds(tree, r) is True)
    folder = str(tmp_path)
    cases = {
        "pushed": dataflow.read_parquet(folder).filter(expr=text),
        "pushed pyarrow expression": dataflow.read_parquet(folder, filter=parse(text).to_pyarrow()),
        "after a map": dataflow.read_parquet(folder).map_batches(lambda b: b, batch_format="pyarrow").filter(expr=text),
        "in memory": dataflow.from_arrow(pa.Table.from_pylist(rows, SCHEMA)).filter(expr=text),
    }
    for name, ds in cases.items():
        got = sorted(_key({**r, "p": str(r["p"])}) for r in ds.take_all())
        assert got == want, f"{name}: {text}"
    projected = dataflow.read_parquet(folder).filter(expr=text).select_columns(["i"])
    assert sorted(repr(r["i"]) for r in projected.take_all()) == sorted(
        repr(r["i"]) for r in rows if _holds(tree, r) is True), text
    assert dataflow.read_parquet(folder).filter(expr=text).count() == len(want), text
