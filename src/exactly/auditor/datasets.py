"""Files read in place by PyArrow (an object store, a Delta table) as an audit relation,
each file's rows tagged with its epoch and version.

A fragment (one file) whose partition expression says ``__x_epoch == 7`` gets the column
``__x_epoch`` filled with 7 for every row, as PyArrow fills a Hive partition column; DuckDB
scans the dataset where it lies, only the columns a query reads, a batch at a time: nothing
is copied into the audit's database or held in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from exactly.auditor.relation import ident

T = TypeVar("T")
R = TypeVar("R")
#: file footers (or first blocks) read at once from an object store
_PARALLEL = 16


def tag(**values: int | None) -> pc.Expression:
    """The partition expression giving each named column one value (None: null)."""
    parts = [pc.field(name).is_null() if value is None
             else pc.field(name) == pa.scalar(value, pa.int64())
             for name, value in values.items()]
    expression = parts[0]
    for part in parts[1:]:
        expression = expression & part
    return expression


def with_columns(schema: pa.Schema, *names: str) -> pa.Schema:
    """``schema`` and the int64 columns ``names`` that :func:`tag` fills."""
    for name in names:
        schema = schema.append(pa.field(name, pa.int64()))
    return schema


def parallel(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``function`` over ``items``, several at a time (requests to an object store)."""
    if len(items) < 2:
        return [function(item) for item in items]
    with ThreadPoolExecutor(min(_PARALLEL, len(items))) as pool:
        return list(pool.map(function, items))


def attach_dataset(con: Any, name: str, datasets: Sequence[ds.Dataset]) -> None:
    """Create the view ``name`` over ``datasets`` (their columns united by name)."""
    scans = []
    for n, dataset in enumerate(datasets):
        registered = f"__x_dataset_{name}_{n}"
        con.register(registered, dataset)
        scans.append(f"SELECT * FROM {ident(registered)}")
    con.execute(f"CREATE VIEW {ident(name)} AS {' UNION ALL BY NAME '.join(scans)}")
