"""Every option key exactly reads from ``writeStream``/``readStream`` options, and its
default, named once. Code on both ends (``start_query`` setting an option, a sink reading
it) refers to these names, never to the string.

Keys are grouped by who reads them; a ``DEFAULT_*`` beside a key is the value used when
the option is absent.
"""

from __future__ import annotations

# -- every exactly sink (exactly.protocol.contract.SinkSettings) -------------------------
MODE = "mode"  #: exactly_once | at_least_once
CHECKPOINT_LOCATION = "checkpointLocation"  #: Spark's checkpoint directory of the query
LOG_DIR = "exactly.logDir"  #: commit log + lease of sinks without a directory of their own
LOG_DIR_NAME = "exactly-sink"  #: start_query puts LOG_DIR here, under the checkpoint
CHECKPOINT_INTERVAL_MS = "exactly.checkpointIntervalMs"  #: the trigger interval, for checks
RETAIN_EPOCHS = "exactly.retainEpochs"
DEFAULT_RETAIN_EPOCHS = 100
LEASE_STALE_AFTER = "exactly.leaseStaleAfterSeconds"
DEFAULT_LEASE_STALE_AFTER_S = 600.0
FAULT = "exactly.fault"  #: POINT[@EPOCH], see exactly.protocol.faults
FAULT_MARKER = "exactly.faultMarker"  #: fire once across restarts (a marker file)

# -- files (exactly.files) ---------------------------------------------------------------
PATH = "path"
FORMAT = "format"
DEFAULT_FORMAT = "parquet"
COMPRESSION = "compression"
DEFAULT_COMPRESSION = "snappy"
MAX_FILES_PER_TRIGGER = "maxFilesPerTrigger"
DEAD_LETTER_PATH = "deadLetterPath"

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
