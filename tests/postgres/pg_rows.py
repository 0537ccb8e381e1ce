"""Rows of the PostgreSQL tests: ``(id bigint, key text)`` input batches per partition, and the
ids a reader sees in a table or view."""

from __future__ import annotations

import pyarrow as pa

from exactly.audit import pg_table_ids

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def parts(epoch: int, count: int = 2, rows: int = 5) -> list[pa.RecordBatch]:
    """The input of ``epoch``: ``count`` partitions of ``rows`` ids from ``epoch * 1000``
    (keys ``k0``..``k2``)."""
    batches = []
    for p in range(count):
        start = epoch * 1000 + p * rows
        ids = list(range(start, start + rows))
        batches.append(pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]},
                                       schema=SCHEMA))
    return batches


def sorted_ids(conn, relation: str) -> list[int]:
    """The ids a reader of ``relation`` (a table or view) sees now, sorted."""
    return sorted(pg_table_ids(conn, relation).tolist())
