"""Start a streaming query under a :class:`~exactly.config.CheckpointConfig`.

``start_query`` is the one place where the checkpoint configuration meets Spark: it refuses
non-replayable sources in exactly-once mode, places the checkpoint, sets the state backend,
refuses a state backend that differs from the one a checkpoint was written with, picks the
trigger and tells the sink its delivery mode.

Before Spark starts it also fails, in one line naming the fix, on what would otherwise
surface only after the first epoch: an option name no exactly source or sink of the query
reads, a sink setting its sink refuses (:func:`exactly.spark.formats.check_sink`), output
mode ``update`` into an append-only sink, and a sink log of another query under a
``memory`` checkpoint.

Where the commit runs: an exactly sink started here always runs the same sink and protocol
through ``foreachBatch`` (:class:`~exactly.spark.foreach_batch.TwoPhaseForeachBatch`), in
every output mode: the tasks write in Python workers that the daemon forks with exactly
already imported, and the commit runs in the driver's own Python process. The sink's Python
data source writer is what PySpark's own ``df.writeStream.format("exactly.files")...start()``
gives, without ``start_query``: Spark starts a write-planning and a commit process of their
own for the query's first epoch, whose ``addBatch`` measured 4.0-4.6 s there against
2.1-2.3 s through ``foreachBatch`` and 2.1-2.2 s for Spark's Parquet sink
(docs/performance.md). Both paths run the same protocol with the same guarantee.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from exactly import options as opt
from exactly.checkpoint import layout
from exactly.checkpoint.location import (
    checkpoint_exists,
    checkpoint_uri,
    delete_checkpoint,
    is_remote,
    local_checkpoint,
)
from exactly.checkpoint.store import open_log_store
from exactly.config import CheckpointConfig, ExternalizedCleanup, Mode, StateBackend
from exactly.errors import ConfigError, OwnershipError, SourceNotReplayableError
from exactly.logs import log_event
from exactly.procs import driver_identity
from exactly.protocol.epoch_identity import check_checkpoint_against_log
from exactly.protocol.lease import Lease
from exactly.spark.connect import is_connect, refuse, streaming_sources
from exactly.spark.formats import check_output_mode, check_sink
from exactly.spark.s3a import require_s3a

logger = logging.getLogger("exactly.ops.query")

#: sources whose input cannot be read again from positions in the offset log
NON_REPLAYABLE_SOURCES = ("socket",)
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
OUTPUT_MODES = ("append", "update", "complete")


@dataclass
class ExactlyQuery:
    """A running query and where its checkpoint lives."""

    query: StreamingQuery
    checkpoint_location: str
    config: CheckpointConfig

    def await_termination(self, timeout: float | None = None) -> bool | None:
        """Wait for the query to end (at most ``timeout`` seconds); re-raises its failure.
        When it ended, its end is in the checkpoint's history too, and its run's sink leases
        are released (:meth:`halt`)."""
        try:
            # pyspark's stub says int, but it takes seconds as any number
            return self.query.awaitTermination(cast(int | None, timeout))
        finally:
            if not self.query.isActive:
                self.run_ended()
                self._history_ended()

    def stop(self) -> None:
        """Stop the query; the checkpoint stays, so a restart resumes where it stopped."""
        self.halt()
        self._history_ended()

    def halt(self) -> None:
        """Stop the query and end its run: once this returns, no heartbeat renews the run's
        sink leases any more, and they are released for the next run
        (:func:`exactly.spark.run_end.end_query_run`). The checkpoint stays."""
        self.query.stop()
        self.run_ended()

    def run_ended(self) -> None:
        """The query is no longer active: stop its run's lease heartbeats and release its
        sink leases (idempotent; a listener does the same when Spark reports the end)."""
        from exactly.spark.run_end import end_query_run

        end_query_run(str(self.query.runId), self.checkpoint_location)

    def cancel(self) -> None:
        """Stop the query and apply ``externalized_cleanup`` to its checkpoint."""
        self.halt()
        self._history_ended()
        if self.config.externalized_cleanup is ExternalizedCleanup.DELETE_ON_CANCELLATION:
            delete_checkpoint(self.checkpoint_location)

    def _history_ended(self) -> None:
        """Once the query is no longer active, wait (briefly) until the recorder wrote its
        end: nothing is appended to the checkpoint after this returns."""
        if not self.query.isActive:
            from exactly.monitoring.recorder import wait_ended

            wait_ended(str(self.query.runId), timeout=10.0)


def source_names(df: DataFrame) -> list[str]:
    """Names of the streaming sources a DataFrame reads (``socket``, ``kafka``, ...), in the
    order of Spark's offset log."""
    from exactly.savepoints.operators import job_sources

    return [name for name, _ in job_sources(df)]


def source_options(df: DataFrame) -> list[tuple[str, dict[str, str]]]:
    """``(format, options)`` of every DataSource V2 streaming source a DataFrame reads (the
    Python data sources among them), options as the user spelt them."""
    if is_connect(df):
        return streaming_sources(df)
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    found = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if leaf.getClass().getSimpleName() != "StreamingRelationV2":
            continue
        extra = leaf.extraOptions().asCaseSensitiveMap()
        found.append((str(leaf.sourceName()), {str(k): str(v) for k, v in extra.items()}))
    return found


def check_source_options(df: DataFrame) -> None:
    """Refuse an option name that an exactly source of ``df`` does not read (a misspelt
    ``maxFilesPerTrigger`` would otherwise be ignored): ConfigError naming the closest
    known name."""
    for fmt, options in source_options(df):
        opt.check_option_names(fmt, options, "source")


def check_replayable(df: DataFrame, mode: Mode, accept_at_most_once: bool) -> None:
    """Refuse non-replayable sources in exactly_once mode unless at-most-once is accepted."""
    bad = [n for n in source_names(df) if n.lower() in NON_REPLAYABLE_SOURCES]
    if not bad or mode is not Mode.EXACTLY_ONCE:
        return
    if not accept_at_most_once:
        raise SourceNotReplayableError(
            f"source(s) {', '.join(bad)} cannot replay an epoch after a crash, so this query "
            "cannot be exactly-once. Read from a replayable source (files, Kafka, a table, "
            "exactly.datagen), or pass accept_at_most_once=True to run with records lost "
            "on failure."
        )
    log_event(logger, "at_most_once_accepted", logging.WARNING, sources=bad,
              detail="records read since the last checkpoint are lost on a crash")


def checkpoint_location(config: CheckpointConfig) -> str:
    """The checkpoint directory: a temp dir for ``memory`` (removed at exit), else storage."""
    if config.is_memory_storage:
        directory = tempfile.mkdtemp(prefix="exactly-checkpoint-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        return directory
    if is_remote(config.storage):
        return checkpoint_uri(config.storage)  # s3:// is s3a:// to Spark
    return config.storage


def pinned_state_backend(location: str) -> StateBackend | None:
    """The state backend the checkpoint at ``location`` was started with (Spark pins it in
    its offsets log); None for a new checkpoint or one not on a local file system."""
    from exactly.checkpoint.spark_files import batch_numbers, read_offsets

    epochs = batch_numbers(location, "offsets")
    entry = read_offsets(location, epochs[-1]) if epochs else None
    pinned = entry.metadata.get("conf", {}).get(PROVIDER_KEY) if entry else None
    return StateBackend.of_provider(pinned) if isinstance(pinned, str) and pinned else None


def start_query(df: DataFrame, *, sink_format: str, checkpoint: CheckpointConfig,
                path: str | None = None, options: dict[str, str] | None = None,
                query_name: str | None = None, available_now: bool = False,
                output_mode: str = "append",
                accept_at_most_once: bool = False) -> ExactlyQuery:
    """Start ``df`` into an exactly sink under ``checkpoint``.

    ``start_query`` applies the query-level settings of ``checkpoint`` (interval, mode,
    storage, state backend, incremental, history, externalized cleanup on
    :meth:`ExactlyQuery.cancel`). The policies that act between epochs (``timeout``,
    ``tolerable_failed_checkpoints``, ``min_pause_between_checkpoints``, epoch sizing) need
    exactly's supervisor: a config that sets any of them is refused with ConfigError before
    Spark starts, naming ``exactly run`` and ``run_job``, which apply them.

    ``available_now=True`` processes what the sources hold at start, in epochs sized by the
    sources' limits, then stops (a bounded run whose last epoch is checkpointed).

    An exactly sink commits through ``foreachBatch`` in the driver process, in every output
    mode (``append``, ``complete``, and ``update``, which Python data source sinks refuse);
    another format is started as Spark's own sink. ``update`` needs a sink that changes a
    key's row in place (``exactly.postgres`` with ``writeMode=upsert``, ``exactly.upsert``)
    or a changelog (``exactly.kafka``).

    The state backend is a session setting in Spark: it applies to queries started later in
    the same session too, and a checkpoint keeps the backend it was first started with.

    Raises, before Spark starts: ConfigError (unknown option names of an exactly source or
    sink, a sink setting its sink refuses, a wrong output mode, a checkpoint of another
    state backend), SourceNotReplayableError, CorruptCheckpointFileError, FencedError,
    ReplannedEpochError, and OwnershipError when a ``memory`` checkpoint (a new query on
    every run) meets a sink log of another query.
    """
    policies = checkpoint.supervisor_policies()
    if policies:
        raise ConfigError(
            f"start_query does not apply {', '.join(policies)}: these checkpoint policies act "
            "between epochs and need exactly's supervisor. Run the job with `exactly run "
            "JOB_FILE --checkpoint DIR` or exactly.run_job(build, checkpoint=DIR), which "
            "apply them, or remove them from the CheckpointConfig given to start_query")
    return start_supervised_query(
        df, sink_format=sink_format, checkpoint=checkpoint, path=path, options=options,
        query_name=query_name, available_now=available_now, output_mode=output_mode,
        accept_at_most_once=accept_at_most_once)


def start_supervised_query(df: DataFrame, *, sink_format: str, checkpoint: CheckpointConfig,
                           path: str | None = None, options: dict[str, str] | None = None,
                           query_name: str | None = None, available_now: bool = False,
                           output_mode: str = "append",
                           accept_at_most_once: bool = False) -> ExactlyQuery:
    """:func:`start_query` for a caller that applies the supervisor policies itself
    (:mod:`exactly.ops.supervisor`): the same checks and start, policies accepted."""
    if not df.isStreaming:
        raise ConfigError("start_query needs a streaming DataFrame (spark.readStream...)")
    mode_name = output_mode.lower()
    if mode_name not in OUTPUT_MODES:
        raise ConfigError(f"start_query: output_mode={output_mode!r} is not one of "
                          f"{' | '.join(OUTPUT_MODES)}")
    check_replayable(df, checkpoint.mode, accept_at_most_once)
    check_source_options(df)
    check_output_mode(sink_format, mode_name, options)
    location = checkpoint_location(checkpoint)
    connect = is_connect(df)
    if connect:
        refuse_on_connect(location)
    else:
        require_s3a(df.sparkSession, location)
    options = with_sink_log_dir(location, options)
    local = local_checkpoint(location)
    set_checkpoint_interval(options, checkpoint)
    # what the sink receives: the options given override the two start_query sets
    sink_options = {opt.CHECKPOINT_LOCATION: location, opt.MODE: checkpoint.mode.value,
                    **options}
    session_stale = df.sparkSession.conf.get(opt.SESSION_LEASE_STALE_AFTER, None)
    if session_stale:  # the session's default (exactly run --ha: its lease duration)
        sink_options.setdefault(opt.LEASE_STALE_AFTER, session_stale)
    built = check_sink(sink_format, path, sink_options, df.schema)
    # the built sink knows where its commit log is (None for a sink that is not exactly's)
    log_dir = built.sink.log_directory if built is not None else None
    preflight_checkpoint(location, log_dir)
    # the backend follows the checkpoint's own (Spark silently keeps it): say so when it differs
    checkpoint = checkpoint.for_checkpoint(pinned_state_backend(location), location)
    spark = df.sparkSession
    for key, value in checkpoint.spark_conf().items():
        spark.conf.set(key, value)
    if checkpoint.mode is Mode.EXACTLY_ONCE and checkpoint.is_memory_storage:
        warn_memory_storage(sink_format, location)
    if checkpoint.mode is Mode.EXACTLY_ONCE and log_dir is not None and (
            isinstance(log_dir, str) or log_dir.is_dir()):
        # a second live instance fails on fencing, before anything about its checkpoint
        stale = (built.settings.lease_stale_after if built
                 else opt.DEFAULT_LEASE_STALE_AFTER_S)
        lease = Lease(log_dir, stale_after=stale)
        if connect:
            pass  # the lease's holder is the server's process, whose identity this client
            # does not know: the sink's commit takes the lease there, fenced as always
        elif session_stale:  # exactly run --ha: the previous leader's driver may hold it
            lease.wait_free(driver_identity(), timeout=2 * stale)  # until it goes stale
        if not connect:
            lease.refuse_if_held(driver_identity())
        if checkpoint.is_memory_storage and isinstance(log_dir, Path):
            refuse_memory_checkpoint_on_owned_log(log_dir)
        # a re-planned epoch fails here, on a local checkpoint or on S3
        check_checkpoint_against_log(str(local) if local is not None else location, log_dir)
    if not connect:
        from exactly.spark.run_end import watch_run_ends

        watch_run_ends(spark)  # a run's end releases its sink leases, however it ends
    writer: Any
    if built is not None:
        from exactly.spark.foreach_batch import TwoPhaseForeachBatch

        writer = (df.writeStream.outputMode(mode_name)
                  .option(opt.CHECKPOINT_LOCATION, location)
                  .foreachBatch(TwoPhaseForeachBatch(built.sink, built.settings, built.fault)))
    else:
        writer = (df.writeStream.format(sink_format).outputMode(mode_name)
                  .option(opt.CHECKPOINT_LOCATION, location)
                  .option(opt.MODE, checkpoint.mode.value)
                  .options(**options))
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(checkpoint.interval_seconds * 1000)} "
                                               "milliseconds")
    query = writer.start(path) if path and built is None else writer.start()
    log_event(logger, "query_started", query_id=str(query.id), run_id=str(query.runId),
              checkpoint=location, mode=checkpoint.mode.value, output_mode=mode_name)
    if checkpoint.history:
        record_history(spark, query, location, checkpoint, sink_format, path, log_dir)
    return ExactlyQuery(query, location, checkpoint)


def refuse_on_connect(location: str) -> None:
    """What start_query cannot do on a Spark Connect session, refused before Spark starts."""
    if is_remote(location):
        raise refuse(f"a checkpoint on object storage ({location})",
                     "Spark's S3A must be on the Connect server's class path and exactly's "
                     "commit, lease and history read the checkpoint from the server's "
                     "foreachBatch process with settings the client cannot hand it",
                     "Use a checkpoint directory the server and this client share (a local "
                     "or mounted file system), or a classic session for s3:// checkpoints")


def set_checkpoint_interval(options: dict[str, str], checkpoint: CheckpointConfig) -> None:
    """Tell the sink the trigger interval (option ``exactly.checkpointIntervalMs``, for its
    start checks such as Kafka's transaction timeout) from ``checkpoint.interval``. A value
    the caller gave that differs is refused: the checks would judge a stale interval."""
    interval_ms = str(int(checkpoint.interval_seconds * 1000))
    for key in [k for k in options if k.lower() == opt.CHECKPOINT_INTERVAL_MS.lower()]:
        given = options.pop(key)
        try:
            same = int(float(given)) == int(interval_ms)
        except ValueError:
            same = False
        if not same:
            raise ConfigError(
                f"option {key}={given!r} disagrees with CheckpointConfig(interval="
                f"{checkpoint.interval!r}) ({interval_ms} ms); drop the option: start_query "
                "sets it from the checkpoint's interval")
    options[opt.CHECKPOINT_INTERVAL_MS] = interval_ms


def record_history(spark: Any, query: StreamingQuery, location: str,
                   checkpoint: CheckpointConfig, sink_format: str, path: str | None,
                   log_dir: Path | str | None) -> None:
    """Start recording ``query``'s epochs in its checkpoint's history
    (:mod:`exactly.monitoring.recorder`), with a ``run`` record of this start."""
    from exactly.checkpoint.spark_files import batch_numbers
    from exactly.monitoring import recorder
    from exactly.monitoring.records import config_summary
    from exactly.version import __version__

    committed = batch_numbers(location, "commits")
    run = {"kind": "run", "at": time.time(), "query_id": str(query.id),
           "spark_run_id": str(query.runId), "name": query.name,
           "resumed_after_epoch": committed[-1] if committed else None,
           "config": config_summary(checkpoint),
           "sink": {"format": sink_format, "path": path,
                    "log_dir": str(log_dir) if log_dir else None},
           "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
           "versions": {"spark": spark.version, "exactly": __version__}}
    recorder.watch(spark, query, checkpoint=location, run_record=run,
                   sink_log=log_dir,
                   backend=checkpoint.backend.value)


def warn_memory_storage(sink_format: str, location: str) -> None:
    """Log (WARNING) that a ``memory`` checkpoint cannot resume exactly once after a restart."""
    log_event(logger, "memory_checkpoint", logging.WARNING, storage="memory",
              checkpoint=location, sink=sink_format,
              detail="the checkpoint is a temporary directory removed at exit: a restart is "
                     "a new query, which cannot resume this sink's output exactly once",
              fix="give CheckpointConfig(storage=DIR), the same DIR on every run")


def refuse_memory_checkpoint_on_owned_log(log_dir: Path) -> None:
    """A ``memory`` checkpoint is a new query on every run: refuse a sink log (``query.json``)
    that already belongs to a query, before Spark runs an epoch into it."""
    from exactly.fsutil import read_json
    from exactly.protocol.repairs import query_repair

    owner = read_json(log_dir / "query.json", repair=query_repair(log_dir))
    if isinstance(owner, dict) and owner.get("query_id"):
        raise OwnershipError(
            f"the sink log {log_dir} belongs to streaming query {owner['query_id']}, but this "
            "query's checkpoint is in memory storage (CheckpointConfig(storage='memory')), so "
            "every run is a new query that cannot resume it; give CheckpointConfig(storage=DIR) "
            "with the same DIR on every run, or write to a fresh sink path")


def with_sink_log_dir(location: str, options: Mapping[str, str] | None) -> dict[str, str]:
    """``options`` plus the default commit-log directory of sinks without one of their own
    (``exactly.logDir`` = ``<checkpoint>/exactly-sink`` for a local or ``s3a://``
    checkpoint), unless the options name one."""
    local = local_checkpoint(location)
    return layout.with_sink_log_dir(str(local) if local is not None else location, options)


def preflight_checkpoint(location: str, log_dir: Path | str | None) -> None:
    """Before Spark reads an existing checkpoint (local or on S3), fail on every file Spark
    would fail on -- a torn ``metadata``, ``offsets/N`` or ``commits/N``, a checksum
    mismatch, a stray ``.N.crc`` -- with :class:`~exactly.errors.CorruptCheckpointFileError`
    naming the file and the safe repair (Spark's own errors name none, or mislead). A
    damaged ``query.json`` of the sink's commit log fails here too, with its repair."""
    from exactly.checkpoint.spark_files import preflight
    from exactly.fsutil import parse_json
    from exactly.protocol.repairs import query_repair

    if not checkpoint_exists(location):
        return
    owner = None
    if log_dir is not None:
        store = open_log_store(log_dir)
        data = store.read("query.json")
        owner = (parse_json(data, store.describe("query.json"), query_repair(log_dir))
                 if data is not None else None)
    sink_query_id = owner.get("query_id") if isinstance(owner, dict) else None
    preflight(location, sink_query_id)
