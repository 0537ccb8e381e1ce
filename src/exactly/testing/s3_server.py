"""A throw-away S3-compatible server (S3Proxy) on 127.0.0.1, for tests of object-store sinks.

The server is `S3Proxy <https://github.com/gaul/s3proxy>`_ 4.0.0 over its ``filesystem-nio2``
backend: buckets are directories and objects files of a data directory of its own. It runs
from the jars that ``scripts/install-objectstore.sh`` (run by ``scripts/setup.sh``) fetches from
Maven Central into the per-user cache ``${XDG_CACHE_HOME:-~/.cache}/exactly/s3proxy/jars``;
``EXACTLY_S3PROXY_JARS`` names another directory. Missing jars are a
:class:`~exactly.errors.ConfigError` naming both fixes.

What it guarantees (S3Proxy 4.0.0; tests/objectstore/test_s3_server.py checks each but the
first):

- requests signed (AWS signature v2 or v4) with a generated key pair; nothing listens on
  anything but 127.0.0.1;
- ``PutObject`` with ``If-None-Match: *`` on an existing key, or with ``If-Match`` naming
  another ETag, is refused with 412 PreconditionFailed and the object left as it was;
  ``If-Match`` on a missing key is 404 NoSuchKey, as on S3;
- a single-part object's ETag is the quoted hex MD5 of its bytes;
- an object is written to a temporary file beside it and renamed into place, so a GET sees
  the old or the new bytes; objects survive :meth:`S3Server.kill` (SIGKILL).

What it does not (measured): it is a server for **one writer at a time per directory**.

- ``If-Match`` is a check followed by a write, not a compare-and-swap (``If-None-Match: *``
  is atomic since 4.0.0: 0 double winners in 30 rounds of 16 racing threads; 3.3.0 had them
  in 22 of 30, and lost ``deltalake`` commits of concurrent appends silently). A race
  between ``If-Match`` writers proves nothing here that real S3 would.
- A LIST that overlaps a PUT in the same directory can silently omit settled objects: its
  directory walk ends at the first temporary file that a PUT renames away meanwhile (a
  deleted file ends it the same way). With 2 threads writing, a third of the listings
  missed some of 50 settled objects, some listed none. Listings also show in-flight
  temporary files as keys ``<key>-<uuid>``. A ``deltalake`` read of a table that a job
  commits to then fails now and then, most often with "Expected contiguous commit files,
  but found gap" (a commit file missing from the LIST of ``_delta_log/``): a test's read
  that must not fail on it reads again
  (:func:`exactly.testing.nemesis.observers.retry_incomplete_listing` names each such error).

The backend is ``filesystem-nio2`` (``filesystem`` is an alias of it since S3Proxy 3); the
legacy ``filesystem-jclouds`` lists without omissions but reports every directory as a key
(``a/`` beside ``a/x``) and has the same conditional-put race. Each object's ETag lives in
a ``user.*`` extended attribute of its file, so the data directory must be on a file system
that has them (ext4, xfs, btrfs, tmpfs on Linux 6.6+), else every ``If-Match`` fails:
:meth:`S3Server.start` checks that first.

:meth:`S3Server.stop` and :meth:`S3Server.kill` stop it; :meth:`S3Server.start` after either
restarts it on the same port and data. Like the Kafka broker of
:mod:`exactly.testing.kafka_broker`, the server runs in a session of its own (a Ctrl-C at the
terminal reaches the test process only), and whoever starts it closes it: the pytest fixture
``s3_server`` of :mod:`exactly.testing.pytest_plugin` does at the end of the session.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from exactly.cache import configured_dir, missing_jars, user_cache
from exactly.errors import ConfigError, ExactlyError
from exactly.testing.ports import free_port
from exactly.testing.server_process import ServerProcess, log_tail

JARS_ENV = "EXACTLY_S3PROXY_JARS"
MAIN_CLASS = "org.gaul.s3proxy.Main"
REGION = "us-east-1"
_XATTR = "user.exactly-probe"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/exactly/s3proxy`` (``~/.cache/exactly/s3proxy`` when that is unset
    or not absolute): where ``scripts/install-objectstore.sh`` puts the jars (in ``jars/``)."""
    return user_cache("s3proxy")


def jars_dir() -> Path:
    """The directory of the S3Proxy jars: ``$EXACTLY_S3PROXY_JARS`` if set, else
    ``<cache>/exactly/s3proxy/jars``. Not checked here."""
    return configured_dir(JARS_ENV, cache_dir() / "jars")


def s3proxy_jars_dir() -> Path:
    """Directory of the S3Proxy jars; raises ConfigError naming both fixes if missing."""
    directory = jars_dir()
    if any(directory.glob("s3proxy-*.jar")):
        return directory
    raise missing_jars("S3Proxy jars (org.gaul:s3proxy and its dependencies)", directory,
                       JARS_ENV, "s3", cache_dir() / "jars")


def _check_xattrs(directory: Path) -> None:
    """Raise ConfigError unless files in ``directory`` take ``user.*`` extended attributes
    (S3Proxy keeps each object's ETag in one)."""
    probe = directory / ".xattr-probe"
    try:
        probe.touch()
        os.setxattr(probe, _XATTR, b"1")
    except (OSError, AttributeError) as exc:
        raise ConfigError(
            f"{directory} does not take user.* extended attributes ({exc}): S3Proxy keeps "
            "each object's ETag in one, and without them every If-Match write fails. Give "
            "S3Server a workdir on ext4, xfs, btrfs or tmpfs (Linux 6.6+)") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


class S3Server(ServerProcess):
    """One S3Proxy process with its own data directory and key pair, on 127.0.0.1:``port``.

    Parameters
    ----------
    workdir:
        Holds ``s3proxy.conf``, ``logback.xml``, the log ``s3proxy.log`` and the objects
        (``data/<bucket>/<key>``); a temp dir if None (removed by :meth:`close`).
    port:
        A free port if None; kept across restarts.
    heap:
        JVM heap, e.g. ``"256m"``.
    """

    def __init__(self, workdir: str | Path | None = None, *, port: int | None = None,
                 heap: str = "256m") -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="exactly-s3-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.port = port or free_port()
        self.heap = heap
        self._access_key = f"exactly-{secrets.token_hex(6)}"
        self._secret_key = secrets.token_urlsafe(30)
        self.proc: subprocess.Popen[bytes] | None = None

    # -- where and who ----------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_key(self) -> str:
        return self._access_key

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def region(self) -> str:
        """``us-east-1`` (S3Proxy accepts any region in a signature; this one is the
        default every client agrees on)."""
        return REGION

    @property
    def log_file(self) -> Path:
        return self.workdir / "s3proxy.log"

    def storage_options(self) -> dict[str, str]:
        """The ``storage_options`` of the ``deltalake`` package (and of ``object_store``)
        for this server: path-style requests over plain HTTP, commit files created with
        ``If-None-Match: *`` (``conditional_put=etag``). S3Proxy does not make that check
        atomic: one writer per table at a time (see the module's notes)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}

    def env(self) -> dict[str, str]:
        """Environment variables that point the default AWS credential chain (boto3, the
        AWS CLI, ``deltalake`` without ``storage_options``) at this server; merge them over
        ``os.environ``. An ``AWS_PROFILE`` or ``AWS_SESSION_TOKEN`` already there still
        applies: remove those from the child's environment."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_CONDITIONAL_PUT": "etag", "AWS_EC2_METADATA_DISABLED": "true"}

    def boto3_client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style addressing); ``config`` goes to
        ``botocore.config.Config``."""
        import boto3
        from botocore.config import Config

        settings: dict[str, Any] = {"s3": {"addressing_style": "path"},
                                    "retries": {"max_attempts": 3, "mode": "standard"},
                                    "connect_timeout": 5, "read_timeout": 30, **config}
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, config=Config(**settings))

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name``; a no-op if it exists."""
        client = self.boto3_client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)

    # -- life cycle ---------------------------------------------------------------------------
    def _config(self) -> str:
        props = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key,
            "s3proxy.credential": self.secret_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(self.data_dir),
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _logback(self) -> Path:
        path = self.workdir / "logback.xml"
        if not path.exists():  # without it logback logs every request at DEBUG to stdout
            path.write_text(
                "<configuration>\n"
                '  <appender name="F" class="ch.qos.logback.core.FileAppender">\n'
                f"    <file>{self.log_file}</file>\n"
                "    <encoder><pattern>%d %level %logger{1} %msg%n</pattern></encoder>\n"
                "  </appender>\n"
                '  <logger name="org.gaul.s3proxy" level="INFO"/>\n'
                '  <root level="WARN"><appender-ref ref="F"/></root>\n'
                "</configuration>\n")
        return path

    def _command(self, config: Path) -> list[str]:
        jars = s3proxy_jars_dir()
        # a test server lives minutes: C1 only spares the CPU the optimizing JIT would take
        return ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", f"-Dlogback.configurationFile={self._logback()}",
                "-cp", f"{jars}/*", MAIN_CLASS, "--properties", str(config)]

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server (a no-op while it runs); returns once it answers HTTP.

        Raises ConfigError when the jars are missing or the data directory has no extended
        attributes, ExactlyError (with the tail of its log) when it exits or does not answer
        within ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _check_xattrs(self.data_dir)
        config = self.workdir / "s3proxy.conf"
        config.write_text(self._config())
        config.chmod(0o600)  # it holds the secret key
        command = self._command(config)
        out = open(self.workdir / "s3proxy.out", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server answers an HTTP request (any status: an anonymous request
        is refused, which proves S3Proxy serves). Raises ExactlyError naming its logs when
        it exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            if self.proc is None:
                raise ExactlyError("the S3 server is not running: call start()")
            if self.proc.poll() is not None:
                raise ExactlyError(
                    f"the S3 server (S3Proxy) exited with {self.proc.returncode} at start; see "
                    f"{self.workdir / 's3proxy.out'} and {self.log_file}. Its output ends:\n"
                    f"{log_tail(self.workdir / 's3proxy.out')}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
                return
            except OSError as exc:
                last = exc
            finally:
                conn.close()
            if time.monotonic() >= deadline:
                raise ExactlyError(
                    f"the S3 server on {self.endpoint} did not answer within {timeout:.0f}s "
                    f"({last}); see {self.workdir / 's3proxy.out'} and {self.log_file}. Its "
                    f"output ends:\n{log_tail(self.workdir / 's3proxy.out')}")
            time.sleep(0.05)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
