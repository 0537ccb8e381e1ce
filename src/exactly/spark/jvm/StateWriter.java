package dev.exactly.state;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.HashPartitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider$;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;

import scala.Option;
import scala.Tuple2;

/**
 * Writes key/value state rows into one state store of a Spark checkpoint, through Spark's own
 * state store providers, as a given version. Used by exactly's savepoint restore to rescale,
 * remap and switch the state backend of stores Spark's own rewriter cannot handle (the
 * HDFS-backed "hashmap" provider).
 *
 * Input rows: (partition_id int, key struct, value struct), as format("statestore") reads
 * them, with partition_id already computed for the target number of partitions.
 */
public final class StateWriter {
  private StateWriter() {}

  private static final String HDFS =
      "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider";

  /**
   * Write version {@code version} of store {@code storeName} of operator {@code operatorId}
   * under {@code stateRoot} (the checkpoint's "state" directory) for partitions 0..n-1.
   * Every partition gets a version, empty or not. Returns the number of rows written.
   */
  public static long write(Dataset<Row> rows, String stateRoot, long operatorId, String storeName,
                           long version, int numPartitions, Map<String, String> stateConf)
      throws IOException {
    StructType schema = rows.schema();
    StructType keySchema = (StructType) schema.apply("key").dataType();
    StructType valueSchema = (StructType) schema.apply("value").dataType();
    SQLConf sqlConf = new SQLConf();
    for (Map.Entry<String, String> e : stateConf.entrySet()) {
      sqlConf.setConfString(e.getKey(), e.getValue());
    }
    StateStoreConf storeConf = new StateStoreConf(sqlConf,
        scala.collection.immutable.Map$.MODULE$.<String, String>empty());
    String providerClass = sqlConf.getConfString(
        "spark.sql.streaming.stateStore.providerClass", HDFS);
    boolean hdfs = HDFS.equals(providerClass);
    Configuration hadoop = rows.sparkSession().sparkContext().hadoopConfiguration();
    SerializableConfiguration conf = new SerializableConfiguration(hadoop);
    int keyIndex = schema.fieldIndex("key");
    int valueIndex = schema.fieldIndex("value");
    int partIndex = schema.fieldIndex("partition_id");
    int keyFields = keySchema.size();
    int valueFields = valueSchema.size();
    String scratch = stateRoot + "/_exactly_scratch_" + UUID.randomUUID();

    JavaPairRDD<Integer, Tuple2<UnsafeRow, UnsafeRow>> pairs = rows.queryExecution().toRdd()
        .toJavaRDD()
        .mapPartitionsToPair(it -> {
          UnsafeProjection keyProj = UnsafeProjection.create(keySchema);
          UnsafeProjection valueProj = UnsafeProjection.create(valueSchema);
          List<Tuple2<Integer, Tuple2<UnsafeRow, UnsafeRow>>> out = new ArrayList<>();
          while (it.hasNext()) {
            InternalRow r = it.next();
            UnsafeRow k = keyProj.apply(r.getStruct(keyIndex, keyFields)).copy();
            UnsafeRow v = valueProj.apply(r.getStruct(valueIndex, valueFields)).copy();
            out.add(new Tuple2<>(r.getInt(partIndex), new Tuple2<>(k, v)));
          }
          return out.iterator();
        })
        .partitionBy(new HashPartitioner(numPartitions));

    long written = pairs.mapPartitionsWithIndex((partition, it) -> {
      Configuration hconf = conf.value();
      String root = hdfs ? scratch : stateRoot;
      StateStoreId id = new StateStoreId(root, operatorId, partition, storeName);
      StateStoreProvider provider = StateStoreProvider$.MODULE$.createAndInit(
          new StateStoreProviderId(id, UUID.randomUUID()), keySchema, valueSchema,
          new NoPrefixKeyStateEncoderSpec(keySchema), false, storeConf, hconf, false,
          Option.empty());
      long n = 0;
      try {
        // hashmap: version 0 is empty, committing writes 1.delta (puts only, the layout of
        // a snapshot), renamed below; RocksDB: start empty at version-1, commit writes version
        StateStore store = hdfs
            ? provider.getStore(0L, Option.empty(), false, false)
            : provider.getStore(version - 1, Option.empty(), false, true);
        while (it.hasNext()) {
          Tuple2<UnsafeRow, UnsafeRow> kv = it.next()._2();
          store.put(kv._1(), kv._2(), "default");
          n++;
        }
        store.commit();
      } finally {
        provider.close();
      }
      if (hdfs) {
        Path from = new Path(id.storeCheckpointLocation(), "1.delta");
        StateStoreId target = new StateStoreId(stateRoot, operatorId, partition, storeName);
        Path to = new Path(target.storeCheckpointLocation(), version + ".snapshot");
        FileSystem fs = to.getFileSystem(hconf);
        fs.mkdirs(to.getParent());
        if (!fs.rename(from, to)) {
          throw new IOException("could not move " + from + " to " + to);
        }
      }
      List<Long> count = new ArrayList<>();
      count.add(n);
      return count.iterator();
    }, true).reduce(Long::sum);
    if (hdfs) {
      Path s = new Path(scratch);
      s.getFileSystem(hadoop).delete(s, true);
    }
    return written;
  }
}
