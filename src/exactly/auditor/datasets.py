"""Files read by PyArrow (on an object store, of a Delta table) as an audit relation, each
file's rows tagged with its epoch and version.

A fragment (one file) whose partition expression says ``__x_epoch == 7`` gets the column
``__x_epoch`` filled with 7 for every row, as PyArrow fills a Hive partition column. DuckDB
scans the dataset where it lies, only the columns a query reads, a batch at a time: local
files are a view read in place; files on an object store are copied into the audit's
database in one scan (the columns the audit needs), so that they cross the network once.
Nothing is held in memory whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from exactly.auditor.relation import INTERNAL, first_line, ident
from exactly.errors import AuditInputError

T = TypeVar("T")
R = TypeVar("R")
#: file footers (or first blocks) read at once from an object store
_PARALLEL = 16
#: what the S3 client's errors say (the reading goes on through DuckDB's own errors)
_STORE_ERRORS = ("AWS Error", "curlCode")


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


def attach_dataset(con: Any, name: str, datasets: Sequence[ds.Dataset], *,
                   copy: bool = False, columns: Sequence[str] | None = None,
                   what: str = "") -> None:
    """Make ``name`` the rows of ``datasets`` (their columns united by name): a view that
    reads the files at each scan, or with ``copy`` a table filled in one scan (files on an
    object store: the audit scans its output more than once), holding only ``columns`` and
    the internal ones when the files have all of ``columns``.

    A file that cannot be read while copying raises AuditInputError naming ``what``; an
    error of the object store itself is raised as an OSError with the store's message
    (for :func:`exactly.auditor.objects.store_errors` to classify)."""
    import duckdb

    scans = []
    present: set[str] = set()
    for n, dataset in enumerate(datasets):
        registered = f"__x_dataset_{name}_{n}"
        con.register(registered, dataset)
        scans.append(f"SELECT * FROM {ident(registered)}")
        present.update(dataset.schema.names)
    rows = " UNION ALL BY NAME ".join(scans)
    if not copy:
        con.execute(f"CREATE VIEW {ident(name)} AS {rows}")
        return
    selected = "*"
    if columns is not None and set(columns) <= present:
        kept = [*columns, *(c for c in sorted(present) if c.startswith(INTERNAL))]
        selected = ", ".join(ident(c) for c in dict.fromkeys(kept))
    try:
        con.execute(f"CREATE TABLE {ident(name)} AS SELECT {selected} FROM ({rows})")
    except duckdb.Error as exc:
        if any(sign in str(exc) for sign in _STORE_ERRORS):
            raise OSError(str(exc)) from None
        raise AuditInputError(f"{what}: cannot read its data files: {first_line(exc)}"
                              ) from None
