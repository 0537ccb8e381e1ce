"""Input rows of the PostgreSQL tests: ``(id bigint, key text)`` batches per partition."""

from __future__ import annotations

import pyarrow as pa

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
