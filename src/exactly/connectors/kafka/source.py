"""Kafka as a replayable source: Spark's built-in Kafka connector with exactly's defaults
(:func:`read_kafka`), or exactly's own reader (:func:`read_exactly_kafka`), which also
honours exactly's admission control (min pause between epochs, epoch sizing).

Why the built-in source fits the exactly-once model: before epoch n runs, Spark writes the
end offset of every topic partition for n into the checkpoint's offset log (the barrier's
position). After a crash the epoch is read again from exactly those offsets, so the replay
sees the same records - the Kafka consumer offsets Flink keeps in operator state. Consumer
group offsets in Kafka are never used for positions, so nothing outside the checkpoint can
move them. What this helper adds are the defaults an exactly-once pipeline wants:

* ``kafka.isolation.level=read_committed`` - read only committed transactions, so an
  upstream transactional writer (e.g. ``exactly.kafka``) is read exactly once and its
  aborted attempts never enter the pipeline;
* ``startingOffsets`` (``earliest`` | ``latest`` | JSON per partition), used only on the
  first start: afterwards the checkpoint decides;
* ``maxOffsetsPerTrigger`` - bounded epochs (Flink's goal of bounded checkpoint time);
* ``failOnDataLoss=true`` - fail rather than skip records deleted by retention before they
  were read;
* ``fetchOffset.numRetries`` - ride out a broker restart while fetching end offsets.

The connector is not in PySpark: start the session with
``exactly.spark.session.spark_session(kafka=True)``, which asks Spark for it with
``spark.jars.packages`` (exact Maven coordinates for the installed PySpark, resolved from
Maven Central and cached by Spark; :mod:`exactly.connectors.kafka.jars`), or give another
builder / ``spark-submit`` the settings of :func:`spark_kafka_conf` (``exactly packages
--kafka``). ``EXACTLY_KAFKA_CONNECTOR_JARS`` names a directory of jars instead, for clusters
without Maven Central.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession

from exactly import options as opt
from exactly.connectors.kafka.jars import connector_conf
from exactly.errors import ConfigError

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
#: the fix named when a session has no Kafka connector
NO_CONNECTOR = ("this Spark session has no Kafka connector (format(\"kafka\")): create it "
                "with exactly.spark.session.spark_session(kafka=True), or give spark-submit "
                "or the session builder the settings `exactly packages --kafka` prints "
                "(spark.jars.packages); Spark reads them only when its JVM starts")


def spark_kafka_conf() -> dict[str, str]:
    """Spark settings that load the Kafka connector when the JVM starts: its Maven
    coordinates (``spark.jars.packages``), or the jars of ``EXACTLY_KAFKA_CONNECTOR_JARS``
    (``spark.jars``). The same as ``spark_session(kafka=True)`` applies; give it to the
    first session (a running JVM ignores it)."""
    return connector_conf()


def read_kafka(spark: SparkSession, bootstrap_servers: str, *,
               topics: str | list[str] | None = None, pattern: str | None = None,
               starting_offsets: str | Mapping[str, Mapping[str, int]] = "earliest",
               max_offsets_per_trigger: int | None = None,
               isolation_level: str = "read_committed",
               options: Mapping[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame over Kafka with columns ``key, value, topic, partition, offset,
    timestamp, timestampType`` (Spark's Kafka source schema).

    Give ``topics`` (a name or list) or ``pattern`` (a Java regex, ``subscribePattern``).
    ``starting_offsets`` is ``"earliest"``, ``"latest"`` or ``{topic: {partition: offset}}``
    (-2 = earliest, -1 = latest). Extra ``options`` go to the connector unchanged
    (``kafka.*`` ones to its consumers).

    Raises ConfigError for a wrong combination, or for a session without the connector,
    naming the fix.
    """
    if (topics is None) == (pattern is None):
        raise ConfigError("read_kafka: give exactly one of topics=... or pattern=...")
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError(f"read_kafka: isolation_level {isolation_level!r} is not one of "
                          f"{' | '.join(ISOLATION_LEVELS)}")
    if max_offsets_per_trigger is not None and max_offsets_per_trigger < 1:
        raise ConfigError("read_kafka: max_offsets_per_trigger must be at least 1")
    reader = (spark.readStream.format("kafka")
              .option(opt.KAFKA_BOOTSTRAP, bootstrap_servers)
              .option("kafka.isolation.level", isolation_level)
              .option("failOnDataLoss", "true")
              .option("fetchOffset.numRetries", "60")
              .option("fetchOffset.retryIntervalMs", "1000"))
    if topics is not None:
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise ConfigError("read_kafka: topics is empty")
        reader = reader.option("subscribe", ",".join(names))
    else:
        reader = reader.option("subscribePattern", pattern)
    if isinstance(starting_offsets, str):
        if starting_offsets not in ("earliest", "latest"):
            raise ConfigError("read_kafka: starting_offsets is 'earliest', 'latest' or "
                              "{topic: {partition: offset}}")
        reader = reader.option("startingOffsets", starting_offsets)
    else:
        reader = reader.option("startingOffsets", json.dumps(
            {t: {str(p): int(o) for p, o in parts.items()}
             for t, parts in starting_offsets.items()}))
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    try:
        return reader.load()
    except Exception as exc:  # pyspark's AnalysisException: [DATA_SOURCE_NOT_FOUND] ...
        if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source: kafka" in str(exc):
            raise ConfigError(f"read_kafka: {NO_CONNECTOR}") from exc
        raise


def read_exactly_kafka(spark: SparkSession, bootstrap_servers: str, topics: str | list[str],
                       starting_offsets: str | Mapping[str, Mapping[str, int]] = "earliest",
                       max_offsets_per_trigger: int | None = None,
                       options: Mapping[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame over Kafka from exactly's own reader (``format("exactly.kafka")``,
    :mod:`exactly.connectors.kafka.reader`), with the columns of :func:`read_kafka`.

    Unlike :func:`read_kafka` (Spark's JVM source, which exactly cannot gate), this reader
    honours exactly's admission control: the supervisor's min pause between epochs and epoch
    sizing. It needs no connector jars. ``kafka.isolation.level`` defaults to
    ``read_committed``; ``starting_offsets`` is ``"earliest"``, ``"latest"`` or
    ``{topic: {partition: offset}}`` (-2 = earliest, -1 = latest) and is used only on the
    first start; ``options`` adds reader options (``failOnDataLoss``, ``kafka.*``, ...).

    Completed epochs are committed to a consumer group, for lag tools: ``kafka.group.id`` when
    given, else ``exactly-<job name>`` when the session names its job (``exactly run`` sets
    ``spark.exactly.jobName`` to the job file's name), else ``exactly-<topics>``;
    ``exactly.kafka.commitGroupOffsets=false`` turns the commits off.

    Raises ConfigError, naming the fix, for a wrong or unknown option before Spark is asked.
    """
    from exactly.connectors.kafka.reader import KafkaReaderOptions, job_group

    names = [topics] if isinstance(topics, str) else list(topics)
    given: dict[str, str] = {opt.KAFKA_BOOTSTRAP: bootstrap_servers,
                             opt.SUBSCRIBE: ",".join(names)}
    if isinstance(starting_offsets, str):
        given[opt.STARTING_OFFSETS] = starting_offsets
    else:
        given[opt.STARTING_OFFSETS] = json.dumps(
            {t: {str(p): int(o) for p, o in parts.items()}
             for t, parts in starting_offsets.items()})
    if max_offsets_per_trigger is not None:
        given[opt.MAX_OFFSETS_PER_TRIGGER] = str(max_offsets_per_trigger)
    given.update({k: str(v) for k, v in (options or {}).items()})
    job = spark.conf.get(opt.SESSION_JOB_NAME, None)
    if job and opt.KAFKA_GROUP_ID.lower() not in {k.lower() for k in given}:
        given[opt.KAFKA_GROUP_ID] = job_group(job)
    KafkaReaderOptions.from_options(given)  # fail here, not when the query starts
    return spark.readStream.format("exactly.kafka").options(**given).load()
