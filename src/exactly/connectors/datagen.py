"""Deterministic generator source: replayable because row ``i`` is a pure function of ``i``.

Options (``spark.readStream.format("exactly.datagen")``):

``rowsPerSecond``  rows that become available per second (default 1000; 0 = no rate limit)
``totalRows``      stop after this many rows (default: unbounded)
``numPartitions``  read tasks per epoch (default 2)
``maxRowsPerTrigger``  cap on rows per epoch (epoch sizing; default none)
``keys``           distinct values of ``key`` (default 100)
``seed``           changes ``amount`` (default 0)

Columns: ``id`` (long, 0, 1, 2, ... unique), ``key`` (string), ``amount`` (double),
``event_time`` (timestamp, 1 ms apart from 2026-01-01). The offset of an epoch is the
number of rows generated before it, stored in Spark's offset log, so a replay reads the
same rows. Supports ``Trigger.AvailableNow`` (reads up to ``totalRows``, ignoring the rate).
Admission control (:mod:`exactly.connectors.admission`): no epoch while paused or closed,
and at most ``max_rows`` rows per epoch on top of ``maxRowsPerTrigger``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from exactly import options as opt
from exactly.connectors.admission import cap, current_admission
from exactly.errors import ConfigError

SCHEMA = "id long, key string, amount double, event_time timestamp"
_EPOCH_START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
_BATCH = 65_536


def _optional_int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"exactly.datagen: {name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"exactly.datagen: {name} must be >= {minimum}, got {value}")
    return value


def _int_option(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    value = _optional_int(options, name, minimum)
    return default if value is None else value


@dataclass(frozen=True)
class RowRange(InputPartition):
    start: int
    end: int


def generate(start: int, end: int, keys: int, seed: int) -> pa.Table:
    """Rows ``[start, end)``: the same rows every time for the same arguments."""
    ids = np.arange(start, end, dtype=np.int64)
    mixed = (ids * 2654435761 + seed * 40503) % 1_000_003
    key_idx = ids % keys
    key_names = np.array([f"k{i:04d}" for i in range(keys)], dtype=object)
    return pa.table({
        "id": ids,
        "key": pa.array(key_names[key_idx], type=pa.string()),
        "amount": (mixed.astype(np.float64) / 100.0),
        "event_time": pa.array(_EPOCH_START_US + ids * 1000, type=pa.timestamp("us", tz="UTC")),
    })


class DatagenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader of the deterministic generator."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opt.check_option_names("exactly.datagen", options, "source")
        self.rate = _int_option(options, opt.ROWS_PER_SECOND, 1000, 0)
        self.total = _optional_int(options, opt.TOTAL_ROWS, 0)
        self.partitions_n = _int_option(options, opt.NUM_PARTITIONS, 2, 1)
        self.max_rows = _optional_int(options, opt.MAX_ROWS_PER_TRIGGER, 1)
        self.keys = _int_option(options, opt.KEYS, 100, 1)
        self.seed = _int_option(options, opt.SEED, 0, 0)
        if self.rate == 0 and self.total is None:
            raise ConfigError("exactly.datagen: rowsPerSecond=0 (no rate limit) needs totalRows")
        self._started = time.monotonic()
        self._base: int | None = None
        self._target: int | None = None

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def _available(self, start_rows: int) -> int:
        if self._base is None:  # first call of this run: the rate counts from here
            self._base = start_rows
        if self._target is not None:  # availableNow: everything up to totalRows, no rate
            return max(self._target, start_rows)
        if self.rate or self.total is None:
            available = self._base + int((time.monotonic() - self._started) * self.rate)
        else:
            available = self.total
        if self.total is not None:
            available = min(available, self.total)
        return max(available, start_rows)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["rows"])
        end = self._available(begin)
        budget = current_admission().row_budget(bounded_run=self._target is not None)
        if budget == 0:  # paused or closed: no epoch now
            return start
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"rows": cap(begin, end, budget)}

    def prepareForTriggerAvailableNow(self) -> None:
        if self.total is None:
            raise ConfigError("exactly.datagen: Trigger.AvailableNow needs totalRows (an "
                              "unbounded generator is never drained)")
        self._target = self.total

    def partitions(self, start: dict, end: dict) -> list[RowRange]:
        begin, stop = int(start["rows"]), int(end["rows"])
        if stop <= begin:
            return []
        n = min(self.partitions_n, stop - begin)
        bounds = np.linspace(begin, stop, n + 1, dtype=np.int64)
        return [RowRange(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def read(self, partition: RowRange):  # type: ignore[override]
        for lo in range(partition.start, partition.end, _BATCH):
            hi = min(lo + _BATCH, partition.end)
            yield from generate(lo, hi, self.keys, self.seed).to_batches()

    def commit(self, end: dict) -> None:
        pass
