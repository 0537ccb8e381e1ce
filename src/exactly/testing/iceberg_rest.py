"""A throw-away Apache Iceberg REST catalog on 127.0.0.1, for tests of Iceberg sinks.

The server is the one of the ``apache/iceberg-rest-fixture`` image, from Iceberg 1.10's jars
on Maven Central: ``RESTServerCatalogAdapter`` (``iceberg-open-api``'s test fixtures) over
``RESTCatalogAdapter`` and ``RESTCatalogServlet`` (``iceberg-core``'s tests jar), on Jetty,
with a ``JdbcCatalog`` on a SQLite file behind it. ``scripts/install-objectstore.sh`` (run by
``scripts/setup.sh s3`` and ``tests``) fetches the jars into the per-user cache
``${XDG_CACHE_HOME:-~/.cache}/exactly/iceberg-rest/jars``; ``EXACTLY_ICEBERG_REST_JARS`` names
another directory. Missing jars are a :class:`~exactly.errors.ConfigError` naming both fixes.

The JVM runs exactly's launcher (``jvm/ExactlyRestCatalogServer.java`` beside this module,
compiled once per source and jars into ``<cache>/iceberg-rest/launcher``), not Iceberg's
``RESTCatalogServer.main``, which listens on every interface: the launcher serves the same
adapter on 127.0.0.1 only, needs no Hadoop (its own ``LocalFileIO`` writes a local
warehouse; S3 warehouses use Iceberg's ``S3FileIO``), and prints one line when it accepts
requests, so :meth:`IcebergRestServer.start` waits on that line instead of polling.

What it guarantees (tests/objectstore/test_iceberg_rest_server.py checks each):

- a commit is checked against the table's current metadata (the REST requirements, then the
  ``JdbcCatalog``'s compare-and-swap of the metadata location): a client committing from a
  stale table is refused with 409, ``pyiceberg.exceptions.CommitFailedException``;
- snapshot summaries keep the properties a client gives them;
- the catalog (``catalog.db``) and the warehouse survive :meth:`~IcebergRestServer.stop` and
  :meth:`~IcebergRestServer.kill`; :meth:`~IcebergRestServer.start` serves them again on the
  same port.

On S3 (``s3=`` an :class:`~exactly.testing.s3_server.S3Server`) the warehouse is
``s3://<bucket>/warehouse`` on a bucket of its own, which :meth:`IcebergRestServer.start`
creates: metadata files go there through the server's ``S3FileIO``, data files through the
client's (pyiceberg's PyArrowFileIO, :meth:`IcebergRestServer.catalog_properties`). S3Proxy's
limits (:mod:`exactly.testing.s3_server`) do not reach commits: the compare-and-swap is in
SQLite, metadata files have names of their own.

Like the other servers of the test kit, it runs in a session of its own, and whoever starts it
closes it: the pytest fixtures ``iceberg_rest`` and ``iceberg_rest_s3`` of
:mod:`exactly.testing.pytest_plugin` do at the end of the session.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import select
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.cache import configured_dir, missing_jars, user_cache
from exactly.errors import ConfigError, ExactlyError
from exactly.spark.jvm_compile import CompileError, compile_jar, find_compiler
from exactly.testing.ports import free_port
from exactly.testing.server_process import ServerProcess, log_tail

if TYPE_CHECKING:
    from exactly.testing.s3_server import S3Server

JARS_ENV = "EXACTLY_ICEBERG_REST_JARS"
MAIN_CLASS = "org.apache.iceberg.rest.ExactlyRestCatalogServer"
#: the launcher's source; compiled against the jars by :func:`launcher_jar`
LAUNCHER_SOURCE = Path(__file__).with_name("jvm") / "ExactlyRestCatalogServer.java"
#: the launcher's line on stdout once Jetty accepts connections (then the server's URI)
READY = b"EXACTLY_REST_CATALOG_READY "
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
S3_CLIENT_FACTORY = "org.apache.iceberg.aws.s3.DefaultS3FileIOAwsClientFactory"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/exactly/iceberg-rest`` (``~/.cache/exactly/iceberg-rest`` when that is
    unset or not absolute): where ``scripts/install-objectstore.sh`` puts the jars (in
    ``jars/``) and the launcher is compiled to (in ``launcher/``)."""
    return user_cache("iceberg-rest")


def jars_dir() -> Path:
    """The directory of the server's jars: ``$EXACTLY_ICEBERG_REST_JARS`` if set, else
    ``<cache>/exactly/iceberg-rest/jars``. Not checked here."""
    return configured_dir(JARS_ENV, cache_dir() / "jars")


def iceberg_rest_jars_dir() -> Path:
    """Directory of the server's jars; raises ConfigError naming both fixes if missing."""
    directory = jars_dir()
    if any(directory.glob("iceberg-open-api-*-test-fixtures.jar")):
        return directory
    raise missing_jars("Iceberg REST catalog jars (org.apache.iceberg:iceberg-open-api's test "
                       "fixtures and their dependencies)", directory, JARS_ENV, "s3",
                       cache_dir() / "jars")


def launcher_jar(jars: Path) -> Path:
    """exactly's launcher compiled against ``jars``: from the cache, else compiled now (once
    per launcher source and set of jars; a compile takes ~2 s). Raises ConfigError when no
    Java compiler is here or the source does not compile against these jars."""
    digest = hashlib.sha256(LAUNCHER_SOURCE.read_bytes())
    for jar in sorted(p.name for p in jars.glob("*.jar")):
        digest.update(b"\0" + jar.encode())
    target = cache_dir() / "launcher" / f"exactly-rest-catalog-{digest.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    compiler = find_compiler()
    if compiler is None:
        raise ConfigError(
            "the Iceberg REST catalog server needs exactly's launcher, compiled once: no Java "
            "compiler is here (javac, or the java runtime's jdk.compiler module); install a "
            "JDK (Debian: openjdk-17-jdk-headless)")
    try:
        compile_jar(compiler, LAUNCHER_SOURCE, jars, target)
    except CompileError as exc:
        raise ConfigError(f"exactly's Iceberg REST launcher does not compile against the jars "
                          f"in {jars}: {exc}") from None
    return target


class IcebergRestServer(ServerProcess):
    """One Iceberg REST catalog server with its own catalog, on 127.0.0.1:``port``.

    Parameters
    ----------
    workdir:
        Holds the catalog ``catalog.db`` (SQLite), the server's log ``iceberg-rest.log`` and,
        without ``s3``, the warehouse ``warehouse/``. Kept by :meth:`close`.
    s3:
        A started S3 server: the warehouse is then ``s3://<bucket>/warehouse`` there, on a
        bucket of its own that :meth:`start` creates.
    port:
        A free port if None; kept across restarts.
    heap:
        JVM heap, e.g. ``"256m"``.

    Examples
    --------
    >>> from pyiceberg.catalog import load_catalog
    >>> with IcebergRestServer(tmp_path) as server:                       # doctest: +SKIP
    ...     catalog = load_catalog("rest", **server.catalog_properties())
    ...     catalog.create_namespace("db")
    """

    def __init__(self, workdir: str | Path, *, s3: S3Server | None = None,
                 port: int | None = None, heap: str = "256m") -> None:
        self._own_dir = False
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.s3 = s3
        self.bucket = f"iceberg-{secrets.token_hex(6)}" if s3 is not None else None
        self.port = port or free_port()
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None

    # -- where --------------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        """The warehouse: ``<workdir>/warehouse``, or ``s3://<bucket>/warehouse`` on S3.
        Tables are ``<warehouse>/<namespace>/<name>``."""
        if self.bucket is not None:
            return f"s3://{self.bucket}/warehouse"
        return str(self.workdir / "warehouse")

    @property
    def catalog_db(self) -> Path:
        """The backend catalog's SQLite file."""
        return self.workdir / "catalog.db"

    @property
    def log_file(self) -> Path:
        """The server's log (its stderr)."""
        return self.workdir / "iceberg-rest.log"

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg catalog properties for a client of this server:
        ``load_catalog("rest", **server.catalog_properties())``. On S3 they include the
        ``s3.*`` keys pyiceberg's PyArrowFileIO reads (endpoint, key pair, region,
        path-style requests), so its data files go where the server writes metadata."""
        props = {"type": "rest", "uri": self.uri, "warehouse": self.warehouse}
        if self.s3 is not None:
            props.update({"s3.endpoint": self.s3.endpoint,
                          "s3.access-key-id": self.s3.access_key,
                          "s3.secret-access-key": self.s3.secret_key,
                          "s3.path-style-access": "true", "s3.region": self.s3.region})
        return props

    # -- life cycle ---------------------------------------------------------------------------
    def _catalog_env(self) -> dict[str, str]:
        """The backend catalog's properties as the server reads them: ``CATALOG_<KEY>`` with
        ``.`` as ``_`` and ``-`` as ``__`` (``CATALOG_IO__IMPL`` is ``io-impl``)."""
        env = {"CATALOG_URI": f"jdbc:sqlite:{self.catalog_db}",
               "CATALOG_WAREHOUSE": self.warehouse,
               "CATALOG_REST_HOST": "127.0.0.1", "CATALOG_REST_PORT": str(self.port)}
        if self.s3 is not None:
            env.update({"CATALOG_IO__IMPL": S3_FILE_IO,
                        # S3FileIO's client factory of S3 alone (the default one also builds
                        # STS, KMS, Glue and DynamoDB clients, and needs their SDK modules)
                        "CATALOG_S3_CLIENT__FACTORY__IMPL": S3_CLIENT_FACTORY,
                        "CATALOG_S3_ENDPOINT": self.s3.endpoint,
                        "CATALOG_S3_PATH__STYLE__ACCESS": "true",
                        "CATALOG_S3_ACCESS__KEY__ID": self.s3.access_key,
                        "CATALOG_S3_SECRET__ACCESS__KEY": self.s3.secret_key,
                        "CATALOG_CLIENT_REGION": self.s3.region})
        return env

    def _env(self) -> dict[str, str]:
        # nothing of the caller's CATALOG_* (the server reads them all) nor AWS_* (the SDK
        # would): only what _catalog_env says
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CATALOG_", "AWS_"))}
        env.update(self._catalog_env())
        env["AWS_EC2_METADATA_DISABLED"] = "true"  # no credential lookups on 169.254.169.254
        return env

    def _command(self) -> list[str]:
        jars = iceberg_rest_jars_dir()
        launcher = launcher_jar(jars)
        # a test server lives minutes: C1 only spares the CPU the optimizing JIT would take
        return ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
                "-cp", f"{launcher}{os.pathsep}{jars}/*", MAIN_CLASS]

    def start(self, timeout: float = 60.0) -> IcebergRestServer:
        """Start the server (a no-op while it runs); returns once it serves requests.

        Raises ConfigError when the jars or a Java compiler for the launcher are missing,
        ExactlyError (with the tail of its log) when it exits or does not serve within
        ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        command = self._command()
        if self.s3 is not None:
            assert self.bucket is not None
            self.s3.create_bucket(self.bucket)
        else:
            Path(self.warehouse).mkdir(exist_ok=True)
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log,
                                     stdin=subprocess.DEVNULL, env=self._env(),
                                     start_new_session=True)
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Read the launcher's stdout until its ready line, then ask ``/v1/config`` once.
        Raises ExactlyError naming the log when it exits or ``timeout`` passes first."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        out = self.proc.stdout
        seen = b""
        try:
            while READY not in seen or not seen.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._failed(f"did not start within {timeout:.0f}s")
                readable, _, _ = select.select([out], [], [], remaining)
                if readable:
                    chunk = os.read(out.fileno(), 4096)
                    if not chunk:  # stdout closed: the JVM is exiting
                        self.proc.wait(timeout=10)
                        raise self._failed(f"exited with {self.proc.returncode} at start")
                    seen += chunk
        finally:
            out.close()  # the launcher writes nothing to stdout after that line
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/v1/config")
            response = conn.getresponse()
            body = response.read()
        except OSError as exc:
            raise self._failed(f"does not answer ({exc})") from None
        finally:
            conn.close()
        if response.status != 200:
            raise self._failed(f"answers GET /v1/config with {response.status}: "
                               f"{body[:200]!r}")

    def _failed(self, what: str) -> ExactlyError:
        return ExactlyError(f"the Iceberg REST catalog server on {self.uri} {what}; see "
                            f"{self.log_file}. Its log ends:\n{log_tail(self.log_file)}")

    def __enter__(self) -> IcebergRestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
