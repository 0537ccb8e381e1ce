"""A source of rows attached to the audit's DuckDB database under a name.

Every reader (files, Delta, PostgreSQL, Kafka, SQLite) makes one relation and says what it
knows about the rows' history: the column holding each row's epoch (the file sink's
``epoch-N`` directories, a table's ``exactly_epoch``, a Delta commit's application
transaction), and the columns that order a key's rows in time (epoch, Delta table version,
or Kafka partition and offset). Internal columns start with ``__x_`` and are never compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

#: the epoch a row was committed in, when the target records it
EPOCH = "__x_epoch"
#: the Delta table version (commit) that added a row's file
VERSION = "__x_version"
#: position of a record in its Kafka partition
PARTITION, OFFSET = "__x_partition", "__x_offset"
INTERNAL = "__x_"


def ident(name: str) -> str:
    """``name`` as a quoted DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass
class Relation:
    """Rows attached as ``name``: ``empty`` when the source had no rows and no schema (then
    the audit gives it the expected rows' columns); ``order`` sorts a key's rows in time."""

    name: str
    description: str
    epoch: bool = False
    order: list[str] = field(default_factory=list)
    empty: bool = False


def load_batches(con, name: str, batches: Iterator[pa.Table],
                 schema: pa.Schema | None = None) -> bool:
    """Stream Arrow tables into the DuckDB table ``name`` (one pass, bounded memory), with
    ``schema``, or the first table's; later tables are conformed to it. False when there
    were no batches and no ``schema`` (the table is not created)."""
    first = next(batches, None)
    if first is None:
        if schema is not None:
            first = schema.empty_table()
        else:
            return False
    schema = schema or first.schema

    failed: list[BaseException] = []

    def all_batches() -> Iterator[pa.RecordBatch]:
        try:
            yield from conform(first, schema).to_batches()
            for table in batches:
                yield from conform(table, schema).to_batches()
        except Exception as exc:  # DuckDB reports it wrapped in its own error
            failed.append(exc)
            raise

    reader = pa.RecordBatchReader.from_batches(schema, all_batches())
    view = f"__x_stream_{name}"
    con.register(view, reader)
    try:
        con.execute(f"CREATE TABLE {ident(name)} AS SELECT * FROM {ident(view)}")
    except Exception:
        if failed:  # the reader's own error (a record that is not JSON, a timeout), unwrapped
            raise failed[0] from None
        raise
    finally:
        con.unregister(view)
    return True


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns: absent ones null, others cast (a null
    column takes any type); new columns are dropped."""
    columns = []
    for f in schema:
        if f.name in table.column_names:
            column = table.column(f.name)
            columns.append(column if column.type == f.type else column.cast(f.type))
        else:
            columns.append(pa.nulls(len(table), f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (database errors carry pages of context)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
