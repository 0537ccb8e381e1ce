"""The sinks of the contract suite: how to build each one, feed it rows with ids, read back
the ids a reader sees, and what it promises beyond the common protocol.

Every case writes rows carrying an integer ``id`` (the audit id of docs/design.md section 7) and
reads back the sorted ids a reader sees, duplicates included, so "visible exactly once" is
``visible() == sorted(expected ids)``. Server-backed cases need the ``pg``, ``broker``,
``s3_server`` or ``iceberg_rest*`` fixture, started on first use (the ``server`` lane).
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from exactly.config import Mode
from exactly.protocol.contract import SinkSettings, TwoPhaseCommitSink
from exactly.testing.harness import ProtocolHarness

ID_KEY = pa.schema([("id", pa.int64()), ("key", pa.string())])


def partitions(epoch: int) -> list[list[int]]:
    """The input of ``epoch``: ids n*100+0..4, n*100+5..9 and an empty partition (which
    pre-commits nothing). Spark replays an epoch with the same input."""
    base = epoch * 100
    return [list(range(base, base + 5)), list(range(base + 5, base + 10)), []]


def ids(*epochs: int) -> list[int]:
    """The ids of ``epochs``, each once, sorted."""
    return sorted(i for e in epochs for part in partitions(e) for i in part)


class SinkCase(ABC):
    """One sink under the contract suite (a fresh target per test)."""

    #: the case's name: the test id
    name: ClassVar[str]
    #: needs a PostgreSQL server or a Kafka broker (marked ``server``)
    server: ClassVar[bool] = False
    #: a task's rows are visible when the task ends, before any commit (idempotent upserts):
    #: its pre-commit is not abortable and nothing waits for the intent
    visible_at_task_end: ClassVar[bool] = False
    #: a replay rewrites rows by key instead of adding them again (upserts)
    keyed: ClassVar[bool] = False
    #: ``already_committed`` of an epoch recovered after a crash between its first and second
    #: handle commit: sinks that commit handle by handle recognise the first (1); sinks that
    #: make the epoch visible only in ``publish_epoch`` have nothing committed yet (0)
    already_committed_between_commits: ClassVar[int] = 1

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.request = request
        self.tmp = tmp_path

    def harness(self, mode: Mode = Mode.EXACTLY_ONCE) -> ProtocolHarness:
        """A harness over a new sink of this case in ``mode``."""
        settings = self.settings(mode)
        return ProtocolHarness(self.build(settings), settings, visible=self.visible)

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode)

    @abstractmethod
    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        """The sink, its target prepared (``prepare_target``)."""

    def rows(self, epoch: int) -> list[pa.RecordBatch]:
        """The input of ``epoch`` (:func:`partitions`), one batch per partition."""
        return [self.batch(part) for part in partitions(epoch)]

    def batch(self, ids: list[int]) -> pa.RecordBatch:
        """Rows carrying ``ids`` (a batch with no rows for an empty list)."""
        return pa.record_batch({"id": ids, "key": [f"k{i % 3}" for i in ids]}, schema=ID_KEY)

    @abstractmethod
    def visible(self) -> list[int]:
        """The sorted ids a reader of the target sees now, duplicates included."""

    def written(self) -> list[int]:
        """Every id that reached the target in any state some reader could be configured to
        see (Kafka: ``read_uncommitted``, which shows aborted transactions too)."""
        return self.visible()


class FilesCase(SinkCase):
    name = "files"

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.files.sink import FileSink

        self.root = self.tmp / "out"
        return FileSink(str(self.root))

    def batch(self, ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch({"id": pa.array(ids, pa.int64())})

    def visible(self) -> list[int]:
        from exactly.audit import data_files

        files = [str(f) for f in data_files(self.root)] if self.root.exists() else []
        if not files:
            return []
        return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


class SqliteWalCase(SinkCase):
    name = "sqlite_wal"
    already_committed_between_commits = 0

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.wal import SqliteWalTarget, WriteAheadSink

        self.path = self.tmp / "db.sqlite"
        log = settings.require_log_location("wal") if settings.log_dir else self.tmp / "log"
        sink = WriteAheadSink(SqliteWalTarget(str(self.path), "events"), log)
        sink.prepare_target(ID_KEY)
        return sink

    def visible(self) -> list[int]:
        with sqlite3.connect(self.path) as c:
            return [r[0] for r in c.execute('SELECT id FROM "events" ORDER BY id')]


class _PostgresCase(SinkCase):
    server = True

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.pg: Any = request.getfixturevalue("pg")
        self.table: str = request.getfixturevalue("table_name")

    def visible(self) -> list[int]:
        from psycopg import sql

        with self.pg.connect() as c:
            return [r[0] for r in c.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(
                sql.Identifier(self.table)))]


class Postgres2pcCase(_PostgresCase):
    """Visible = the plain table (a reader between two ``COMMIT PREPARED`` sees part of an
    epoch there; tests/postgres/test_pg_visibility.py covers the epoch-consistent view)."""

    name = "pg_2pc"

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.postgres.two_phase import PostgresTwoPhaseSink

        sink = PostgresTwoPhaseSink(self.pg.dsn, self.table, self.tmp / "log", retry_seconds=20)
        sink.prepare_target(ID_KEY, partitions=3)
        return sink


class PostgresWalCase(_PostgresCase):
    name = "pg_wal"
    already_committed_between_commits = 0

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.wal import PostgresWalTarget, WriteAheadSink

        sink = WriteAheadSink(PostgresWalTarget(self.pg.dsn, self.table), self.tmp / "log")
        sink.prepare_target(ID_KEY)
        return sink


class PostgresUpsertCase(_PostgresCase):
    """Keyed by ``id``: a replay rewrites the same rows."""

    name = "pg_upsert"
    visible_at_task_end = True
    keyed = True
    already_committed_between_commits = 2  # nothing to commit on the driver side

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.postgres.upsert import IdempotentUpsertSink

        sink = IdempotentUpsertSink(self.pg.dsn, self.table, ["id"], self.tmp / "log")
        sink.prepare_target(ID_KEY)
        return sink


class KafkaCase(SinkCase):
    """Rows are records ``{"id": n}``; visible = what a ``read_committed`` consumer reads."""

    name = "kafka"
    server = True
    already_committed_between_commits = 0
    #: more sink options
    extra: dict[str, str] = {}

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.broker: Any = request.getfixturevalue("broker")
        self.topic: str = request.getfixturevalue("topic")

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode, log_dir=str(self.tmp / "log"))

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.kafka.options import KafkaSinkOptions
        from exactly.connectors.kafka.sink import KafkaSink

        options = KafkaSinkOptions.from_options({
            "kafka.bootstrap.servers": self.broker.bootstrap, "topic": self.topic,
            "transactionalIdPrefix": "contract", "kafka.transaction.timeout.ms": "20000",
            **self.extra}, settings.mode)
        return KafkaSink(options, settings)

    def batch(self, ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch({"key": [str(i % 3) for i in ids],
                                "value": [json.dumps({"id": i}) for i in ids]},
                               schema=pa.schema([("key", pa.string()), ("value", pa.string())]))

    def _read(self, isolation: str) -> list[int]:
        from exactly.testing.kafka_broker import consume_all

        return sorted(json.loads(v)["id"] for _, _, _, v in
                      consume_all(self.broker.bootstrap, self.topic, isolation_level=isolation))

    def visible(self) -> list[int]:
        return self._read("read_committed")

    def written(self) -> list[int]:
        return self._read("read_uncommitted")


class DeltaCase(SinkCase):
    """A Delta table in a local directory; visible = what ``deltalake`` reads."""

    name = "delta"
    already_committed_between_commits = 0  # the epoch becomes visible in one Delta commit

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode, log_dir=str(self.tmp / "log"))

    def table_uri(self) -> str:
        return str(self.tmp / "table")

    def storage_options(self) -> dict[str, str]:
        return {}

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.delta.sink import DeltaSink

        sink = DeltaSink(self.table_uri(), Path(settings.log_dir or self.tmp / "log"),
                         storage_options=self.storage_options())
        sink.prepare_target(ID_KEY)
        return sink

    def visible(self) -> list[int]:
        from deltalake import DeltaTable

        table = DeltaTable(self.table_uri(), storage_options=self.storage_options())
        return sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())


class IcebergCase(SinkCase):
    """An Iceberg table in the embedded SQLite catalog of a local warehouse; visible = what
    pyiceberg reads from the table's current snapshot."""

    name = "iceberg"
    already_committed_between_commits = 0  # the epoch becomes visible in one snapshot
    table_name = "db.events"

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode, log_dir=str(self.tmp / "log"))

    def catalog_options(self) -> tuple[dict[str, str], str | None]:
        return {}, str(self.tmp / "warehouse")

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.iceberg.catalog import CatalogSpec
        from exactly.connectors.iceberg.sink import IcebergSink

        options, warehouse = self.catalog_options()
        self.catalog = CatalogSpec.from_options(options, warehouse)
        sink = IcebergSink(self.table_name, settings.require_log_location("iceberg"),
                           catalog=self.catalog)
        sink.prepare_target(ID_KEY)
        return sink

    def visible(self) -> list[int]:
        table = self.catalog.load().load_table(self.table_name)
        return sorted(table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())


class IcebergRestCase(IcebergCase):
    """The Iceberg sink through a REST catalog (the test kit's server), the table's files in
    its local warehouse; each test a namespace of its own."""

    name = "iceberg_rest"
    server = True

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.rest: Any = request.getfixturevalue("iceberg_rest")
        self.table_name = f"t_{tmp_path.name[-24:].lower().replace('-', '_')}.events"

    def catalog_options(self) -> tuple[dict[str, str], str | None]:
        props = self.rest.catalog_properties()
        return {k: v for k, v in props.items() if k != "warehouse"}, props.get("warehouse")


class IcebergPostgresS3Case(IcebergCase):
    """The Iceberg sink with the SQL catalog on PostgreSQL and the table's files, the commit
    log and the lease on S3Proxy (the store in the ``AWS_*`` environment)."""

    name = "iceberg_pg_s3"
    server = True

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.pg: Any = request.getfixturevalue("pg")
        s3: Any = request.getfixturevalue("s3_server")
        monkeypatch = request.getfixturevalue("monkeypatch")
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        self.bucket = f"contract-{tmp_path.name.lower().replace('_', '-')[-40:]}".strip("-")
        s3.create_bucket(self.bucket)
        self.table_name = f"t_{tmp_path.name[-24:].lower().replace('-', '_')}.events"

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode, log_dir=f"s3://{self.bucket}/log")

    def catalog_options(self) -> tuple[dict[str, str], str | None]:
        return {"uri": self.pg.dsn}, f"s3://{self.bucket}/lake"


class _OnS3:
    """A case with its sink's commit log, lease and staging under ``s3://<bucket>/log`` on
    an S3-compatible object store (S3Proxy), the store in the ``AWS_*`` environment."""

    server = True
    tmp: Path

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)  # type: ignore[call-arg]
        self.s3: Any = request.getfixturevalue("s3_server")
        monkeypatch = request.getfixturevalue("monkeypatch")
        for key, value in self.s3.env().items():  # the commit log's and the stage's clients
            monkeypatch.setenv(key, value)
        self.bucket = f"contract-{tmp_path.name.lower().replace('_', '-')[-40:]}".strip("-")
        self.s3.create_bucket(self.bucket)

    def settings(self, mode: Mode) -> SinkSettings:
        return SinkSettings(mode=mode, log_dir=f"s3://{self.bucket}/log")


class DeltaS3Case(_OnS3, DeltaCase):
    """The Delta sink with everything on an S3-compatible object store (S3Proxy): the table,
    and the commit log and lease under ``s3://<bucket>/log``. Nothing is renamed."""

    name = "delta_s3"

    def build(self, settings: SinkSettings) -> TwoPhaseCommitSink:
        from exactly.connectors.delta.sink import DeltaSink

        sink = DeltaSink(self.table_uri(), settings.require_log_location("delta"),
                         storage_options=self.storage_options())
        sink.prepare_target(ID_KEY)
        return sink

    def table_uri(self) -> str:
        return f"s3://{self.bucket}/table"

    def storage_options(self) -> dict[str, str]:
        return self.s3.storage_options()


class SqliteWalS3Case(_OnS3, SqliteWalCase):
    """The write-ahead sink with its staged Parquet files, log and lease on S3."""

    name = "sqlite_wal_s3"


class KafkaSharesCase(KafkaCase):
    """The Kafka sink publishing each epoch in 2 shares (``exactly.kafka.publishShares``),
    from the committing process (no Spark session here): each share its own producer and
    marker."""

    name = "kafka_shares"
    extra = {"exactly.kafka.publishShares": "2"}


class KafkaS3Case(_OnS3, KafkaCase):
    """The Kafka sink with its staged Arrow files, log and lease on S3."""

    name = "kafka_s3"


class IcebergRestS3Case(_OnS3, IcebergCase):
    """The Iceberg sink through the test kit's REST catalog whose warehouse is on S3Proxy,
    configured as a user would: the catalog's URI alone (the server places the table in its
    warehouse), the store in the ``AWS_*`` environment, no ``catalog.s3.*`` option; the
    commit log and lease on S3 too. Each test a namespace of its own."""

    name = "iceberg_rest_s3"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.rest: Any = request.getfixturevalue("iceberg_rest_s3")
        self.table_name = f"t_{tmp_path.name[-24:].lower().replace('-', '_')}.events"

    def catalog_options(self) -> tuple[dict[str, str], str | None]:
        return {"uri": self.rest.uri}, None


CASES: tuple[type[SinkCase], ...] = (FilesCase, SqliteWalCase, SqliteWalS3Case,
                                     Postgres2pcCase, PostgresWalCase, PostgresUpsertCase,
                                     KafkaCase, KafkaSharesCase, KafkaS3Case, DeltaCase,
                                     DeltaS3Case, IcebergCase,
                                     IcebergRestCase, IcebergPostgresS3Case, IcebergRestS3Case)
BY_NAME = {c.name: c for c in CASES}


def over_sinks(*, only: Callable[[type[SinkCase]], bool] | None = None, why_not: str = "",
               among: Sequence[str] | None = None) -> pytest.MarkDecorator:
    """Parametrize a test over every sink (the ``case`` fixture), or the sinks named in
    ``among`` (a test of some sinks' own promise).

    Sinks for which ``only`` is false are collected as skipped, the reason ``why_not`` in
    the report; server-backed sinks carry the ``server`` marker.
    """
    params = []
    for case in CASES:
        if among is not None and case.name not in among:
            continue
        marks: list[pytest.MarkDecorator] = [pytest.mark.server] if case.server else []
        if only is not None and not only(case):
            marks.append(pytest.mark.skip(reason=f"not for {case.name}: {why_not}"))
        params.append(pytest.param(case.name, id=case.name, marks=marks))
    return pytest.mark.parametrize("case", params, indirect=True)
