"""The Parquet data files a write task of ``exactly.iceberg`` writes, and their Iceberg facts.

A task writes its rows straight into the table's data directory (the table's location
provider chooses the path, partition directories included), one file per partition value
the task sees, named ``part-<epoch>-<attempt>-<query>-<n>.parquet`` so that the epoch and the
query of every data file the sink ever wrote can be read from its name. Columns carry the
table's field ids (an Iceberg reader resolves columns by id), row groups are buffered to
:data:`ROW_GROUP_ROWS` rows, the codec and page settings are the table's ``write.parquet.*``
properties. When the file is closed its footer gives the statistics Iceberg keeps per data
file (counts, sizes, bounds), computed as pyiceberg computes them for its own writes.

:class:`FileFacts` is what the driver needs to add the file to a snapshot; it is a JSON
value (bounds and partition values in Iceberg's single-value binary form, hex-encoded),
because it travels in the commit log's intents. :class:`TableLayout` is what a task needs to
know about the table; it is taken from the table when the query starts and travels with the
sink to the executors.

pyiceberg exposes no public streaming writer with statistics, so this module uses three of
its internal functions (pinned by the ``pyiceberg<0.13`` requirement): the projection of a
batch onto the table's schema with field ids, the split of rows by partition, and the
Parquet writer arguments of the table properties.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exactly.errors import ConfigError

#: rows of a Parquet row group (pyiceberg's ``write.parquet.row-group-limit`` default)
ROW_GROUP_ROWS = 1024 * 1024
#: a row group is written once its buffered batches hold this many bytes, however few rows
ROW_GROUP_BYTES = 128 * 1024 * 1024
_NAME = re.compile(r"^part-(\d{12})-(.+)-([0-9a-f-]{36})-(\d{5})\.parquet$")
#: the middle of a compacted file's name: ``<last epoch>-c<8 hex>`` (compaction.py)
_COMPACTED = re.compile(r"^(\d{12})-c[0-9a-f]{8}$")
#: the values of a table's ``write.parquet.compression-codec`` that pyiceberg's Parquet
#: writer (PyArrow) writes -- Iceberg's names, which its other engines read too
PARQUET_CODECS = ("uncompressed", "snappy", "gzip", "brotli", "lz4", "zstd")


def parquet_codec(name: str) -> str:
    """``name`` (any case) as a table's ``write.parquet.compression-codec``. ConfigError
    naming :data:`PARQUET_CODECS` for any other name, and for a codec this PyArrow was built
    without (its files could not be written)."""
    codec = name.strip().lower()
    if codec not in PARQUET_CODECS:
        raise ConfigError(
            f"exactly.iceberg sink: compression={name!r} is not a Parquet codec pyiceberg "
            f"writes; use one of {', '.join(PARQUET_CODECS)} (the new table's "
            "write.parquet.compression-codec), or drop the option for zstd")
    if codec != "uncompressed" and not pa.Codec.is_available(codec):
        raise ConfigError(
            f"exactly.iceberg sink: compression={name!r}: this PyArrow was built without "
            f"{codec}; use another of {', '.join(PARQUET_CODECS)}")
    return codec


def data_file_name(epoch: int, attempt_key: str, query_id: str, number: int) -> str:
    return f"part-{epoch:012d}-{attempt_key}-{query_id}-{number:05d}.parquet"


def file_epoch(path: str, queries: Sequence[str] | None = None) -> int | None:
    """The (first) epoch of a data file this sink wrote (for one of ``queries``, when
    given), from its name; None for any other file."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    if match is None or (queries is not None and match.group(3) not in queries):
        return None
    return int(match.group(1))


def file_epochs(path: str) -> tuple[int, int]:
    """``(first, last)`` epoch of a data file this sink wrote (a compacted file spans
    several); ValueError for any other file."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"{path} is not a data file of exactly.iceberg")
    compacted = _COMPACTED.match(match.group(2))
    first = int(match.group(1))
    return first, int(compacted.group(1)) if compacted else first


def file_query(path: str) -> str | None:
    """The query id in the name of a data file this sink wrote; None for any other file."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    return match.group(3) if match else None


@dataclass(frozen=True)
class TableLayout:
    """What a task needs to write data files of one table (JSON-able strings; no catalog)."""

    location: str
    schema_json: str
    spec_json: str
    properties: dict[str, str]
    format_version: int
    io_properties: dict[str, str]

    @classmethod
    def of(cls, table: Any, io_properties: dict[str, str]) -> TableLayout:
        meta = table.metadata
        return cls(meta.location.rstrip("/"), meta.schema().model_dump_json(),
                   meta.spec().model_dump_json(), dict(meta.properties), meta.format_version,
                   dict(io_properties))

    def schema(self) -> Any:
        from pyiceberg.schema import Schema

        return Schema.model_validate_json(self.schema_json)

    def spec(self) -> Any:
        from pyiceberg.partitioning import PartitionSpec

        return PartitionSpec.model_validate_json(self.spec_json)

    def io(self) -> Any:
        from pyiceberg.io.pyarrow import PyArrowFileIO

        return PyArrowFileIO(self.io_properties)


@dataclass(frozen=True)
class FileFacts:
    """One data file as a snapshot adds it: path (full URI), size, the partition's values,
    and the Parquet statistics (pyiceberg's ``DataFileStatistics``, serialised)."""

    path: str
    size: int
    records: int
    spec_id: int
    partition: list[str | None] = field(default_factory=list)
    column_sizes: dict[str, int] = field(default_factory=dict)
    value_counts: dict[str, int] = field(default_factory=dict)
    null_value_counts: dict[str, int] = field(default_factory=dict)
    nan_value_counts: dict[str, int] = field(default_factory=dict)
    lower_bounds: dict[str, str] = field(default_factory=dict)
    upper_bounds: dict[str, str] = field(default_factory=dict)
    split_offsets: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileFacts:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def data_file(self, schema: Any, spec: Any) -> Any:
        """The pyiceberg ``DataFile`` of these facts (``spec`` must be the file's)."""
        from pyiceberg.conversions import from_bytes
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        partition_type = spec.partition_type(schema)
        values = [None if raw is None else from_bytes(f.field_type, bytes.fromhex(raw))
                  for f, raw in zip(partition_type.fields, self.partition, strict=True)]

        def ints(d: dict[str, int]) -> dict[int, int]:
            return {int(k): int(v) for k, v in d.items()}

        def blobs(d: dict[str, str]) -> dict[int, bytes]:
            return {int(k): bytes.fromhex(v) for k, v in d.items()}

        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=self.path, file_format=FileFormat.PARQUET,
            partition=Record(*values), file_size_in_bytes=self.size,
            record_count=self.records, column_sizes=ints(self.column_sizes),
            value_counts=ints(self.value_counts),
            null_value_counts=ints(self.null_value_counts),
            nan_value_counts=ints(self.nan_value_counts),
            lower_bounds=blobs(self.lower_bounds), upper_bounds=blobs(self.upper_bounds),
            split_offsets=list(self.split_offsets) or None, sort_order_id=None,
            spec_id=self.spec_id, equality_ids=None, key_metadata=None)


@dataclass
class OpenFile:
    """One data file being written: its Parquet writer over a FileIO stream, and the rows
    buffered for its next row group."""

    path: str
    partition: list[str | None]
    stream: Any
    writer: pq.ParquetWriter
    rows: int = 0
    buffered: list[pa.RecordBatch] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.buffered.append(batch)
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            self.writer.write_table(pa.Table.from_batches(self.buffered),
                                    row_group_size=max(self.buffered_rows, 1))
        self.buffered, self.buffered_rows, self.buffered_bytes = [], 0, 0

    def close(self) -> tuple[pq.FileMetaData, int]:
        """Write the last row group and the footer, close the stream (on S3 the upload
        completes here, whole): the footer's metadata and the file's size."""
        self.flush()
        self.writer.close()
        metadata = self.writer.writer.metadata
        size = self.stream.tell()  # every byte of the file went through this stream
        self.stream.close()
        return metadata, size

    def discard(self) -> None:
        """Close without caring for the result (the file is deleted afterwards)."""
        for close in (self.writer.close, self.stream.close):
            # the file is deleted by the caller whatever state it is in
            with contextlib.suppress(Exception):
                close()


class LayoutWriter:
    """Splits a task's batches by partition and writes them into data files of the table
    (executor side). Not thread-safe: one per task attempt."""

    def __init__(self, layout: TableLayout) -> None:
        from pyiceberg.io.fileformat import FileFormatFactory
        from pyiceberg.io.pyarrow import (
            _get_parquet_writer_kwargs,
            compute_statistics_plan,
            parquet_path_to_id_mapping,
        )
        from pyiceberg.manifest import FileFormat
        from pyiceberg.table.locations import load_location_provider

        self.layout = layout
        self.format_model = FileFormatFactory.get(FileFormat.PARQUET)
        self.schema = layout.schema()
        self.spec = layout.spec()
        self.io = layout.io()
        self.locations = load_location_provider(layout.location, layout.properties)
        self.writer_kwargs = _get_parquet_writer_kwargs(layout.properties)
        self.stats_plan = compute_statistics_plan(self.schema, layout.properties)
        self.column_ids = parquet_path_to_id_mapping(self.schema)
        self.partition_type = self.spec.partition_type(self.schema)
        self._task_schema: Any = None
        self._task_schema_of: pa.Schema | None = None

    def split(self, batch: pa.RecordBatch) -> list[tuple[Any, pa.RecordBatch]]:
        """``(partition key or None, rows)`` for each partition value of ``batch``, the rows
        projected onto the table's schema with field ids."""
        from pyiceberg.io.pyarrow import (
            _determine_partitions,
            _to_requested_schema,
            pyarrow_to_schema,
        )

        if self._task_schema_of != batch.schema:
            self._task_schema = pyarrow_to_schema(
                batch.schema, name_mapping=self.schema.name_mapping,
                downcast_ns_timestamp_to_us=True,
                format_version=self.layout.format_version)  # type: ignore[arg-type]
            self._task_schema_of = batch.schema

        def project(rows: pa.RecordBatch) -> pa.RecordBatch:
            return _to_requested_schema(self.schema, self._task_schema, rows,
                                        downcast_ns_timestamp_to_us=True,
                                        include_field_ids=True,
                                        format_model=self.format_model)

        if self.spec.is_unpartitioned():
            return [(None, project(batch))]
        parts = _determine_partitions(self.spec, self.schema, pa.Table.from_batches([batch]))
        return [(p.partition_key, project(b)) for p in parts
                for b in p.arrow_table_partition.to_batches() if b.num_rows]

    def path_of(self, name: str, key: Any) -> str:
        return self.locations.new_data_location(data_file_name=name, partition_key=key)

    def partition_values(self, key: Any) -> list[str | None]:
        """The key's partition values in Iceberg's single-value binary form, hex."""
        from pyiceberg.conversions import to_bytes

        if key is None:
            return []
        record = key.partition
        return [None if record[i] is None else to_bytes(f.field_type, record[i]).hex()
                for i, f in enumerate(self.partition_type.fields)]

    def open(self, path: str, key: Any, schema: pa.Schema) -> OpenFile:
        """A new data file at ``path`` for rows of ``schema`` (projected by :meth:`split`)."""
        stream = self.io.new_output(path).create(overwrite=True)
        try:
            writer = pq.ParquetWriter(stream, schema=schema,
                                      store_decimal_as_integer=True, **self.writer_kwargs)
        except Exception:
            stream.close()
            raise
        return OpenFile(path, self.partition_values(key), stream, writer)

    def facts(self, file: OpenFile, metadata: pq.FileMetaData, size: int) -> FileFacts:
        """The facts of a closed ``file`` from its footer."""
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata

        stats = data_file_statistics_from_parquet_metadata(
            metadata, self.stats_plan, self.column_ids).to_serialized_dict()

        def strs(d: dict[int, Any]) -> dict[str, Any]:
            return {str(k): (v.hex() if isinstance(v, bytes) else int(v)) for k, v in d.items()}

        return FileFacts(
            file.path, size, int(stats["record_count"]), self.spec.spec_id, file.partition,
            strs(stats["column_sizes"]), strs(stats["value_counts"]),
            strs(stats["null_value_counts"]), strs(stats["nan_value_counts"]),
            strs(stats["lower_bounds"]), strs(stats["upper_bounds"]),
            [int(o) for o in stats["split_offsets"] or []])
