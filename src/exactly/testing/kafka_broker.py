"""A throw-away single-node Apache Kafka broker (KRaft) on 127.0.0.1, for tests, demo, bench.

The broker runs from the jars that ``scripts/install-kafka.sh`` fetches from Maven Central
into the per-user cache ``${XDG_CACHE_HOME:-~/.cache}/exactly/kafka/broker``
(``EXACTLY_KAFKA_JARS`` names another directory; see :mod:`exactly.connectors.kafka.jars`).
Its storage is formatted with Kafka's ``StorageTool``; the transaction state log and the
offsets topic have replication factor 1 and min ISR 1, so transactions work on one node.
Nothing listens on anything but 127.0.0.1. :meth:`KafkaBroker.stop` and
:meth:`KafkaBroker.kill` stop it; :meth:`KafkaBroker.start` after either restarts it on the
same port and data.

A broker made with ``proxy_port`` has a second listener, ``PROXIED``, that advertises that
port instead of its own: a client that bootstraps from :attr:`KafkaBroker.proxied_bootstrap`
is told to reach the broker (as coordinator and as partition leader) at ``proxy_port``, so
every connection it opens goes through whatever listens there -- the test kit's fault proxy
(:mod:`exactly.testing.nemesis.proxy`), forwarding to :attr:`KafkaBroker.proxied_port`.
Clients of :attr:`KafkaBroker.bootstrap` are not affected: Kafka answers each client with the
addresses of the listener it connected to.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from exactly.connectors.kafka.jars import BROKER_ENV, jars_dir, missing
from exactly.errors import ExactlyError
from exactly.retry import retry_call
from exactly.testing.ports import free_port
from exactly.testing.server_process import ServerProcess

BOOTSTRAP_ENV = "EXACTLY_KAFKA_BOOTSTRAP"


def broker_jars_dir() -> Path:
    """Directory of the Kafka broker jars; raises ConfigError naming the fix if missing."""
    directory = jars_dir("broker", BROKER_ENV)
    if not any(directory.glob("kafka_2.13-*.jar")):
        raise missing("Kafka broker jars (kafka_2.13 and its dependencies)", directory,
                      BROKER_ENV)
    return directory


class _NotReady(Exception):
    """The broker answers but is not serving yet."""


def quiet_conf(bootstrap: str) -> dict[str, str | int | float | bool]:
    """Client settings for helper clients that must not log connection retries."""
    return {"bootstrap.servers": bootstrap, "log_level": 2}



def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker(ServerProcess):
    """One KRaft broker+controller process with its own data directory.

    Parameters
    ----------
    workdir:
        Holds ``server.properties``, the log directory and ``broker.log``; a temp dir if None
        (removed by :meth:`close`).
    transaction_max_timeout_ms:
        The broker's ``transaction.max.timeout.ms`` (Kafka's default is 15 minutes).
    heap:
        JVM heap, e.g. ``"512m"``.
    proxy_port:
        The port the ``PROXIED`` listener advertises (a proxy listens there, forwarding to
        :attr:`proxied_port`); None: no such listener.
    """

    def __init__(self, workdir: str | Path | None = None, *, port: int | None = None,
                 transaction_max_timeout_ms: int = 900_000, heap: str = "512m",
                 extra: dict[str, str] | None = None,
                 proxy_port: int | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="exactly-kafka-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.controller_port = free_port()
        self.proxy_port = proxy_port
        #: where the ``PROXIED`` listener really listens (the proxy's upstream)
        self.proxied_port = free_port() if proxy_port is not None else None
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self.heap = heap
        self.extra = dict(extra or {})
        self.proc: subprocess.Popen | None = None
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """The bootstrap address whose clients reach the broker only through ``proxy_port``."""
        if self.proxy_port is None:
            raise ValueError("this broker has no proxied listener: make it with proxy_port")
        return f"127.0.0.1:{self.proxy_port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "broker.log"

    def _listeners(self) -> dict[str, str]:
        """``listeners``, ``advertised.listeners`` and their protocol map."""
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}",
                     f"CONTROLLER://127.0.0.1:{self.controller_port}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        if self.proxy_port is not None:
            listeners.append(f"PROXIED://127.0.0.1:{self.proxied_port}")
            advertised.append(f"PROXIED://127.0.0.1:{self.proxy_port}")
            protocols.append("PROXIED:PLAINTEXT")
        return {"listeners": ",".join(listeners),
                "advertised.listeners": ",".join(advertised),
                "listener.security.protocol.map": ",".join(protocols)}

    def _properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            **self._listeners(),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "2",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "transaction.max.timeout.ms": str(self.transaction_max_timeout_ms),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.flush.interval.messages": "1",  # survive SIGKILL of the broker: fsync each
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            **self.extra,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main: str, *args: str) -> list[str]:
        jars = broker_jars_dir()
        # a test broker lives minutes: C1 only spares the CPU the optimizing JIT would take
        return ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self._log4j()}",
                "-cp", f"{jars}/*", main, *args]

    def _log4j(self) -> Path:
        path = self.workdir / "log4j2.properties"
        if not path.exists():
            path.write_text(
                "rootLogger.level=WARN\nrootLogger.appenderRef.f.ref=F\n"
                "appender.f.type=File\nappender.f.name=F\n"
                f"appender.f.fileName={self.log_file}\n"
                "appender.f.layout.type=PatternLayout\n"
                "appender.f.layout.pattern=%d %p %c{1} %m%n\n"
                "logger.kafka.name=kafka\nlogger.kafka.level=INFO\n"
                "logger.server.name=org.apache.kafka.server\n"
                "logger.server.level=INFO\n")
        return path

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Format (first time only) and start the broker; returns once it serves requests."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        config = self.workdir / "server.properties"
        config.write_text(self._properties())
        if not self._formatted and not (self.workdir / "data" / "meta.properties").exists():
            fmt = subprocess.run(
                self._java("kafka.tools.StorageTool", "format",
                           f"--cluster-id={_cluster_id()}", "-c", str(config)),
                capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                raise ExactlyError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
        self._formatted = True
        out = open(self.workdir / "broker.out", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        out.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait until the broker answers metadata requests and can run transactions."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(quiet_conf(self.bootstrap))

        def probe() -> None:
            if self.proc is not None and self.proc.poll() is not None:
                raise ExactlyError(f"the Kafka broker exited with {self.proc.returncode}; see "
                                   f"{self.workdir / 'broker.out'} and {self.log_file}")
            if not admin.list_topics(timeout=2).brokers:
                raise _NotReady("no broker in the metadata yet")

        try:  # anything but ExactlyError means "not up yet"
            retry_call(probe, what="wait for the Kafka broker", seconds=timeout,
                       transient=lambda exc: not isinstance(exc, ExactlyError),
                       initial=0.2, maximum=0.5, level=logging.DEBUG)
        except ExactlyError:
            raise
        except Exception as exc:
            raise ExactlyError(f"the Kafka broker on {self.bootstrap} did not start within "
                               f"{timeout:.0f}s ({exc}); see {self.log_file}") from None

    def hanging_transactions(self, max_minutes: int = 0) -> list[str]:
        """What Kafka's own ``kafka-transactions.sh find-hanging`` reports for this broker
        (``org.apache.kafka.tools.TransactionsCommand``): the lines of transactions open
        longer than ``max_minutes`` (0: any open one) that the coordinator no longer knows
        as ongoing; empty when there is none. Raises ExactlyError when the tool fails."""
        found = subprocess.run(
            self._java("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server",
                       self.bootstrap, "find-hanging", "--broker-id", "1",
                       "--max-transaction-timeout", str(max_minutes)),
            capture_output=True, text=True, timeout=120)
        if found.returncode != 0:
            raise ExactlyError(f"kafka-transactions find-hanging failed:\n{found.stdout}"
                               f"{found.stderr}")
        lines = [line for line in found.stdout.splitlines() if line.strip()]
        # a header line (Topic Partition ProducerId ...) when anything was found
        return [line for line in lines if line.split()[0] != "Topic"]

    def transaction_states(self, prefix: str = "") -> dict[str, str]:
        """Each transactional id the coordinator knows (starting with ``prefix``) and its
        state (``Ongoing``, ``CompleteCommit``, ``CompleteAbort``, ``Empty``, ...), from
        ``kafka-transactions.sh list``. Raises ExactlyError when the tool fails."""
        found = subprocess.run(
            self._java("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server",
                       self.bootstrap, "list"), capture_output=True, text=True, timeout=120)
        if found.returncode != 0:
            raise ExactlyError(f"kafka-transactions list failed:\n{found.stdout}{found.stderr}")
        states = {}
        for line in found.stdout.splitlines()[1:]:  # after the header
            fields = line.split()
            if len(fields) >= 4 and fields[0].startswith(prefix):
                states[fields[0]] = fields[3]
        return states

    def create_topic(self, name: str, partitions: int = 2, **config: str) -> None:
        """Create ``name`` (no-op if it exists)."""
        create_topic(self.bootstrap, name, partitions, **config)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_topic(bootstrap: str, name: str, partitions: int = 2, **config: str) -> None:
    """Create topic ``name`` with replication factor 1 unless it exists; waits for it."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(quiet_conf(bootstrap))
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=dict(config))],
                                  operation_timeout=30)
    try:
        futures[name].result(60)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)


@contextlib.contextmanager
def broker_or_configured(workdir: Path | None = None) -> Iterator[str]:
    """Yield a bootstrap address: ``EXACTLY_KAFKA_BOOTSTRAP`` if set, else a broker started
    here (and stopped on exit)."""
    configured = os.environ.get(BOOTSTRAP_ENV)
    if configured:
        yield configured
        return
    broker = KafkaBroker(workdir)
    try:
        broker.start()
        yield broker.bootstrap
    finally:
        broker.close()


def consume_all(bootstrap: str, topic: str, *, isolation_level: str = "read_committed",
                timeout: float = 120.0) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of ``topic`` a consumer with ``isolation_level`` sees, from the start to the
    log end offsets at the time of the call, as (partition, offset, key, value): the
    auditor's reader, :func:`exactly.auditor.kafka.read_to_end`.

    ``read_committed`` returns records of committed transactions and non-transactional
    records (waiting up to ``timeout`` for open transactions to end); ``read_uncommitted``
    also returns records of aborted and open transactions.
    """
    from exactly.auditor.kafka import read_to_end

    return [(int(m.partition() or 0), int(m.offset() or 0), m.key(), m.value())
            for m in read_to_end(bootstrap, topic, isolation=isolation_level, timeout=timeout)]
