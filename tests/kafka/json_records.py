"""The JSON records the sink tests stage and read back: ``{"id": i}`` values, keys ``i % 3``."""

from __future__ import annotations

import json

import pyarrow as pa

from exactly.testing.kafka_broker import consume_all


def rows(start: int, count: int) -> pa.RecordBatch:
    """Records ``start .. start+count-1`` in the sink's input layout (``key``, ``value``)."""
    ids = list(range(start, start + count))
    return pa.record_batch({"key": [str(i % 3) for i in ids],
                            "value": [json.dumps({"id": i}) for i in ids]})


def ids(broker, topic: str, isolation: str = "read_committed") -> list[int]:
    """The sorted ids in ``topic`` as a consumer of ``isolation`` reads them."""
    return sorted(json.loads(v)["id"] for _, _, _, v in
                  consume_all(broker.bootstrap, topic, isolation_level=isolation))
