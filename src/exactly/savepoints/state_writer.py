"""Writing state rows into a checkpoint through Spark's own state store providers.

Spark can read any operator's state (``format("statestore")``) but writes it back only for
RocksDB and only in place (its offline repartition). Restoring a savepoint into another
number of partitions or another state backend needs a writer for both providers; it is the
small Java class ``exactly/spark/jvm/StateWriter.java`` (prebuilt in the wheel, or compiled
against the installed PySpark's jars on first use and cached; see
:mod:`exactly.spark.state_writer_jar`), which hands every row to Spark's provider
(``put`` and ``commit``), so the files are Spark's own format:

* RocksDB: an empty store at version N, the rows, ``commit`` -> version N+1, a snapshot
  (``N+1.zip``) with or without changelog checkpointing (Spark snapshots a store it loaded
  empty), so the version loads without any earlier one;
* hashmap (HDFS-backed): the provider's version 0 plus the rows, ``commit`` -> ``1.delta``
  holding puts only, which is byte for byte the layout of a snapshot, renamed to
  ``<N+1>.snapshot``.

Rows go to partition ``pmod(hash(key fields), n)``: Spark's hash partitioning of a stateful
operator's keys (Murmur3, seed 42), so every key lands where the restarted query looks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactly.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

def _jvm(spark: SparkSession) -> Any:
    jvm = spark._jvm
    if jvm is None:
        raise ConfigError("the state writer needs a classic (non-Connect) Spark session")
    return jvm


def writer_class(spark: SparkSession) -> Any:
    """The JVM class, or a ConfigError naming the fix when the session lacks it."""
    from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

    cls = _jvm(spark).dev.exactly.state.StateWriter
    if not isinstance(cls, JavaClass):
        raise ConfigError(
            "this Spark session lacks exactly's state writer (needed to rescale or switch the "
            "state backend of a savepoint): start the session with exactly.spark_session() "
            "or add the jar `python -m exactly.spark.state_writer_jar` prints to spark.jars "
            "(spark-submit --jars)")
    return cls


def with_partitions(state: DataFrame, partitions: int) -> DataFrame:
    """``state`` (columns key, value as ``format("statestore")`` reads them) with the
    partition Spark's hash partitioning gives each key for ``partitions`` partitions."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    key_type = state.schema["key"].dataType
    assert isinstance(key_type, StructType)
    fields = [F.col(f"key.`{f.name}`") for f in key_type.fields]
    partition = F.pmod(F.hash(*fields), F.lit(partitions)).cast("int")
    return state.select(partition.alias("partition_id"), "key", "value")


def write_store(spark: SparkSession, rows: DataFrame, state_root: str, operator_id: int,
                store_name: str, version: int, partitions: int,
                state_conf: dict[str, str]) -> int:
    """Write ``rows`` (partition_id, key, value) as ``version`` of one store; every one of
    the ``partitions`` partitions gets that version, empty or not. Returns the row count.
    ``state_conf`` are the SQL settings of the target checkpoint's offsets entry (provider,
    compression, format versions)."""
    cls = writer_class(spark)
    conf = _jvm(spark).java.util.HashMap()
    for key, value in state_conf.items():
        conf.put(key, value)
    return int(cls.write(rows._jdf, state_root, operator_id, store_name, version, partitions,
                         conf))


def empty_rows(spark: SparkSession) -> DataFrame:
    """No rows, for a store that starts empty (an operator new in a restored job): the
    schemas do not matter for a store without rows."""
    return spark.createDataFrame(
        [], "partition_id int, key struct<k: int>, value struct<v: int>")
