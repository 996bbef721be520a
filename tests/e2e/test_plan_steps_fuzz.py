"""Random chains of column and row steps over Parquet files and over the same rows in memory,
checked against the same steps applied to a pyarrow table: column selections, drops and renames
(swaps too), expression and function filters, ``with_column``, ``add_column``, ``map``,
``flat_map``, ``map_batches`` in three formats, shuffles, repartitions, unions, sorts, limits
and ``materialize``; with and without ``preserve_order``. Each chain checks the rows (in order
where the order is defined), ``count()``, the schema and each row's column order, and reads them
again through ``iter_batches`` (batch sizes, ``drop_last``, local shuffles, prefetching). The optimizer
rewrites these chains (projections and filters pushed into reads, fused steps, counts from
footers, small exchanges in the reading task): a rewrite that changes a result fails here."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.expressions import col

SEEDS = range(int(os.environ.get("DATAFLOW_FUZZ_SEEDS", "8")) * 5)
"""More for a soak: ``DATAFLOW_FUZZ_SEEDS=200 pytest tests/e2e/test_plan_steps_fuzz.py``."""


@dataclass
class Model:
    """What the steps so far make of the rows: the table, whether its row order is the
    dataset's (every step so far keeps a defined order), and whether only a subset is known
    (a limit over rows in no defined order)."""

    table: pa.Table
    ordered: bool
    subset_of: pa.Table | None = None
    steps: list[tuple[str, Callable[[dataflow.Dataset], dataflow.Dataset]]] = field(default_factory=list)


def _table(rng: random.Random, n: int) -> pa.Table:
    return pa.table({
        "a": pa.array([rng.randrange(-5, 6) if rng.random() > 0.1 else None for _ in range(n)], pa.int64()),
        "b": pa.array([rng.randrange(0, 100) for _ in range(n)], pa.int64()),
        "c": pa.array([rng.choice(["x", "y", "z"]) for _ in range(n)]),
        "d": pa.array([rng.random() for _ in range(n)], pa.float64()),
    })


def _ints(t: pa.Table) -> list[str]:
    return [f.name for f in t.schema if pa.types.is_integer(f.type)]


def _set(t: pa.Table, name: str, values: pa.Array) -> pa.Table:
    if name in t.column_names:
        return t.set_column(t.column_names.index(name), name, values)
    return t.append_column(name, values)


def _step(rng: random.Random, m: Model) -> bool:
    """Add one random step to ``m``; False when the chain should stop here."""
    t, names, k = m.table, m.table.column_names, rng.random()
    add = m.steps.append
    if k < 0.1 and len(names) > 1:
        sub = rng.sample(names, rng.randrange(1, len(names) + 1))
        add((f"select_columns({sub})", lambda ds: ds.select_columns(sub)))
        m.table = t.select(sub)
    elif k < 0.17 and len(names) > 1:
        sub = rng.sample(names, rng.randrange(1, len(names)))
        add((f"drop_columns({sub})", lambda ds: ds.drop_columns(sub)))
        m.table = t.drop_columns(sub)
    elif k < 0.27:
        picked = rng.sample(names, rng.randrange(1, len(names) + 1))
        targets = picked[:]
        rng.shuffle(targets)
        if rng.random() < 0.5:
            targets = [name + "_r" for name in targets]
        mapping = dict(zip(picked, targets, strict=True))
        renamed = [mapping.get(name, name) for name in names]
        if len(set(renamed)) != len(renamed):
            return True
        add((f"rename_columns({mapping})", lambda ds: ds.rename_columns(mapping)))
        m.table = t.rename_columns(renamed)
    elif k < 0.37 and _ints(t):
        name, op, value = rng.choice(_ints(t)), rng.choice([">", "<", "==", "!="]), rng.randrange(-3, 50)
        if not name.isidentifier():
            return True
        text = f"{name} {op} {value}"
        add((f"filter(expr={text!r})", lambda ds: ds.filter(expr=text)))
        compare = {">": pc.greater, "<": pc.less, "==": pc.equal, "!=": pc.not_equal}[op]
        m.table = t.filter(compare(t[name], value))
    elif k < 0.44 and _ints(t):
        name, new, plus = rng.choice(_ints(t)), rng.choice(["n1", "n2", *_ints(t)]), rng.randrange(1, 5)
        add((f"with_column({new!r}, col({name!r}) + {plus})", lambda ds: ds.with_column(new, col(name) + plus)))
        m.table = _set(t, new, pc.add(t[name], plus))
    elif k < 0.5 and _ints(t):
        name, value = rng.choice(_ints(t)), rng.randrange(0, 50)
        add((f"filter(lambda r: r[{name!r}] > {value})",
             lambda ds: ds.filter(lambda r: r[name] is not None and r[name] > value)))
        m.table = t.filter(pc.greater(t[name], value))
    elif k < 0.56:
        add(("map(m=1)", lambda ds: ds.map(lambda r: {**r, "m": 1})))
        m.table = _set(t, "m", pa.array([1] * t.num_rows, pa.int64()))
    elif k < 0.62:
        sub = rng.sample(names, rng.randrange(1, len(names) + 1))
        add((f"map_batches(select {sub})", lambda ds: ds.map_batches(lambda b: b.select(sub), batch_format="pyarrow")))
        m.table = t.select(sub)
    elif k < 0.66:
        fmt = rng.choice(["pandas", "numpy"])
        # (ints with nulls come back as floats from pandas, and as objects from numpy)
        if any(t[name].null_count for name in names):
            return True
        add((f"map_batches(identity, {fmt})", lambda ds: ds.map_batches(lambda b: b, batch_format=fmt)))
    elif k < 0.7:
        name = rng.choice(names)
        add((f"add_column('z', ones({name!r}))", lambda ds: ds.add_column(
            "z", lambda b: pa.array([1] * len(b[name]), pa.int64()), batch_format="pyarrow")))
        m.table = _set(t, "z", pa.array([1] * t.num_rows, pa.int64()))
    elif k < 0.74:
        add(("flat_map(twice)", lambda ds: ds.flat_map(lambda r: [r, r])))
        twice = pa.array([i // 2 for i in range(2 * t.num_rows)], pa.int64())
        m.table = t.take(twice)
    elif k < 0.77:
        if rng.random() < 0.5 or not _ints(t):
            add(("union(itself)", lambda ds: ds.union(ds)))
            m.table = pa.concat_tables([t, t])
        else:  # with a filtered copy of itself: the filter is pushed into one side's read only
            name, value = rng.choice(_ints(t)), rng.randrange(0, 50)
            if not name.isidentifier():
                return True
            add((f"union(itself.filter({name} > {value}))", lambda ds: ds.union(ds.filter(expr=f"{name} > {value}"))))
            m.table = pa.concat_tables([t, t.filter(pc.greater(t[name], value))])
    elif k < 0.79 and any(pa.types.is_string(f.type) for f in t.schema):
        name = rng.choice([f.name for f in t.schema if pa.types.is_string(f.type)])
        value = rng.choice(["x", "y", "q"])
        if not name.isidentifier():
            return True
        add((f"filter(expr=\"{name} == '{value}'\")", lambda ds: ds.filter(expr=f"{name} == '{value}'")))
        m.table = t.filter(pc.equal(t[name], value))
    elif k < 0.81:
        name = rng.choice(names)
        if t.schema.field(name).type == pa.null() or pa.types.is_floating(t.schema.field(name).type) or name == "count()":
            return True
        add((f"groupby({name!r}).count()", lambda ds: ds.groupby(name).count()))
        counts = t.group_by(name).aggregate([([], "count_all")]).rename_columns([name, "count()"])
        m.table = counts.select([name, "count()"])
        m.ordered = False  # (groups come out in key order per reduce task, not overall)
    elif k < 0.8:
        seed = rng.randrange(100)
        add((f"random_shuffle(seed={seed})", lambda ds: ds.random_shuffle(seed=seed)))
        m.ordered = False
    elif k < 0.83:
        blocks = rng.randrange(1, 7)
        add((f"repartition({blocks})", lambda ds: ds.repartition(blocks)))
    elif k < 0.85:
        add(("randomize_block_order(seed=2)", lambda ds: ds.randomize_block_order(seed=2)))
        m.ordered = False
    elif k < 0.88:
        add(("materialize()", lambda ds: ds.materialize()))
    elif k < 0.94:
        name = rng.choice(names)
        if t.schema.field(name).type == pa.null():
            return True
        descending = rng.random() < 0.3
        add((f"sort({name!r}, descending={descending})", lambda ds: ds.sort(name, descending=descending)))
        # stable: ties keep their order, nulls last either way
        order = "descending" if descending else "ascending"
        m.table = t.take(pc.sort_indices(t, sort_keys=[(name, order, "at_end")]))
        m.ordered = m.ordered or t.num_rows < 2
    else:
        n = rng.randrange(0, 40)
        add((f"limit({n})", lambda ds: ds.limit(n)))
        if not m.ordered:
            m.subset_of = t
            m.table = t.slice(0, n)
            return False
        m.table = t.slice(0, n)
    return True


def _rows(rows: list[dict]) -> list[str]:
    return [repr(sorted(r.items())) for r in rows]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_step_chains_match_pyarrow(mode, tmp_path, seed):
    rng = random.Random(seed)
    source = _table(rng, rng.choice([0, 5, 50, 400]))
    files = rng.randrange(1, 4)
    bounds = [source.num_rows * j // files for j in range(files + 1)]
    for j in range(files):
        pq.write_table(source.slice(bounds[j], bounds[j + 1] - bounds[j]), tmp_path / f"f{j}.parquet",
                       row_group_size=rng.randrange(1, 50))
    preserve_order = rng.random() < 0.5
    model = Model(source, ordered=preserve_order)
    for _ in range(rng.randrange(1, 7)):
        if not _step(rng, model):
            break
    chain = " -> ".join(label for label, _ in model.steps)
    with dataflow.options(preserve_order=preserve_order):
        for start in (lambda: dataflow.read_parquet(str(tmp_path)), lambda: dataflow.from_arrow(source)):
            ds = start()
            for _, step in model.steps:
                ds = step(ds)
            got = ds.take_all()
            assert ds.count() == len(got), chain
            schema = ds.schema()
            if schema is not None:
                assert schema.names == model.table.column_names, chain
            assert all(list(row) == model.table.column_names for row in got), chain
            if model.subset_of is not None:
                assert len(got) == model.table.num_rows, chain
                assert set(_rows(got)) <= set(_rows(model.subset_of.to_pylist())), chain
            elif model.ordered:
                assert _rows(got) == _rows(model.table.to_pylist()), chain
            else:
                assert sorted(_rows(got)) == sorted(_rows(model.table.to_pylist())), chain
        if model.subset_of is None:  # and read as a training loop reads it
            size, drop_last = rng.choice([None, 1, 7, 64]), rng.random() < 0.3
            shuffle, prefetch = rng.choice([None, None, 5, 100]), rng.choice([0, 1, 3])
            ds = dataflow.read_parquet(str(tmp_path))
            for _, step in model.steps:
                ds = step(ds)
            batches = [b.to_pylist() for b in ds.iter_batches(
                batch_size=size, drop_last=drop_last and size is not None, local_shuffle_buffer_size=shuffle,
                prefetch_batches=prefetch, batch_format="pyarrow")]
            got, want = [row for batch in batches for row in batch], model.table.to_pylist()
            how = f"{chain} | iter_batches({size}, drop_last={drop_last}, shuffle={shuffle}, prefetch={prefetch})"
            if size is not None and drop_last:
                assert all(len(b) == size for b in batches) and len(got) == len(want) // size * size, how
                assert set(_rows(got)) <= set(_rows(want)), how
            else:
                assert size is None or all(len(b) == size for b in batches[:-1]), how
                if model.ordered and shuffle is None:
                    assert _rows(got) == _rows(want), how
                else:
                    assert sorted(_rows(got)) == sorted(_rows(want)), how
