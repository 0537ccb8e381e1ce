"""Readers that watch a sink's output while a job runs under faults, feeding a
:class:`~exactly.testing.nemesis.checker.History`: one per target.

Each is a :class:`~exactly.testing.readers.BackgroundReader` (a daemon thread from entering
the ``with`` block to leaving it) that polls every ``poll_seconds``; leaving the block takes
one last look (the final state, :meth:`History.last`) and closes its client. A failed read
(the target partitioned, paused or restarting) is recorded with :meth:`History.error` and the
reader goes on with a fresh client: nothing raises out of the thread. A reader connects to
its target directly, not through the nemesis proxy; while a server is paused (SIGSTOP) a
read waits until it resumes.

=====================  ==============================================  ======================
reader                 sees                                            epoch of a row
=====================  ==============================================  ======================
FileOutputObserver     the file sink's ``epoch-N/`` directories        N
PostgresObserver       a table or view, ``SELECT`` in autocommit       its epoch column, or
                       (2PC: the table or ``<table>_committed``;       None (write-ahead)
                       upsert: the table, with key and value columns;
                       write-ahead: the table)
KafkaObserver          a topic, ``read_committed`` or                  a field of the JSON
                       ``read_uncommitted``, each record once          value, or None
DeltaObserver          each new table version (local or ``s3://``)     the ``txn`` version
                                                                       (``exactly-<query>``)
IcebergObserver        each snapshot of the table's main line, through  ``exactly.epoch`` of
                       its catalog (SQL, REST); and the table's          the summary of the
                       progress property ``exactly.epoch.<query>``       snapshot that added
                       with it (:meth:`History.epoch_record`)           the row's file
=====================  ==============================================  ======================
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from exactly.testing.nemesis.checker import ISOLATIONS, READ_COMMITTED, History, Row
from exactly.testing.readers import BackgroundReader

T = TypeVar("T")


class Observer(BackgroundReader):
    """Polls a target into ``history`` under ``name``; subclasses implement :meth:`poll`."""

    isolation = READ_COMMITTED

    def __init__(self, history: History, name: str, *, poll_seconds: float = 0.1) -> None:
        super().__init__()
        self.history, self.name, self.poll_seconds = history, name, poll_seconds

    def poll(self) -> None:
        """Read the target once and record what was seen."""
        raise NotImplementedError

    def reset(self) -> None:
        """Drop a client a failed read may have broken (the next poll opens a new one)."""

    def final_look(self) -> None:
        """The last read after the thread ended; default: one more poll."""
        self.poll()

    def run(self) -> None:
        while not self.stopping.is_set():
            self._guarded(self.poll)
            self.stopping.wait(self.poll_seconds)

    def finish(self) -> None:
        self._guarded(self.final_look)
        self._guarded(self.reset)

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # recorded, never raised out of the thread
            self.history.error(self.name, exc)
            try:
                self.reset()
            except Exception as again:
                self.history.error(self.name, again)


def _pick(columns: Mapping[str, list[Any]], name: str | None, n: int) -> list[Any]:
    return columns[name] if name else [None] * n


# -- the file sink ------------------------------------------------------------------------
class FileOutputObserver(Observer):
    """The file sink's output directory: every published ``epoch-N`` directory and its
    files (Parquet or JSON lines; names starting with ``_`` or ``.`` skipped, as every
    reader of the output does). A published file never changes, so each is read once."""

    def __init__(self, history: History, path: str | Path, *, name: str = "files",
                 id_column: str = "id", key_column: str | None = None,
                 value_column: str | None = None, poll_seconds: float = 0.1) -> None:
        super().__init__(history, name, poll_seconds=poll_seconds)
        self.path = Path(path)
        self.columns = (id_column, key_column, value_column)
        self._files: dict[tuple[str, int, int], list[Row]] = {}

    def poll(self) -> None:
        names = sorted(e.name for e in os.scandir(self.path)
                       if e.name.startswith("epoch-")) if self.path.exists() else []
        rows: list[Row] = []
        for name in names:
            epoch = int(name.removeprefix("epoch-"))
            for entry in sorted(os.scandir(self.path / name), key=lambda e: e.name):
                if not entry.name.startswith(("_", ".")):
                    rows.extend(self._read(Path(entry.path), epoch))
        self.history.snapshot(self.name, self.isolation, rows, at=f"{len(names)} epochs")

    def _read(self, path: Path, epoch: int) -> list[Row]:
        stat = path.stat()
        cached = (str(path), stat.st_size, stat.st_mtime_ns)
        if cached not in self._files:
            import pyarrow.json as pajson
            import pyarrow.parquet as pq

            wanted = [c for c in self.columns if c]
            table = (pq.read_table(path, columns=wanted) if path.suffix == ".parquet"
                     else pajson.read_json(path).select(wanted))
            cols = {c: table[c].to_pylist() for c in wanted}
            id_column, key_column, value_column = self.columns
            n = table.num_rows
            self._files[cached] = [Row(i, epoch, k, v) for i, k, v in zip(
                cols[id_column], _pick(cols, key_column, n), _pick(cols, value_column, n),
                strict=True)]
        return self._files[cached]


# -- PostgreSQL ---------------------------------------------------------------------------
class PostgresObserver(Observer):
    """A PostgreSQL table or view, read whole with one ``SELECT`` per poll on an autocommit
    connection (one statement: one snapshot).

    The sinks' layouts: the 2PC sink's table (``epoch_column="exactly_epoch"``; the plain
    table shows each task's rows at its ``COMMIT PREPARED``) or its view
    ``<table>_committed`` (whole epochs); the upsert sink's table (``key_column`` and
    ``value_column`` name its key and value, ``epoch_column`` its guard); the write-ahead
    sink's table (``epoch_column=None``: its rows carry no epoch).
    """

    def __init__(self, history: History, dsn: str, table: str, *, name: str = "postgres",
                 id_column: str = "id", epoch_column: str | None = "exactly_epoch",
                 key_column: str | None = None, value_column: str | None = None,
                 poll_seconds: float = 0.1) -> None:
        super().__init__(history, name, poll_seconds=poll_seconds)
        self.dsn, self.table = dsn, table
        self.columns = (id_column, epoch_column, key_column, value_column)
        self._conn: Any = None

    def _query(self) -> Any:
        from psycopg import sql

        from exactly.connectors.sql import TableName

        parts = [sql.Identifier(c) if c else sql.SQL("NULL") for c in self.columns]
        return sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(parts), TableName.parse(self.table).sql(), parts[0])

    def poll(self) -> None:
        from exactly.connectors.sql import pg_connect

        if self._conn is None:  # its errors name the server, never the password
            self._conn = pg_connect(self.dsn, application=f"exactly-observer-{self.name}",
                                    autocommit=True, connect_timeout=5)
        rows = self._conn.execute(self._query()).fetchall()
        self.history.snapshot(self.name, self.isolation, rows)

    def reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# -- Kafka --------------------------------------------------------------------------------
def json_row(id_field: str = "id", *, epoch_field: str | None = None,
             key_field: str | None = None, value_field: str | None = None
             ) -> Callable[[Any], Row | None]:
    """A record's row from its JSON object value (None for a tombstone); a missing epoch
    field gives epoch None (the checker then uses the input's assignment)."""

    def row(message: Any) -> Row | None:
        if message.value() is None:
            return None
        value = json.loads(message.value())
        return Row(value[id_field], value.get(epoch_field) if epoch_field else None,
                   value.get(key_field) if key_field else None,
                   value.get(value_field) if value_field else None)

    return row


class KafkaObserver(Observer):
    """A topic read from its start by a consumer of ``isolation`` (``read_committed``: what
    consumers of the exactly-once sink are promised; ``read_uncommitted``: also open and
    aborted transactions), each record recorded once (:meth:`History.seen`) as ``row(msg)``
    makes it. Its partitions are assigned once the topic exists. Leaving the block reads on
    to the log end offsets of that moment (up to ``drain_seconds``; a transaction still open
    then is recorded as an error), so a read_committed stream ends complete."""

    def __init__(self, history: History, bootstrap: str, topic: str, *,
                 isolation: str = READ_COMMITTED, name: str | None = None,
                 row: Callable[[Any], Row | None] | None = None, poll_seconds: float = 0.1,
                 drain_seconds: float = 30.0) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation {isolation!r}: use one of {ISOLATIONS}")
        super().__init__(history, name or f"kafka-{isolation}", poll_seconds=poll_seconds)
        self.isolation = isolation
        self.bootstrap, self.topic = bootstrap, topic
        self.row = row or json_row()
        self.drain_seconds = drain_seconds
        self._consumer: Any = None
        self._partitions: list[int] = []
        self._next: dict[int, int] = {}  # partition -> next offset to read (survives resets)

    def _conf(self, isolation: str) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "log_level": 2,
                "group.id": f"exactly-observer-{uuid.uuid4()}", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "isolation.level": isolation,
                "socket.connection.setup.timeout.ms": 5_000}

    def _assigned(self) -> bool:
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer(self._conf(self.isolation))
        if not self._partitions:
            found = self._consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
            if found is None or found.error is not None or not found.partitions:
                return False
            self._partitions = sorted(found.partitions)
            self._next = {p: self._next.get(p, 0) for p in self._partitions}
            self._consumer.assign([TopicPartition(self.topic, p, self._next[p])
                                   for p in self._partitions])
        return True

    def poll(self) -> None:
        if not self._assigned():
            return
        messages = self._consumer.consume(1000, self.poll_seconds)
        rows = []
        for message in messages:
            if message.error() is not None:
                continue
            self._next[message.partition()] = message.offset() + 1
            row = self.row(message)
            if row is not None:
                rows.append(row)
        self.history.seen(self.name, self.isolation, rows)

    def run(self) -> None:
        while not self.stopping.is_set():  # consume() waits poll_seconds itself
            started = time.monotonic()
            self._guarded(self.poll)
            if time.monotonic() - started < self.poll_seconds / 2:  # not assigned, or failed
                self.stopping.wait(self.poll_seconds)

    def final_look(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        if not self._assigned():
            return
        probe = Consumer(self._conf("read_uncommitted"))
        try:
            ends = {p: probe.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                    for p in self._partitions}
        finally:
            probe.close()
        deadline = time.monotonic() + self.drain_seconds
        while True:
            positions = self._consumer.position([TopicPartition(self.topic, p)
                                                 for p in self._partitions])
            if all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition]):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: did not reach the end offsets {ends} within "
                                   f"{self.drain_seconds:.0f}s (a transaction still open?)")
            self.poll()

    def reset(self) -> None:
        consumer, self._consumer, self._partitions = self._consumer, None, []
        if consumer is not None:
            consumer.close()


# -- Delta --------------------------------------------------------------------------------
#: ``deltalake``'s errors (deltalake 1.6, delta-kernel) when the LIST of ``_delta_log/``
#: missed files the log holds: a commit between two others it returned; the first commit
#: (``00000000000000000000.json``: the table's metadata and protocol); the newest commits
#: up to a version asked for (``DeltaTable(uri, version=N)``); the checkpoint that
#: ``_last_checkpoint`` names (a table past 100 commits, deltalake's checkpoint interval)
INCOMPLETE_LISTING = ("Expected contiguous commit files, but found gap",
                      "No table metadata or protocol found in delta log",
                      "not the same as the specified end version",
                      "Had a _last_checkpoint hint but didn't find any checkpoints")
#: reads in all of :func:`retry_incomplete_listing` (the first and the retries), and the
#: wait before each retry: a LIST overlaps a PUT of the sink for milliseconds, one commit
#: every few hundred milliseconds
LISTING_ATTEMPTS = 5
LISTING_WAIT_S = 0.2


def retry_incomplete_listing(read: Callable[[], T], *, attempts: int = LISTING_ATTEMPTS,
                             wait_s: float = LISTING_WAIT_S) -> T:
    """``read()`` (a read of a Delta table on the test kit's S3 server while a job commits
    to it), read again -- up to ``attempts`` reads in all, ``wait_s`` apart -- while it
    fails with one of ``deltalake``'s :data:`INCOMPLETE_LISTING` errors, then raised as is.

    Those errors are S3Proxy's, not the table's: a LIST that overlaps a PUT in the same
    directory can omit settled objects (:mod:`exactly.testing.s3_server`), here commit files
    of ``_delta_log/`` while the sink writes its next commit. The files are there: a listing
    a moment later holds them. Real S3's LIST is strongly consistent. A log that stays
    broken (a commit file missing for good) still fails after the last read; any other
    error is raised at once. A read of the newest version whose listing misses only the
    newest commits reads an older version, no error: a caller that waits reads again."""
    from deltalake.exceptions import DeltaError

    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    attempt = 1
    while True:
        try:
            return read()
        except DeltaError as exc:
            if attempt >= attempts or not any(m in str(exc) for m in INCOMPLETE_LISTING):
                raise
        attempt += 1
        time.sleep(wait_s)


class DeltaObserver(Observer):
    """A Delta table, each new version read once (a snapshot per version, ``at`` =
    ``version N``): the rows of its files, each row with the epoch of the commit that added
    its file (the version of the sink's ``exactly-<query id>`` application transaction;
    None for other writers' commits). ``uri`` is a local path or ``s3://bucket/prefix``
    (``storage_options`` as the Delta sink takes them; ``AWS_*`` variables fill the rest).
    A data file never changes, so each is read once."""

    def __init__(self, history: History, uri: str, *, name: str = "delta",
                 storage_options: Mapping[str, str] | None = None, id_column: str = "id",
                 key_column: str | None = None, value_column: str | None = None,
                 poll_seconds: float = 0.2) -> None:
        super().__init__(history, name, poll_seconds=poll_seconds)
        from exactly.objectstore import Location

        self.location = Location.parse(uri, storage_options)
        self.columns = (id_column, key_column, value_column)
        self.version = -1  # the newest version read
        self._origins: dict[str, tuple[int, int | None]] = {}  # file -> (version, epoch)
        self._files: dict[str, list[tuple[Any, Any, Any]]] = {}

    def poll(self) -> None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            newest = DeltaTable(self.location.uri,
                                storage_options=self.location.resolved_options()).version()
        except TableNotFoundError:  # not created yet
            return
        for version in range(self.version + 1, newest + 1):
            self._read_version(version)
            self.version = version

    def _read_version(self, version: int) -> None:
        import pyarrow.fs as pafs
        from deltalake import DeltaTable

        from exactly.connectors.delta.commits import file_origins, read_commit

        fs, base = self.location.filesystem()
        root = pafs.SubTreeFileSystem(base, fs)
        table = DeltaTable(self.location.uri, version=version,
                           storage_options=self.location.resolved_options())
        dataset = table.to_pyarrow_dataset(filesystem=root)
        fragments = list(dataset.get_fragments())
        commit = read_commit(fs, base, version)
        for path in commit.added:
            self._origins[path] = (version, commit.epoch)
        unknown = [f.path for f in fragments if f.path not in self._origins]
        if unknown:  # the reader started after these were committed
            for path, origin in file_origins(fs, base, unknown, version).items():
                self._origins[path] = (origin.version, origin.epoch)
        wanted = [c for c in self.columns if c]
        id_column, key_column, value_column = self.columns
        rows: list[Row] = []
        for fragment in fragments:
            if fragment.path not in self._files:
                data = fragment.to_table(schema=dataset.schema, columns=wanted)
                cols = {c: data[c].to_pylist() for c in wanted}
                n = data.num_rows
                self._files[fragment.path] = list(zip(
                    cols[id_column], _pick(cols, key_column, n), _pick(cols, value_column, n),
                    strict=True))
            epoch = self._origins[fragment.path][1]
            rows.extend(Row(i, epoch, k, v) for i, k, v in self._files[fragment.path])
        self.history.snapshot(self.name, self.isolation, rows, at=f"version {version}")


# -- Iceberg ------------------------------------------------------------------------------
class IcebergObserver(Observer):
    """An Iceberg table read through its catalog, as any Iceberg reader reads it. ``address``
    names it as ``exactly verify`` does (``iceberg:CATALOG?table=NS.NAME``,
    :data:`~exactly.connectors.iceberg.catalog.ADDRESS_FORM`; the ``AWS_*`` variables of this
    process fill its S3 settings when it is parsed, here).

    Every snapshot of the table's main line is read once, oldest first -- also those committed
    between two polls (Iceberg keeps them: nothing a reader could have seen is skipped) -- as
    one snapshot of the history (``at`` = ``snapshot ID (sequence N)``): the rows of its live
    data files, each row with the epoch of the snapshot that added its file (``exactly.epoch``
    of that snapshot's summary; None for another writer's snapshot or one that expired). A
    snapshot with delete files is a read error (the rows are read from data files only).

    Each poll also reads the table's progress property ``exactly.epoch.<query>`` of every
    query that has one, with the newest epoch of that query on the main line of the same
    metadata (:meth:`History.epoch_record`): the sink sets both in one metadata commit. Not
    compared when the main line no longer reaches the table's first snapshot (expired: the
    newest epoch is unknown) or holds a retract (it sets the property back on purpose).

    Manifests and data files never change: each is read once. The catalog's client is kept
    across polls and replaced after a failed one. A table not created yet is no error.
    """

    def __init__(self, history: History, address: str, *, name: str = "iceberg",
                 id_column: str = "id", key_column: str | None = None,
                 value_column: str | None = None, poll_seconds: float = 0.2) -> None:
        super().__init__(history, name, poll_seconds=poll_seconds)
        from exactly.connectors.iceberg.catalog import IcebergAddress

        self.address = IcebergAddress.parse(address)
        self.columns = (id_column, key_column, value_column)
        self.snapshots_read: list[int] = []  # snapshot ids, in the order they were read
        self._read: set[int] = set()
        self._epochs: dict[int, int | None] = {}  # snapshot id -> its epoch
        self._manifests: dict[str, list[tuple[str, int | None]]] = {}  # -> (file, added by)
        self._files: dict[str, list[tuple[Any, Any, Any]]] = {}
        self._catalog: Any = None

    def _table(self) -> Any:
        """The table as the catalog has it now; None when it does not exist yet."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if self._catalog is None:
            self._catalog = self.address.catalog.load()
        try:
            return self._catalog.load_table(self.address.table)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def poll(self) -> None:
        from exactly.connectors.iceberg.snapshots import epoch_of

        table = self._table()
        if table is None:
            return
        for snapshot in table.metadata.snapshots:
            self._epochs[snapshot.snapshot_id] = epoch_of(snapshot)[1]
        line = self._main_line(table)
        for entry in line:
            snapshot = entry.snapshot
            if snapshot.snapshot_id in self._read:
                continue
            rows = self._rows(table, snapshot)
            self.history.snapshot(self.name, self.isolation, rows,
                                  at=f"snapshot {snapshot.snapshot_id} "
                                     f"(sequence {snapshot.sequence_number})")
            self._read.add(snapshot.snapshot_id)
            self.snapshots_read.append(snapshot.snapshot_id)
        self._progress(table, line)

    def current_rows(self) -> list[Row]:
        """The rows of the table's current snapshot, read now (the final output); none
        before the table or its first snapshot exists."""
        from exactly.connectors.iceberg.snapshots import epoch_of

        table = self._table()
        if table is None or table.metadata.current_snapshot() is None:
            return []
        for snapshot in table.metadata.snapshots:
            self._epochs[snapshot.snapshot_id] = epoch_of(snapshot)[1]
        return self._rows(table, table.metadata.current_snapshot())

    @staticmethod
    def _main_line(table: Any) -> list[Any]:
        from exactly.connectors.iceberg.snapshots import main_line

        if table.metadata.current_snapshot_id is None:
            return []
        return list(main_line(table))[::-1]  # oldest first

    def _rows(self, table: Any, snapshot: Any) -> list[Row]:
        from pyiceberg.manifest import ManifestContent

        files: list[tuple[str, int | None]] = []
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA:
                raise ValueError(f"{self.name}: snapshot {snapshot.snapshot_id} has delete "
                                 f"files ({manifest.manifest_path}); this reader reads data "
                                 "files only")
            if manifest.manifest_path not in self._manifests:
                self._manifests[manifest.manifest_path] = [
                    (e.data_file.file_path, e.snapshot_id)
                    for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]
            files.extend(self._manifests[manifest.manifest_path])
        rows: list[Row] = []
        for path, added_by in sorted(files, key=lambda f: f[0]):
            epoch = self._epochs.get(added_by) if added_by is not None else None
            rows.extend(Row(i, epoch, k, v) for i, k, v in self._data(table, path))
        return rows

    def _data(self, table: Any, path: str) -> list[tuple[Any, Any, Any]]:
        if path not in self._files:
            import pyarrow.parquet as pq

            wanted = [c for c in self.columns if c]
            with table.io.new_input(path).open() as f:
                data = pq.read_table(f, columns=wanted)
            cols = {c: data[c].to_pylist() for c in wanted}
            id_column, key_column, value_column = self.columns
            n = data.num_rows
            self._files[path] = list(zip(cols[id_column], _pick(cols, key_column, n),
                                         _pick(cols, value_column, n), strict=True))
        return self._files[path]

    def _progress(self, table: Any, line: list[Any]) -> None:
        from exactly.connectors.iceberg.snapshots import PROGRESS_PREFIX, SUMMARY_RETRACTED

        if line and line[0].snapshot.parent_snapshot_id is not None:
            return  # expired ancestors: the query's newest epoch may be among them
        if any(SUMMARY_RETRACTED in entry.properties for entry in line):
            return
        shown: dict[str, int] = {}
        for entry in line:  # oldest first: the newest commit of a query wins
            if entry.query_id is not None and entry.epoch is not None:
                shown[entry.query_id] = entry.epoch
        current = table.metadata.current_snapshot_id
        for key, value in sorted(table.metadata.properties.items()):
            if not key.startswith(PROGRESS_PREFIX):
                continue
            query = key[len(PROGRESS_PREFIX):]
            recorded = int(value) if value.lstrip("-").isdigit() else None
            self.history.epoch_record(self.name, query, recorded, shown.get(query),
                                      at=f"snapshot {current}")

    def reset(self) -> None:
        catalog, self._catalog = self._catalog, None
        close = getattr(catalog, "close", None)
        if close is not None:
            close()
