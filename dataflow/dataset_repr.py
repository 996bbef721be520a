"""``repr(dataset)``, as Ray Data 2.60 prints it, without running anything that is not already run.

When the plan tells the schema (a source's, through steps that keep or select columns), the
dataset prints as a table of its columns and types under ``shape: (rows, columns)``; a
materialized dataset adds its first and last five rows (all of them up to ten)::

    shape: (10, 1)
    ╭───────╮
    │ id    │
    │ ---   │
    │ int64 │
    ╰───────╯
    (Dataset isn't materialized)

Otherwise (a function's output has unknown columns until it runs) it prints the steps, newest
first, above the source: ``Map(f)`` / ``+- Dataset(num_rows=10, schema={id: int64})``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataflow.optimizer import count_from_metadata, optimize
from dataflow.plan import InputBlocks, LogicalNode, Read
from dataflow.schema import type_name
from engine.block_format import concat_blocks, iter_rows

if TYPE_CHECKING:
    from dataflow.dataset import Dataset

ELLIPSIS = "…"
MAX_ROWS = 10
"""A materialized dataset of more rows shows its first and last ``MAX_ROWS // 2``."""
MAX_CELL = 40
"""Characters of a cell (value, column name or type) before it is cut with an ellipsis."""
LINE_LIMIT = 80
"""The summary form breaks its ``Dataset(...)`` line into one field per line past this width."""
INDENT = "   "


def dataset_repr(ds: Dataset) -> str:
    schema = ds._arrow_schema(fetch_if_missing=False)
    if schema is None or not schema.names:
        return summary_repr(ds)
    materialized = hasattr(ds, "_blocks")
    num_rows = count_from_metadata(optimize(ds._plan))
    if num_rows is None:  # a whole run of it has counted them
        num_rows = getattr(ds, "_cached_num_rows", None)
    head: list[dict[str, Any]] = []
    tail: list[dict[str, Any]] = []
    if materialized and num_rows:
        head, tail = _preview_rows(ds, num_rows)
    return table_repr(schema, num_rows, ds.name, materialized, head, tail)


def table_repr(
    schema: pa.Schema,
    num_rows: int | None,
    name: str | None,
    materialized: bool,
    head: list[dict[str, Any]],
    tail: list[dict[str, Any]],
) -> str:
    """The table form: names, a ``---`` row and types, then the preview rows (a row of
    ellipses between head and tail), and a line saying how many rows are shown."""
    columns = list(schema.names)
    headers = [_cut(column) for column in columns]
    types = [_cut(type_name(t)) for t in schema.types]
    rows = [[_cut(_format_value(row.get(c))) for c in columns] for row in head]
    if head and tail:
        rows.append([ELLIPSIS] * len(columns))
    rows += [[_cut(_format_value(row.get(c))) for c in columns] for row in tail]
    widths = [max(len(cell) for cell in cells) for cells in zip(headers, types, ["---"] * len(columns), *rows, strict=True)]

    def border(left: str, middle: str, right: str, fill: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def line(cells: list[str]) -> str:
        return "│" + "┆".join(f" {cell.ljust(w)} " for cell, w in zip(cells, widths, strict=True)) + "│"

    lines = [border("╭", "┬", "╮", "─"), line(headers), line(["---"] * len(columns)), line(types)]
    if rows:
        lines.append(border("╞", "╪", "╡", "═"))
        lines += [line(row) for row in rows]
    lines.append(border("╰", "┴", "╯", "─"))
    shown = len(head) + len(tail)
    rows_text = "?" if num_rows is None else num_rows
    footer = f"(Showing {shown} of {rows_text} rows)" if materialized else "(Dataset isn't materialized)"
    parts = [f"name: {name}"] if name is not None else []
    parts += [f"shape: ({rows_text}, {len(columns)})", "\n".join(lines), footer]
    return "\n".join(parts)


def summary_repr(ds: Dataset) -> str:
    """The steps form: each step's name, inputs indented under it (sources left out), then
    ``Dataset(num_rows=..., schema={...})`` of the source, or of the dataset when it is
    materialized."""
    materialized = hasattr(ds, "_blocks")
    steps: list[str] = []
    depth = 0 if materialized else _steps(ds._plan, steps, 0)
    source = _single_source(ds._plan)
    schema = ds._arrow_schema(fetch_if_missing=False) if materialized else None
    num_rows = count_from_metadata(ds._plan) if materialized else None
    if not materialized and source is not None:
        schema = ds._derive(source)._arrow_schema(fetch_if_missing=False)
        num_rows = count_from_metadata(optimize(source))
    rows_text = "?" if num_rows is None else str(num_rows)
    fields = ([f"{n}: {type_name(t)}" for n, t in zip(schema.names, schema.types, strict=True)]
              if schema is not None else None)
    schema_text = "Unknown schema" if fields is None else "{" + ", ".join(fields) + "}"
    cls = type(ds).__name__
    name = f"name={ds.name}, " if ds.name is not None else ""
    num_blocks = len(ds._blocks.refs) if materialized else 0
    blocks = f"num_blocks={num_blocks}, " if num_blocks else ""
    text = f"{cls}({name}{blocks}num_rows={rows_text}, schema={schema_text})"
    pad = INDENT * depth
    if len(text) > LINE_LIMIT:
        if fields is not None and len(f"{pad}{INDENT}schema={schema_text}") > LINE_LIMIT:
            lines = [_cut_field(f"{pad}{INDENT * 2}{f}", f) for f in fields]
            schema_text = "{\n" + ",\n".join(lines) + f"\n{pad}{INDENT}}}"
        parts = [f"{cls}("]
        if ds.name is not None:
            parts.append(f"{pad}{INDENT}name={ds.name},")
        if num_blocks:
            parts.append(f"{pad}{INDENT}num_blocks={num_blocks},")
        parts += [f"{pad}{INDENT}num_rows={rows_text},", f"{pad}{INDENT}schema={schema_text}", f"{pad})"]
        text = "\n".join(parts)
    if depth:
        text = f"{INDENT * (depth - 1)}+- {text}"
    return "".join(f"{step}\n" for step in steps) + text


def _steps(node: LogicalNode, out: list[str], depth: int) -> int:
    """Append ``node``'s line and its inputs' below it (depth first); return the deepest depth."""
    if isinstance(node, Read | InputBlocks):
        return depth
    out.append(node.name if depth == 0 else f"{INDENT * (depth - 1)}+- {node.name}")
    deepest = depth + 1
    for child in node.inputs:
        deepest = max(deepest, _steps(child, out, depth + 1))
    return deepest


def _single_source(node: LogicalNode) -> LogicalNode | None:
    """The source a plan without joins, unions or zips reads; None if it reads several."""
    while node.inputs:
        if len(node.inputs) > 1:
            return None
        node = node.inputs[0]
    return node


def _preview_rows(ds: Any, num_rows: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and last rows a materialized dataset shows, read from only the blocks that
    hold them."""
    if num_rows <= MAX_ROWS:
        return _rows(ds, ds._blocks.refs, num_rows, head=True), []
    half = MAX_ROWS // 2
    return _rows(ds, ds._blocks.refs, half, head=True), _rows(ds, ds._blocks.refs[::-1], half, head=False)


def _rows(ds: Any, refs: list[Any], count: int, head: bool) -> list[dict[str, Any]]:
    wanted, covered = [], 0
    for ref in refs:
        if covered >= count:
            break
        if ref.num_rows:
            wanted.append(ref)
            covered += ref.num_rows
    if not head:
        wanted.reverse()
    tables = list(ds._derive(InputBlocks(tuple(wanted), ds._blocks)).iterator().iter_blocks())
    if not tables:
        return []
    table = concat_blocks(tables)
    table = table.slice(0, count) if head else table.slice(max(0, table.num_rows - count))
    return list(iter_rows(table))


def _format_value(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    return str(value).replace("\n", " ").replace("\r", " ")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + ELLIPSIS


def _cut_field(line: str, field: str) -> str:
    """A schema field line past the width keeps at least ten characters of its name and all
    of its type."""
    if len(line) <= LINE_LIMIT:
        return line
    suffix = f"...: {field.split(': ', 1)[1]}"
    return line[: max(LINE_LIMIT - len(suffix), 10)] + suffix
