"""Consumer-group lag of exactly's Kafka reader (``format("exactly.kafka")``), as users' tools
see it: the reader commits each completed epoch's end offsets to the job's consumer group
(exactly.connectors.kafka.group_offsets), and ``kafka-consumer-groups.sh --describe`` run from
the broker's own jars shows that group with lag 0 on every partition once the input drains.
A commit the broker refuses (a live member in the group) is logged, never fatal, and the
epochs still land exactly once. Real broker, real Spark (the session fixture), real tool."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable
from test_kafka_reader import WAIT_S, assert_exactly, produce, rows, wait_until

from exactly import options as opt
from exactly.connectors.kafka.reader import KafkaStreamReader
from exactly.connectors.kafka.source import read_exactly_kafka
from exactly.ops.job import load_job_file
from exactly.testing.kafka_broker import broker_jars_dir
from exactly.testing.supervised import SupervisedRun

pytestmark = pytest.mark.server

#: kafka-consumer-groups.sh's class (Kafka 4.x, jar kafka-tools)
CONSUMER_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


# -- the lag tool ---------------------------------------------------------------------------
def describe_group(bootstrap: str, group: str) -> dict[tuple[str, int], dict[str, str]]:
    """``kafka-consumer-groups.sh --describe --group GROUP`` from the broker's jars, parsed:
    ``{(topic, partition): {"CURRENT-OFFSET": ..., "LOG-END-OFFSET": ..., "LAG": ...}}``."""
    jars = broker_jars_dir()
    if not any(jars.glob("kafka-tools-*.jar")):
        pytest.fail(f"the broker jars in {jars} lack kafka-tools (kafka-consumer-groups.sh); "
                    "run scripts/setup.sh kafka", pytrace=False)
    done = subprocess.run(
        ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{jars}/*",
         CONSUMER_GROUPS_TOOL, "--bootstrap-server", bootstrap, "--describe", "--group", group],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next((cols for cols in lines if cols[:2] == ["GROUP", "TOPIC"]), None)
    if header is None:  # e.g. "Consumer group 'x' does not exist."
        return {}
    rows = [dict(zip(header, cols, strict=False)) for cols in lines
            if cols[0] == group and cols != header]
    return {(r["TOPIC"], int(r["PARTITION"])): r for r in rows}


def wait_for_lag_zero(bootstrap: str, group: str, topic: str, ends: dict[int, int]) -> None:
    """Wait until the group's offsets reach ``ends`` (asked with an admin client, cheaply),
    then check that the tool shows ``group`` at the log end, lag 0, on every partition."""
    try:
        wait_until(lambda: group_offsets(bootstrap, group, topic) == ends,
                   f"group {group} at the log end {ends}")
    finally:
        shown = describe_group(bootstrap, group)
    for p, end in ends.items():
        row = shown.get((topic, p))
        assert row is not None, f"kafka-consumer-groups shows no {topic}[{p}]: {shown}"
        assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"]) == (
            str(end), str(end), "0"), shown


def log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lag-probe"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in (0, 1)}
    finally:
        consumer.close()


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (partitions without one left out)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0),
                                                   TopicPartition(topic, 1)])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def live_member(bootstrap: str, group: str, topic: str) -> Consumer:
    """A consumer that joined ``group`` and stays in it: the broker then refuses commits to
    the group from outside it (UNKNOWN_MEMBER_ID)."""
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "enable.auto.commit": False, "auto.offset.reset": "latest"})
    member.subscribe([topic])
    wait_until(lambda: bool(member.poll(0.2) or member.assignment()), "the member's join")
    return member


def run_drained(spark, bootstrap: str, topic: str, out: Path, checkpoint: Path, *,
                max_offsets: int, options: dict[str, str] | None = None,
                available_now: bool = True):
    events = read_exactly_kafka(spark, bootstrap, topic, max_offsets_per_trigger=max_offsets,
                                options=options)
    writer = (events.writeStream.format("exactly.files").option(opt.PATH, str(out))
              .option(opt.CHECKPOINT_LOCATION, str(checkpoint)))
    writer = (writer.trigger(availableNow=True) if available_now
              else writer.trigger(processingTime="200 milliseconds"))
    return writer.start()


# -- through Spark ------------------------------------------------------------------------
def test_lag_tool_shows_the_jobs_group_at_lag_zero_on_every_partition_after_the_input_drains(
        spark, broker, topic, tmp_path):
    bootstrap = broker.bootstrap
    produce(bootstrap, topic, range(40))  # input up front, 20 records per partition
    job = f"orders-{topic}"
    spark.conf.set(opt.SESSION_JOB_NAME, job)  # what `exactly run` sets for its job file
    try:
        query = run_drained(spark, bootstrap, topic, tmp_path / "out", tmp_path / "ck",
                            max_offsets=15, available_now=False)
    finally:
        spark.conf.unset(opt.SESSION_JOB_NAME)
    try:
        group = f"exactly-{job}"  # the documented default: exactly-<job name>
        wait_until(lambda: len(rows(tmp_path / "out")) == 40, "the output")
        assert_exactly(tmp_path / "out", range(40))
        ends = log_ends(bootstrap, topic)
        assert ends == {0: 20, 1: 20}
        # the last epoch's end reaches the group at the next trigger, not one epoch later
        wait_for_lag_zero(bootstrap, group, topic, ends)
        assert query.exception() is None
        assert sum(int(p["numInputRows"]) for p in query.recentProgress) == 40
        assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # 15+15+10
    finally:
        query.stop()


def test_commits_refused_by_the_broker_are_not_fatal_and_the_epochs_land_exactly_once(
        spark, broker, topic, tmp_path):
    bootstrap = broker.bootstrap
    group = f"busy-{topic}"
    produce(bootstrap, topic, range(30))
    member = live_member(bootstrap, group, topic)
    try:
        query = run_drained(spark, bootstrap, topic, tmp_path / "out", tmp_path / "ck",
                            max_offsets=10, options={opt.KAFKA_GROUP_ID: group})
        assert query.awaitTermination(WAIT_S), "the availableNow query did not stop by itself"
        assert query.exception() is None
        assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3
        assert_exactly(tmp_path / "out", range(30))
        assert group_offsets(bootstrap, group, topic) == {}  # every commit was refused
    finally:
        member.close()
    # once the group is free, the next run commits the end of the last completed epoch
    query = run_drained(spark, bootstrap, topic, tmp_path / "out", tmp_path / "ck",
                        max_offsets=10, options={opt.KAFKA_GROUP_ID: group})
    assert query.awaitTermination(WAIT_S)
    assert query.exception() is None
    assert_exactly(tmp_path / "out", range(30))
    assert group_offsets(bootstrap, group, topic) == log_ends(bootstrap, topic) == {0: 15,
                                                                                     1: 15}


def test_the_group_never_holds_an_epoch_before_spark_has_committed_it(spark, broker, topic,
                                                                       tmp_path):
    bootstrap = broker.bootstrap
    group = f"held-{topic}"
    produce(bootstrap, topic, range(30))
    hold, out = tmp_path / "hold", tmp_path / "out"
    hold.touch()
    events = read_exactly_kafka(spark, bootstrap, topic, max_offsets_per_trigger=10,
                                options={opt.KAFKA_GROUP_ID: group})
    query = (events.writeStream.format("exactly.files").option(opt.PATH, str(out))
             .option(opt.CHECKPOINT_LOCATION, str(tmp_path / "ck"))
             # epoch 1 stops after its output is committed, before Spark's commit log
             .option(opt.FAULT, "after_complete@1").option(opt.FAULT_ACTION, f"pause:{hold}")
             .option(opt.FAULT_MARKER, str(tmp_path / "fired"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: len(rows(out)) == 20, "epoch 1's output")
        assert (tmp_path / "fired").exists()  # held at the point: no commit log for epoch 1
        assert group_offsets(bootstrap, group, topic) == {0: 5, 1: 5}  # epoch 0's end only
        hold.unlink()
        wait_until(lambda: group_offsets(bootstrap, group, topic) == {0: 15, 1: 15},
                   "the group at the log end")
        assert_exactly(out, range(30))
        assert query.exception() is None
    finally:
        hold.unlink(missing_ok=True)
        query.stop()


@pytest.mark.slow  # a driver process of its own (~1 min); the default lane names the job in
# the shared session (test_lag_tool_shows_...) and checks JobFile.session_conf below
def test_an_exactly_run_jobs_group_is_named_after_its_job_file_and_reaches_lag_zero(
        broker, topic, tmp_path):
    bootstrap = broker.bootstrap
    produce(bootstrap, topic, range(40))
    ck = tmp_path / "ck"
    run = SupervisedRun(Path(__file__).with_name("lag_job.py"), ck,
                        {"LAG_BOOTSTRAP": bootstrap, "LAG_TOPIC": topic,
                         "LAG_OUT": str(tmp_path / "out")}, log=tmp_path / "run.log")
    try:
        run.wait_for(lambda: len(rows(tmp_path / "out")) == 40, "every record", timeout=240)
        wait_for_lag_zero(bootstrap, "exactly-lag_job", topic, {0: 20, 1: 20})
        assert run.command("stop", str(ck)).returncode == 0
        assert run.wait(timeout=120) == 0
    finally:
        run.close()
    assert_exactly(tmp_path / "out", range(40))


# -- in-process: the reader's own calls -----------------------------------------------------
def reader(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    return KafkaStreamReader({opt.KAFKA_BOOTSTRAP: bootstrap, opt.SUBSCRIBE: topic, **extra})


def test_only_ends_of_completed_epochs_reach_the_group_and_never_an_older_one(broker, topic):
    bootstrap = broker.bootstrap
    produce(bootstrap, topic, range(20))
    r = reader(bootstrap, topic, maxOffsetsPerTrigger="8")
    group = f"exactly-{topic}"  # the documented default without a job: exactly-<topics>
    try:
        initial = r.initialOffset()
        end0 = r.latestOffset(initial, r.getDefaultReadLimit())  # epoch 0 is planned
        assert group_offsets(bootstrap, group, topic) == {}  # the initial offsets: no epoch
        end1 = r.latestOffset(end0, r.getDefaultReadLimit())  # epoch 0 is complete
        assert group_offsets(bootstrap, group, topic) == {int(p): o
                                                          for p, o in end0[topic].items()}
        r.commit(end0)  # Spark's commit(end), one epoch late: the same offsets, no change
        r.latestOffset(end1, r.getDefaultReadLimit())
        r.commit(end0)  # older than what the group holds: never goes back
        assert group_offsets(bootstrap, group, topic) == {int(p): o
                                                          for p, o in end1[topic].items()}
    finally:
        r.stop()


def test_a_refused_commit_is_logged_once_retried_and_recovery_logged(broker, topic, caplog):
    bootstrap = broker.bootstrap
    group = f"refused-{topic}"
    produce(bootstrap, topic, range(10))
    r = reader(bootstrap, topic, **{opt.KAFKA_GROUP_ID: group})
    member = live_member(bootstrap, group, topic)
    try:
        with caplog.at_level(logging.INFO, logger="exactly.connectors.kafka"):
            end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
            for _ in range(3):  # epoch 0 is complete; the drained query asks on every trigger
                assert r.latestOffset(end, ReadAllAvailable()) == end
            failed = [json.loads(rec.getMessage()) for rec in caplog.records
                      if "kafka_group_commit_failed" in rec.getMessage()]
            assert len(failed) == 1, failed  # once per cause, not once per trigger
            assert failed[0]["group"] == group
            assert "UNKNOWN_MEMBER_ID" in failed[0]["error"]
            assert group_offsets(bootstrap, group, topic) == {}
            member.close()
            r.latestOffset(end, ReadAllAvailable())
        recovered = [json.loads(rec.getMessage()) for rec in caplog.records
                     if "kafka_group_commit_recovered" in rec.getMessage()]
        assert [e["failed_commits"] for e in recovered] == [3]
        assert group_offsets(bootstrap, group, topic) == {0: 5, 1: 5}
    finally:
        member.close()
        r.stop()


def test_commits_can_be_turned_off(broker, topic):
    bootstrap = broker.bootstrap
    produce(bootstrap, topic, range(4))
    r = reader(bootstrap, topic, **{opt.KAFKA_COMMIT_GROUP_OFFSETS: "false"})
    try:
        end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        r.latestOffset(end, ReadAllAvailable())
        r.commit(end)
        assert group_offsets(bootstrap, f"exactly-{topic}", topic) == {}
    finally:
        r.stop()


# -- no server -------------------------------------------------------------------------------
def test_an_exactly_run_job_names_its_session_after_its_file(tmp_path):
    job = tmp_path / "orders_enricher.py"
    job.write_text("def build(spark):\n    raise NotImplementedError\n")
    assert load_job_file(job).session_conf()[opt.SESSION_JOB_NAME] == "orders_enricher"
    named = tmp_path / "named.py"
    named.write_text(f"SPARK_CONF = {{{opt.SESSION_JOB_NAME!r}: 'orders'}}\n"
                     "def build(spark):\n    raise NotImplementedError\n")
    assert load_job_file(named).session_conf()[opt.SESSION_JOB_NAME] == "orders"


@pytest.mark.parametrize(("options", "message"), [
    ({opt.KAFKA_COMMIT_GROUP_OFFSETS: "yes"}, "is not true or false"),
    ({opt.KAFKA_COMMIT_TIMEOUT_MS: "0"}, "must be at least 1"),
    ({opt.KAFKA_GROUP_ID: " "}, "kafka.group.id is empty"),
    ({"exactly.kafka.commitGroupOffset": "true"}, "did you mean exactly.kafka.commitGroupOffsets"),
])
def test_wrong_group_options_are_refused_naming_the_fix(options, message):
    from exactly.connectors.kafka.reader import KafkaReaderOptions
    from exactly.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        KafkaReaderOptions.from_options({opt.KAFKA_BOOTSTRAP: "127.0.0.1:1",
                                         opt.SUBSCRIBE: "t", **options})
