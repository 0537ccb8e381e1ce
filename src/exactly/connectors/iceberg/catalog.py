"""Which Iceberg catalog and table an ``exactly.iceberg`` sink (or an audit) uses.

A table is named ``namespace.name`` (``a.b.name`` for nested namespaces) and lives in a
catalog, given as pyiceberg catalog properties:

* nothing but a ``warehouse`` directory (the embedded default): a SQL catalog on SQLite in
  ``<warehouse>/catalog.db``, tables under ``<warehouse>/<namespace>/<name>``;
* ``catalog.uri`` an SQLAlchemy URL (``sqlite:////abs/catalog.db``, ``postgresql://user@host/db``;
  ``postgresql://`` is driven by psycopg 3): a SQL catalog there;
* ``catalog.type=rest`` and ``catalog.uri=http(s)://...``: a REST catalog;
* any other ``catalog.<key>`` is passed to pyiceberg as is (``catalog.s3.endpoint``, ...);
  ``catalog.name`` (default ``exactly``) is the catalog's name, which a SQL catalog stores
  beside each table: readers load the catalog under the same name.

Files on S3 (``warehouse=s3://bucket/prefix``) use the ``AWS_*`` environment variables of the
other sinks (endpoint, credentials, region) for the ``s3.*`` keys not given, so the data files
exactly writes and the metadata pyiceberg writes go to one endpoint with one set of
credentials. Secrets (passwords in URLs, keys, tokens) never appear in ``repr``, messages or
logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exactly.connectors.sql import redact_dsn
from exactly.errors import ConfigError
from exactly.objectstore import Location

#: the catalog file of the embedded default, inside the warehouse directory
EMBEDDED_CATALOG = "catalog.db"
#: the catalog's default name (``catalog.name``): a SQL catalog keeps it beside every table
#: it holds, so readers name the catalog the same (``load_catalog("exactly", ...)``)
CATALOG_NAME = "exactly"
#: ``AWS_*`` environment variable -> pyiceberg's S3 property
S3_PROPERTIES = {"AWS_ENDPOINT_URL": "s3.endpoint", "AWS_ACCESS_KEY_ID": "s3.access-key-id",
                 "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
                 "AWS_SESSION_TOKEN": "s3.session-token", "AWS_REGION": "s3.region",
                 "AWS_DEFAULT_REGION": "s3.region"}
_SECRET = re.compile(r"secret|token|password|credential|key-id", re.IGNORECASE)
_NAME_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-$]*$")


def parse_identifier(text: str) -> tuple[str, ...]:
    """``"db.events"`` -> ``("db", "events")``. ConfigError for a name without a namespace
    or with an empty or odd part (names are letters, digits, ``_``, ``-`` and ``$``)."""
    parts = tuple(p.strip() for p in (text or "").split("."))
    if len(parts) < 2 or not all(_NAME_PART.match(p) for p in parts):
        raise ConfigError(
            f"exactly.iceberg: {text!r} is not a table name; name the table with its "
            "namespace, e.g. .option('table', 'db.events') (letters, digits, _ - $)")
    return parts


@dataclass(frozen=True)
class CatalogSpec:
    """pyiceberg catalog properties, complete (defaults and ``AWS_*`` settings applied)."""

    properties: Mapping[str, str] = field(default_factory=dict)
    name: str = CATALOG_NAME

    @classmethod
    def from_options(cls, catalog: Mapping[str, str], warehouse: str | None) -> CatalogSpec:
        """The catalog of ``catalog`` (``catalog.*`` options without the prefix) and
        ``warehouse``. ConfigError naming the fix when neither names a catalog, or when the
        embedded SQLite catalog would have to live on an object store."""
        props = {str(k): str(v) for k, v in catalog.items()}
        name = props.pop("name", CATALOG_NAME) or CATALOG_NAME
        if warehouse:
            props.setdefault("warehouse", _normal(warehouse))
        kind = props.get("type", "rest" if props.get("uri", "").startswith("http") else "sql")
        props["type"] = kind
        if kind == "sql":
            if "uri" not in props:
                where = props.get("warehouse")
                if not where:
                    raise ConfigError(
                        "exactly.iceberg: no catalog: set .option('warehouse', DIR) (a SQLite "
                        "catalog is kept in DIR/catalog.db) or .option('catalog.uri', URL) "
                        "(sqlite:////path/catalog.db, postgresql://user@host/db) or "
                        "catalog.type=rest with catalog.uri=http://...")
                if "://" in where:
                    raise ConfigError(
                        f"exactly.iceberg: the warehouse {where} is on an object store, where "
                        "the embedded SQLite catalog cannot live; set .option('catalog.uri', "
                        "'postgresql://user@host/db') (or a REST catalog) for the catalog")
                props["uri"] = f"sqlite:///{where}/{EMBEDDED_CATALOG}"
            elif props["uri"].startswith(("postgresql://", "postgres://")):
                props["uri"] = "postgresql+psycopg://" + props["uri"].split("://", 1)[1]
            if props["uri"].startswith("postgresql+"):
                # a pooled connection the network cut while idle is found dead before a
                # commit uses it, not by the commit (which would fail the epoch)
                props.setdefault("pool_pre_ping", "true")
            elif not props["uri"].startswith(("sqlite:", "postgresql+")):
                raise ConfigError(
                    f"exactly.iceberg: catalog.uri {redact_dsn(props['uri'])} is not an "
                    "SQLAlchemy URL of SQLite or PostgreSQL (sqlite:////path/catalog.db, "
                    "postgresql://user@host/db); for a REST catalog set catalog.type=rest")
        where = props.get("warehouse", "")
        # a REST catalog places its tables itself: on S3 though no warehouse here says so,
        # and the executors' FileIO has only these properties (pyarrow reads no endpoint
        # from the environment: its files would go to AWS, the markers to AWS_ENDPOINT_URL)
        if kind == "rest" or where.startswith(("s3://", "s3a://")) or any(
                k.startswith("s3.") for k in props):
            for env, key in S3_PROPERTIES.items():
                if key not in props and os.environ.get(env):
                    props[key] = os.environ[env]
        return cls(props, name)

    @property
    def is_embedded(self) -> bool:
        return self.properties.get("type") == "sql" and self.properties.get(
            "uri", "").endswith(f"/{EMBEDDED_CATALOG}") and self.properties["uri"].startswith(
            "sqlite:")

    def load(self) -> Any:
        """The pyiceberg catalog. The embedded SQLite catalog's directory is created."""
        from pyiceberg.catalog import load_catalog

        if self.properties.get("type") == "sql" and self.properties["uri"].startswith(
                "sqlite:///"):
            directory = os.path.dirname(self.properties["uri"][len("sqlite:///"):])
            if directory:
                os.makedirs(directory, exist_ok=True)
        try:
            return load_catalog(self.name, **self.properties)
        except Exception as exc:  # pyiceberg raises many kinds; all are a bad catalog here
            raise ConfigError(f"exactly.iceberg: cannot open the catalog {self.describe()} "
                              f"({redact_dsn(f'{type(exc).__name__}: {exc}')}); check "
                              "catalog.uri, the warehouse and the credentials") from None

    def io_properties(self) -> dict[str, str]:
        """The properties a FileIO of the executors needs (``s3.*`` and the like)."""
        return {k: v for k, v in self.properties.items()
                if k.split(".", 1)[0] in ("s3", "gcs", "adls", "hdfs", "py-io-impl")}

    def describe(self) -> str:
        """The catalog, without secrets."""
        kind = self.properties.get("type", "sql")
        uri = redact_dsn(self.properties.get("uri", ""))
        return f"{kind} catalog {uri}" if uri else f"{kind} catalog"

    def __repr__(self) -> str:
        shown = {k: ("***" if _SECRET.search(k) else redact_dsn(v))
                 for k, v in self.properties.items()}
        return f"CatalogSpec({self.name!r}, {shown})"


def _normal(warehouse: str) -> str:
    """A local warehouse as an absolute path; ``s3a://`` as ``s3://``."""
    return Location.parse(warehouse).uri


#: how an Iceberg table is written as one string (``exactly verify --output``, ``exactly
#: pipeline --output``)
ADDRESS_FORM = ("iceberg:CATALOG?table=NAMESPACE.NAME, CATALOG a warehouse directory (its "
                "catalog.db), sqlite:////path/catalog.db, postgresql://user@host/db or "
                "http://host:port (REST); &warehouse=DIR|s3://... where new tables go; "
                f"&catalog.name=NAME the catalog's name (the sink's catalog.name, default "
                f"{CATALOG_NAME}); &snapshot=ID to read an older snapshot")
#: the query parameters of an address that are its own, not its catalog URL's
ADDRESS_PARAMETERS = ("table", "warehouse", "catalog.name", "snapshot")


@dataclass(frozen=True)
class IcebergAddress:
    """An Iceberg table named in one string: its catalog, its name, and a snapshot."""

    catalog: CatalogSpec
    table: str
    snapshot: int | None = None

    @classmethod
    def parse(cls, text: str) -> IcebergAddress:
        """``iceberg:CATALOG?table=NS.NAME[&warehouse=W][&catalog.name=NAME][&snapshot=ID]``
        (:data:`ADDRESS_FORM`). The catalog URL's own query parameters (``sslmode=...``) stay
        with it. ConfigError naming the form for anything else, also for a parameter that is
        not the address's after a warehouse directory (which has none of its own)."""
        from urllib.parse import parse_qsl, urlencode

        body = text[len("iceberg:"):] if text.startswith("iceberg:") else text
        where, _, query = body.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        table = params.pop("table", "")
        warehouse = params.pop("warehouse", None)
        name = params.pop("catalog.name", None)
        snapshot = params.pop("snapshot", None)
        if not where or not table:
            raise ConfigError(f"{redact_dsn(text)} names no Iceberg table: write {ADDRESS_FORM}")
        parse_identifier(table)
        if snapshot is not None and not snapshot.lstrip("-").isdigit():
            raise ConfigError(f"{redact_dsn(text)}: snapshot={snapshot!r} is not a snapshot id")
        if name is not None and not name.strip():
            raise ConfigError(f"{redact_dsn(text)}: catalog.name is empty; name the catalog as "
                              f"the sink's option catalog.name does (default {CATALOG_NAME})")
        named = {} if name is None else {"name": name.strip()}
        rest = f"{where}?{urlencode(params)}" if params else where
        if rest.startswith(("http://", "https://")):
            spec = CatalogSpec.from_options({**named, "type": "rest", "uri": rest}, warehouse)
        elif rest.startswith(("sqlite:", "postgresql:", "postgres:", "postgresql+")):
            spec = CatalogSpec.from_options({**named, "uri": rest}, warehouse)
        elif params:
            raise ConfigError(
                f"{redact_dsn(text)}: unknown parameter(s) {', '.join(sorted(params))} (an "
                f"address takes {', '.join(ADDRESS_PARAMETERS)}): write {ADDRESS_FORM}")
        else:
            spec = CatalogSpec.from_options(named, warehouse or where)
        return cls(spec, table, int(snapshot) if snapshot is not None else None)

    def sink_options(self) -> dict[str, str]:
        """The ``exactly.iceberg`` options that write this table."""
        props = dict(self.catalog.properties)
        options = {"table": self.table}
        if "warehouse" in props:
            options["warehouse"] = props.pop("warehouse")
        if self.catalog.is_embedded:
            props.pop("uri")
            props.pop("type")
        options.update({f"catalog.{k}": v for k, v in props.items()
                        if not k.startswith("s3.")})  # S3 settings: the AWS_* variables
        if self.catalog.name != CATALOG_NAME:
            options["catalog.name"] = self.catalog.name
        return options

    def describe(self) -> str:
        return f"Iceberg table {self.table} ({self.catalog.describe()})"

    def name_hint(self) -> str:
        """What to say when a SQL catalog has no such table: it keys tables by the catalog's
        name, which may be another than the address's (empty for other catalogs)."""
        if self.catalog.properties.get("type") != "sql":
            return ""
        return (f" under the catalog name {self.catalog.name!r} (a SQL catalog keeps each "
                "table under the name of the catalog that created it: for a table written "
                "with the sink's option catalog.name, add &catalog.name=NAME)")
