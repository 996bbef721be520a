"""Helpers shared by the connector tests (imported by name; not a test module)."""

from __future__ import annotations

import cloudpickle
import pyarrow as pa

from connectors.base import Datasource


def read_all(source: Datasource, parallelism: int = 4) -> pa.Table:
    """Every row of ``source``: each ReadTask pickled with cloudpickle, then run."""
    tables = []
    for task in source.get_read_tasks(parallelism):
        task = cloudpickle.loads(cloudpickle.dumps(task))
        tables.extend(task())
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")
