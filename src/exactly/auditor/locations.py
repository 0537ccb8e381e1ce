"""Where ``exactly verify`` reads rows: a location string parsed into one of seven kinds.

* a path: a file or a directory of JSON-lines, Parquet or CSV files (the file sink's output,
  the file source's input);
* ``s3://bucket/prefix`` (or ``s3a://``): the same files on an object store, read with the
  ``AWS_*`` settings of the sinks (see :mod:`exactly.auditor.objects`);
* a Delta table: a directory or an ``s3://`` prefix holding ``_delta_log/`` is one
  (found automatically); ``delta:LOCATION`` says so explicitly and fails when there is no
  log; ``?version=N`` at the end reads version N instead of the newest;
* an Iceberg table: ``iceberg:CATALOG?table=namespace.name`` (CATALOG a warehouse directory
  holding the embedded catalog.db, ``sqlite:///...``, ``postgresql://...`` or ``http://...``
  for a REST catalog; ``&snapshot=ID`` reads an older snapshot);
* ``postgresql://user@host:port/db?table=schema.table`` (or ``postgres://``): a table or view;
  the password may be in the URL or in ``PGPASSWORD``/``~/.pgpass`` and is never printed;
* ``kafka://host:port/topic``: every record of a topic, JSON values;
* ``sqlite:///relative.db?table=name`` or ``sqlite:////absolute/path.db?table=name`` (as in
  SQLAlchemy): a SQLite table.

Bad locations raise :class:`~exactly.errors.AuditInputError` naming the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from exactly.auditor.objects import SCHEMES, has_delta_log, is_object_uri, open_store, probe
from exactly.connectors.iceberg.catalog import IcebergAddress
from exactly.connectors.sql import TableName, redact_dsn
from exactly.errors import AuditInputError, ConfigError


@dataclass(frozen=True)
class FilesLocation:
    """A data file, or a directory whose data files are read (``_`` and ``.`` names skipped)."""

    path: Path

    def describe(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class PostgresLocation:
    """A PostgreSQL table or view; ``dsn`` may hold a password, :meth:`describe` hides it."""

    dsn: str
    table: TableName

    def describe(self) -> str:
        return f"{redact_dsn(self.dsn)} table {self.table}"


@dataclass(frozen=True)
class KafkaLocation:
    """Every record of a Kafka topic, values parsed as JSON objects."""

    bootstrap: str
    topic: str

    def describe(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic}"


@dataclass(frozen=True)
class SqliteLocation:
    """A table of a SQLite database file."""

    path: Path
    table: str

    def describe(self) -> str:
        return f"sqlite:///{self.path} table {self.table}"


@dataclass(frozen=True)
class ObjectFilesLocation:
    """Data files under an object-store prefix (``s3://bucket/prefix``), or one object."""

    uri: str

    def describe(self) -> str:
        return self.uri


@dataclass(frozen=True)
class DeltaLocation:
    """A Delta table (a local directory or ``s3://bucket/prefix``): the files of ``version``
    (None: the newest)."""

    uri: str
    version: int | None = None

    def describe(self) -> str:
        return f"Delta table {self.uri}" + ("" if self.version is None
                                            else f" version {self.version}")


@dataclass(frozen=True)
class IcebergLocation:
    """An Iceberg table in a catalog, at ``address.snapshot`` (None: the current one)."""

    address: IcebergAddress

    def describe(self) -> str:
        shown = self.address.describe()
        snapshot = self.address.snapshot
        return shown if snapshot is None else f"{shown} snapshot {snapshot}"


Location = (FilesLocation | ObjectFilesLocation | DeltaLocation | PostgresLocation
            | KafkaLocation | SqliteLocation | IcebergLocation)

_DELTA_PREFIX = "delta:"
_ICEBERG_PREFIX = "iceberg:"
_VERSION = re.compile(r"\?version=(\d+)$")


def parse_location(text: str | None, *, table: str | None = None,
                   dsn_env: str | None = None, what: str = "--output") -> Location:
    """Parse ``text`` (see the module docstring). ``table`` and ``dsn_env`` give a PostgreSQL
    table without a URL: the DSN is read from the environment variable ``dsn_env``."""
    if dsn_env is not None or (text is None and table is not None):
        if text is not None:
            raise AuditInputError(f"{what}: give either a location or --dsn-env with a table, "
                                  "not both")
        return _postgres_from_env(dsn_env, table, what)
    if not text:
        raise AuditInputError(f"{what}: missing; give a directory, s3://bucket/prefix, "
                              "delta:LOCATION, iceberg:CATALOG?table=NS.NAME, "
                              "postgresql://...?table=..., kafka://host:port/topic or "
                              "sqlite:///file.db?table=...")
    if text[:len(_ICEBERG_PREFIX)].lower() == _ICEBERG_PREFIX:
        try:
            return IcebergLocation(IcebergAddress.parse(text))
        except ConfigError as exc:
            raise AuditInputError(f"{what}: {exc}") from None
    if text[:len(_DELTA_PREFIX)].lower() == _DELTA_PREFIX:
        return _files_or_delta(text[len(_DELTA_PREFIX):], what, explicit=True)
    scheme = text.split(":", 1)[0].lower() if "://" in text else ""
    if scheme in ("postgresql", "postgres"):
        return _postgres_url(text, table, what)
    if scheme == "kafka":
        parts = urlsplit(text)
        topic = parts.path.strip("/")
        if not parts.netloc or not topic or "/" in topic:
            raise AuditInputError(f"{what}: {text!r}: write kafka://host:port/topic")
        return KafkaLocation(parts.netloc, topic)
    if scheme == "sqlite":
        parts = urlsplit(text)
        name = table or dict(parse_qsl(parts.query)).get("table")
        if not name:
            raise AuditInputError(f"{what}: {text!r} names no table; add ?table=NAME")
        # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute/path.db
        path = Path(parts.netloc + parts.path[1:])
        if not path.is_file():
            raise AuditInputError(f"{what}: SQLite database {path} does not exist")
        return SqliteLocation(path, name)
    if scheme and scheme not in ("file", *SCHEMES):
        raise AuditInputError(f"{what}: {text!r}: unknown scheme {scheme}://; use a path, "
                              "s3://, delta:, iceberg:CATALOG?table=NS.NAME, postgresql://, "
                              "kafka:// or sqlite://")
    return _files_or_delta(text, what, explicit=False)


def _files_or_delta(text: str, what: str, *, explicit: bool
                    ) -> FilesLocation | ObjectFilesLocation | DeltaLocation:
    """A path or an object-store URI: a Delta table when it holds a Delta log (or must,
    ``explicit``), else its files."""
    version: int | None = None
    if match := _VERSION.search(text):
        text, version = text[:match.start()], int(match.group(1))
    if is_object_uri(text):
        store = open_store(text, what)
        probe(store, what)
        delta = has_delta_log(store, what)
        uri = store.uri
    else:
        if text.lower().startswith("file://"):
            text = urlsplit(text).path
        elif "://" in text:
            raise AuditInputError(f"{what}: {_DELTA_PREFIX}{text!r}: a Delta table is a "
                                  "directory or an s3://bucket/prefix")
        path = Path(text)
        if not path.exists():
            raise AuditInputError(f"{what}: {path} does not exist")
        delta = (path / "_delta_log").is_dir()
        uri = str(path.resolve())
        if not delta and not explicit and version is None:
            return FilesLocation(path)
    if delta:
        return DeltaLocation(uri, version)
    if explicit:
        raise AuditInputError(f"{what}: {uri} is not a Delta table: it has no _delta_log/; "
                              f"drop {_DELTA_PREFIX!r} to read its data files")
    if version is not None:
        raise AuditInputError(f"{what}: ?version={version}: {uri} is not a Delta table (no "
                              "_delta_log/); versions are Delta's")
    return ObjectFilesLocation(uri)


def _postgres_url(text: str, table: str | None, what: str) -> PostgresLocation:
    parts = urlsplit(text)
    query = parse_qsl(parts.query)
    named = [v for k, v in query if k == "table"]
    name = table or (named[0] if named else None)
    if not name:
        raise AuditInputError(f"{what}: {redact_dsn(text)} names no table; add ?table=NAME "
                              "(or schema.name)")
    dsn = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                     if k != "table"])))
    return PostgresLocation(dsn, _table(name, what))


def _postgres_from_env(dsn_env: str | None, table: str | None, what: str) -> PostgresLocation:
    if not table:
        raise AuditInputError(f"{what}: --dsn-env needs a table (--table or --input-table)")
    if not dsn_env:
        raise AuditInputError(f"{what}: a table needs a database: give --dsn-env VARIABLE "
                              "or a postgresql://...?table= URL")
    dsn = os.environ.get(dsn_env)
    if not dsn:
        raise AuditInputError(f"{what}: the environment variable {dsn_env} (--dsn-env) is "
                              "not set; set it to the PostgreSQL DSN")
    return PostgresLocation(dsn, _table(table, what))


def _table(name: str, what: str) -> TableName:
    try:
        return TableName.parse(name)
    except ConfigError as exc:
        raise AuditInputError(f"{what}: {exc}") from None
