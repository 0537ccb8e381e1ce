"""Every option key exactly reads from ``writeStream``/``readStream`` options, and its
default, named once. Code on both ends (``start_query`` setting an option, a sink reading
it) refers to these names, never to the string.

Keys are grouped by who reads them; a ``DEFAULT_*`` beside a key is the value used when
the option is absent.
"""

from __future__ import annotations

from collections.abc import Iterable

# -- every exactly sink (exactly.protocol.contract.SinkSettings) -------------------------
MODE = "mode"  #: exactly_once | at_least_once
CHECKPOINT_LOCATION = "checkpointLocation"  #: Spark's checkpoint directory of the query
QUERY_NAME = "queryName"  #: Spark passes the query's name to sinks
LOG_DIR = "exactly.logDir"  #: commit log + lease of sinks without a directory of their own
CHECKPOINT_INTERVAL_MS = "exactly.checkpointIntervalMs"  #: the trigger interval, for checks
RETAIN_EPOCHS = "exactly.retainEpochs"
DEFAULT_RETAIN_EPOCHS = 100
LEASE_STALE_AFTER = "exactly.leaseStaleAfterSeconds"
DEFAULT_LEASE_STALE_AFTER_S = 600.0
#: the session's default of every exactly sink's LEASE_STALE_AFTER (``exactly run --ha``
#: sets it to its lease duration, so a failover is not fenced by the sinks' own leases)
SESSION_LEASE_STALE_AFTER = "spark.exactly.leaseStaleAfterSeconds"
FAULT = "exactly.fault"  #: POINT[@EPOCH], see exactly.protocol.faults
FAULT_MARKER = "exactly.faultMarker"  #: fire once across restarts (a marker file)
FAULT_ACTION = "exactly.faultAction"  #: kill (default) | pause:FILE

# -- files (exactly.files) ---------------------------------------------------------------
PATH = "path"
FORMAT = "format"
DEFAULT_FORMAT = "parquet"
COMPRESSION = "compression"
DEFAULT_COMPRESSION = "snappy"
MAX_FILES_PER_TRIGGER = "maxFilesPerTrigger"
DEAD_LETTER_PATH = "deadLetterPath"

# -- Delta Lake (exactly.delta) ------------------------------------------------------------
STORAGE_PREFIX = "storage."  #: storage.<KEY> -> deltalake's storage options (and the files')

# -- Apache Iceberg (exactly.iceberg) ------------------------------------------------------
WAREHOUSE = "warehouse"  #: where new tables go; the embedded SQLite catalog's directory
CATALOG_PREFIX = "catalog."  #: catalog.<KEY> -> pyiceberg's catalog properties
PARTITION_BY = "partitionBy"  #: the partition spec of a table the sink creates

# -- generator (exactly.datagen) and table source (exactly.postgres read side) ------------
ROWS_PER_SECOND = "rowsPerSecond"
TOTAL_ROWS = "totalRows"
NUM_PARTITIONS = "numPartitions"  #: read tasks per epoch
MAX_ROWS_PER_TRIGGER = "maxRowsPerTrigger"
KEYS = "keys"  #: distinct values of the generator's ``key`` column
SEED = "seed"
KEY_COLUMN = "keyColumn"  #: the table source's increasing key
DEFAULT_KEY_COLUMN = "id"
COLUMNS = "columns"  #: comma-separated columns the table source reads

# -- databases (exactly.postgres, exactly.wal, exactly.upsert) -----------------------------
DSN = "dsn"
DSN_ENV = "dsnEnv"
PASSWORD = "password"
TABLE = "table"
WRITE_MODE = "writeMode"  #: append | upsert (exactly.postgres)
DEFAULT_WRITE_MODE = "append"
KEY_COLUMNS = "keyColumns"  #: comma-separated
MARKER_TABLE = "markerTable"
DEFAULT_2PC_MARKER_TABLE = "exactly_2pc_markers"
DEFAULT_WAL_MARKER_TABLE = "exactly_wal_epochs"
PARTITIONS = "partitions"  #: write tasks per epoch, for the prepared-transaction check
RETRY_SECONDS = "retrySeconds"
DEFAULT_RETRY_SECONDS = 60.0
LOCK_TIMEOUT_MS = "lockTimeoutMs"
DEFAULT_LOCK_TIMEOUT_MS = 60_000
#: the longest wait for PostgreSQL's answer to a commit statement (PREPARE TRANSACTION,
#: COMMIT PREPARED, a load's or an upsert task's COMMIT) and to the driver's bookkeeping
COMMIT_TIMEOUT_MS = "commitTimeoutMs"
DEFAULT_COMMIT_TIMEOUT_MS = 30_000
EPOCH_COLUMN = "epochColumn"
DEFAULT_EPOCH_COLUMN = "exactly_epoch"
EPOCHS_TABLE = "epochsTable"
DEFAULT_EPOCHS_TABLE = "exactly_2pc_epochs"
VIEW_NAME = "viewName"  #: default <table>_committed

# -- Kafka (exactly.kafka) -----------------------------------------------------------------
KAFKA_PREFIX = "kafka."  #: kafka.<librdkafka option> goes to the producers
KAFKA_BOOTSTRAP = "kafka.bootstrap.servers"
TOPIC = "topic"
TRANSACTIONAL_ID_PREFIX = "transactionalIdPrefix"
KAFKA_TRANSACTION_TIMEOUT_MS = "kafka.transaction.timeout.ms"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
KAFKA_MARKER_TOPIC = "exactly.kafka.markerTopic"
KAFKA_PUBLISH_TIMEOUT_MS = "exactly.kafka.publishTimeoutMs"
DEFAULT_PUBLISH_TIMEOUT_MS = 300_000
KAFKA_CALL_TIMEOUT_MS = "exactly.kafka.callTimeoutMs"
DEFAULT_KAFKA_CALL_TIMEOUT_MS = 30_000
#: publish each epoch in this many shares, each by its own transactional producer
KAFKA_PUBLISH_SHARES = "exactly.kafka.publishShares"
MAX_KAFKA_PUBLISH_SHARES = 256
# read side (exactly.connectors.kafka.reader; SUBSCRIBE etc. below): defaults and extras
DEFAULT_STARTING_OFFSETS = "earliest"  #: STARTING_OFFSETS: earliest | latest | JSON
KAFKA_ISOLATION_LEVEL = "kafka.isolation.level"
DEFAULT_ISOLATION_LEVEL = "read_committed"
KAFKA_READ_TIMEOUT_MS = "exactly.kafka.readTimeoutMs"  #: give up without progress after this
DEFAULT_READ_TIMEOUT_MS = 120_000
KAFKA_GROUP_ID = "kafka.group.id"  #: the reader's consumer group: lag tools read it
#: true (default) | false: commit each completed epoch's end offsets to the consumer group
KAFKA_COMMIT_GROUP_OFFSETS = "exactly.kafka.commitGroupOffsets"
#: the longest the reader waits for the group's answer to one commit (then logs, goes on)
KAFKA_COMMIT_TIMEOUT_MS = "exactly.kafka.commitTimeoutMs"
DEFAULT_COMMIT_GROUP_TIMEOUT_MS = 5_000
#: the session's name of the job (``exactly run`` sets it to the job file's stem): the
#: default consumer group of ``read_exactly_kafka`` is ``exactly-<job name>``
SESSION_JOB_NAME = "spark.exactly.jobName"

# -- Kafka reader (exactly.kafka read side; kafka.<option> goes to the consumers) ----------
SUBSCRIBE = "subscribe"
STARTING_OFFSETS = "startingOffsets"
MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
FAIL_ON_DATA_LOSS = "failOnDataLoss"


# -- the option names each exactly format reads, checked by check_option_names -------------
#: names Spark itself passes to every data source (``load(path)``/``start(path)``, the
#: checkpoint and the query name): accepted by every format
SPARK_OPTIONS: tuple[str, ...] = (PATH, CHECKPOINT_LOCATION, QUERY_NAME)
#: names every exactly sink reads (SinkSettings, fault injection)
SINK_COMMON: tuple[str, ...] = (MODE, LOG_DIR, CHECKPOINT_INTERVAL_MS, RETAIN_EPOCHS,
                                LEASE_STALE_AFTER, FAULT, FAULT_MARKER, FAULT_ACTION)
_CONNECTION = (DSN, DSN_ENV, PASSWORD, TABLE)

#: read side: format -> option names its reader reads
SOURCE_OPTIONS: dict[str, tuple[str, ...]] = {
    "exactly.files": (PATH, FORMAT, MAX_FILES_PER_TRIGGER, DEAD_LETTER_PATH),
    "exactly.datagen": (ROWS_PER_SECOND, TOTAL_ROWS, NUM_PARTITIONS, MAX_ROWS_PER_TRIGGER,
                        KEYS, SEED),
    "exactly.postgres": (*_CONNECTION, KEY_COLUMN, MAX_ROWS_PER_TRIGGER, NUM_PARTITIONS,
                         COLUMNS),
    "exactly.kafka": (KAFKA_BOOTSTRAP, SUBSCRIBE, STARTING_OFFSETS, MAX_OFFSETS_PER_TRIGGER,
                      FAIL_ON_DATA_LOSS, KAFKA_READ_TIMEOUT_MS, KAFKA_COMMIT_GROUP_OFFSETS,
                      KAFKA_COMMIT_TIMEOUT_MS),
}
#: write side: format -> option names its sink reads
SINK_OPTIONS: dict[str, tuple[str, ...]] = {
    "exactly.files": (*SINK_COMMON, PATH, FORMAT, COMPRESSION),
    "exactly.postgres": (*SINK_COMMON, *_CONNECTION, WRITE_MODE, KEY_COLUMNS, MARKER_TABLE,
                         PARTITIONS, RETRY_SECONDS, LOCK_TIMEOUT_MS, EPOCH_COLUMN,
                         EPOCHS_TABLE, VIEW_NAME, COMMIT_TIMEOUT_MS),
    "exactly.wal": (*SINK_COMMON, *_CONNECTION, PATH, MARKER_TABLE, RETRY_SECONDS,
                    COMMIT_TIMEOUT_MS),
    "exactly.upsert": (*SINK_COMMON, *_CONNECTION, KEY_COLUMNS, EPOCH_COLUMN, LOCK_TIMEOUT_MS,
                       COMMIT_TIMEOUT_MS),
    "exactly.kafka": (*SINK_COMMON, KAFKA_BOOTSTRAP, TOPIC, TRANSACTIONAL_ID_PREFIX,
                      KAFKA_TRANSACTION_TIMEOUT_MS, KAFKA_MARKER_TOPIC,
                      KAFKA_PUBLISH_TIMEOUT_MS, KAFKA_CALL_TIMEOUT_MS, KAFKA_PUBLISH_SHARES),
    "exactly.delta": (*SINK_COMMON, PATH, COMPRESSION),
    "exactly.iceberg": (*SINK_COMMON, PATH, TABLE, WAREHOUSE, PARTITION_BY, COMPRESSION),
}
#: name prefixes a format passes on to a client library whole (``kafka.<client option>``)
SOURCE_PREFIXES: dict[str, tuple[str, ...]] = {"exactly.kafka": (KAFKA_PREFIX,)}
SINK_PREFIXES: dict[str, tuple[str, ...]] = {"exactly.kafka": (KAFKA_PREFIX,),
                                             "exactly.delta": (STORAGE_PREFIX,),
                                             "exactly.iceberg": (CATALOG_PREFIX,)}


def known_options(fmt: str, side: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """``(names, prefixes)`` that ``fmt`` reads on ``side`` (``"source"`` or ``"sink"``);
    ``None`` when ``fmt`` is not an exactly format on that side."""
    table, prefixes = ((SOURCE_OPTIONS, SOURCE_PREFIXES) if side == "source"
                       else (SINK_OPTIONS, SINK_PREFIXES))
    names = table.get(fmt.lower())
    if names is None:
        return None
    return names, prefixes.get(fmt.lower(), ())


def check_option_names(fmt: str, names: Iterable[str], side: str) -> None:
    """Refuse an option name ``fmt`` does not read on ``side`` (``"source"``/``"sink"``).

    Names compare case-insensitively, as Spark's options do. Raises
    :class:`~exactly.errors.ConfigError` (one line: format, option, the closest known name,
    every known name) for the first unknown name; formats that are not exactly's pass.
    """
    from difflib import get_close_matches

    from exactly.errors import ConfigError

    known = known_options(fmt, side)
    if known is None:
        return
    accepted, prefixes = known
    by_lower = {n.lower(): n for n in accepted}
    spark_own = {n.lower() for n in SPARK_OPTIONS}
    for name in names:
        low = str(name).lower()
        if (low in by_lower or low in spark_own
                or low.startswith(tuple(p.lower() for p in prefixes))):
            continue
        close = get_close_matches(low, list(by_lower), n=1, cutoff=0.6)
        hint = f"did you mean {by_lower[close[0]]!r}? " if close else ""
        listed = ", ".join(sorted(accepted, key=str.lower)
                           + [f"{p}*" for p in prefixes])
        raise ConfigError(f"{fmt.lower()} {side}: unknown option {name!r}; {hint}"
                          f"known options: {listed}")
