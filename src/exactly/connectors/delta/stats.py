"""Delta Lake file statistics (the ``stats`` of an add action) from a Parquet file's footer.

Delta readers use ``numRecords`` for counts and ``minValues``/``maxValues``/``nullCount`` to
skip files. Only values whose Delta rendering is exact are given: ``numRecords``, the null
count of every top-level column, and min/max of integer and date columns. Strings (Delta
truncates them), floats (NaN), decimals and timestamps (millisecond rendering) get no
min/max: a reader then reads the file instead of skipping it, never the reverse.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def _exact_bounds(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_date32(type_)


def _render(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.date) else value


def file_stats(metadata: pq.FileMetaData, schema: pa.Schema) -> str:
    """The add action's ``stats`` JSON for a file with footer ``metadata`` and ``schema``."""
    nulls: dict[str, int] = {}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    top_level = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for name in schema.names:
        column = top_level.get(name)
        if column is None:  # a nested column: its leaves are not one statistic of it
            continue
        exact = _exact_bounds(schema.field(name).type)
        count, low, high, known = 0, None, None, True
        for rg in range(metadata.num_row_groups):
            stats = metadata.row_group(rg).column(column).statistics
            if stats is None or not stats.has_null_count:
                known = False
                break
            count += stats.null_count
            if exact and stats.has_min_max:
                low = stats.min if low is None else min(low, stats.min)
                high = stats.max if high is None else max(high, stats.max)
        if not known:
            continue
        nulls[name] = count
        if exact and low is not None:
            lows[name], highs[name] = _render(low), _render(high)
    return json.dumps({"numRecords": metadata.num_rows, "minValues": lows,
                       "maxValues": highs, "nullCount": nulls}, separators=(",", ":"))
